"""What every decoder state shares (``TranslationState``, ``LanguageModelState``): rows of
sequences growing one position at a time over per-layer key/value caches, and the checks on the
tokens a search feeds them."""
import numpy as np

from ..validation import check_token_ids


class CachedState:
    """A subclass sets ``self.caches``: one self-attention ``KVCache`` per layer."""

    @property
    def capacity(self):
        """How many positions the state can hold."""
        return self.caches[0].capacity

    @property
    def length(self):
        """Positions in the caches so far."""
        return self.caches[0].length

    @property
    def batch_size(self):
        """Rows being decoded (less those dropped by ``reorder``)."""
        return self.caches[0].batch_size

    def check_step(self, tokens, vocab_size):
        """``tokens`` as an int64 array of one id in [0, vocab_size) per row, if the state has
        room for them (checked before any cache is touched)."""
        rows = self.batch_size
        tokens = np.asarray(tokens)
        if tokens.shape != (rows,) or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens: expected {rows} integer ids (one per row), got "
                             f"{tokens.dtype} of shape {tokens.shape}")
        if rows == 0:
            raise ValueError("step: the state has no rows left (every one was dropped)")
        tokens = check_token_ids("tokens", tokens[:, None], vocab_size)[:, 0]
        if self.length >= self.capacity:
            raise ValueError(f"step: the state is full ({self.capacity} positions, its "
                             f"capacity); decode fewer tokens or give a larger capacity")
        return tokens

    def check_rows(self, index):
        """``index`` as an array of row numbers of this state (``reorder``'s argument)."""
        index = np.asarray(index)
        rows = self.batch_size
        if index.ndim != 1 or not np.issubdtype(index.dtype, np.integer) or \
                (index.size and (index.min() < 0 or index.max() >= rows)):
            raise ValueError(f"reorder: expected row numbers in [0, {rows}), got {index!r:.80}")
        return index
