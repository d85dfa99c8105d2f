"""Characters as tokens: the vocabulary of a character-level language model.

    tokenizer = CharTokenizer.from_text(text)      # every character of the text, sorted
    ids = tokenizer.encode("ROMEO:")               # int64 array, one id per character
    tokenizer.decode(ids)                          # "ROMEO:"

The characters live in a :class:`~npformer.data.vocab.Vocab`, after its four special tokens
(ids 0-3, which no character ever gets), so a checkpoint stores them as it stores any
vocabulary. A character the vocabulary lacks is an error, never a silent ``<unk>``: a model
cannot continue text it has never seen a character of.
"""
import numpy as np

from .vocab import Vocab

__all__ = ["CharTokenizer"]


class CharTokenizer:
    """Encodes text one character per token over ``vocab`` (see the module docstring)."""

    def __init__(self, vocab):
        if not isinstance(vocab, Vocab):
            raise ValueError(f"vocab: expected a Vocab, got {type(vocab).__name__}")
        chars = vocab.tokens[len(Vocab.SPECIALS):]
        for tok in chars:
            if len(tok) != 1:
                raise ValueError(f"vocab: expected single characters after the special tokens, "
                                 f"got {tok!r}")
        self.vocab = vocab
        self._ids = {c: i for i, c in enumerate(vocab.tokens) if len(c) == 1}

    @classmethod
    def from_text(cls, text):
        """The tokenizer of every distinct character of ``text``, in code-point order."""
        if not isinstance(text, str) or not text:
            raise ValueError(f"text: expected a non-empty string, got {text!r:.40}")
        return cls(Vocab(list(Vocab.SPECIALS) + sorted(set(text))))

    def __len__(self):
        return len(self.vocab)

    def encode(self, text, name="text"):
        """(len(text),) int64 ids. ``ValueError`` naming ``name`` and the characters the
        vocabulary lacks."""
        ids = self._ids
        try:
            return np.fromiter((ids[c] for c in text), dtype=np.int64, count=len(text))
        except KeyError:
            missing = sorted({c for c in text if c not in ids})
            shown = ", ".join(repr(c) for c in missing[:10]) + (" ..." if len(missing) > 10 else "")
            raise ValueError(f"{name}: {len(missing)} character(s) the model's vocabulary lacks "
                             f"({shown}); it knows {len(ids)} characters") from None

    def decode(self, ids):
        """The text of ``ids``; the special tokens (ids 0-3), which stand for no character,
        are left out (an untrained model may still draw them)."""
        n = len(Vocab.SPECIALS)
        return "".join(self.vocab.id_to_token(int(i)) for i in ids if int(i) >= n)
