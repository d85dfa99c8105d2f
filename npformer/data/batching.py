"""Padding, teacher forcing and length-bucketed batch sampling.

A pair ``(x, y)`` of token-id lists (without ``<bos>``/``<eos>``) becomes three padded rows::

    src     = x1 ... xm                  (then <pad>)
    tgt_in  = <bos> y1 ... yn            (decoder input,  then <pad>)
    tgt_out = y1 ... yn <eos>            (what the decoder must predict, then <pad>)

``BatchSampler`` decides which pairs go together: it shuffles the data, sorts it by length
inside buckets of ``bucket_size`` examples (so a batch wastes little padding), cuts batches by
``batch_size`` or a ``max_tokens`` budget, and shuffles the batch order. Everything is seeded
per ``(seed, epoch)`` and the position inside an epoch is part of ``state_dict``, so a resumed
run sees exactly the batches it would have seen.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

__all__ = ["Batch", "pad_sequences", "make_batch", "BatchSampler", "iterate_batches"]


@dataclass
class Batch:
    src: np.ndarray       # (B, S) int64, padded with pad_id
    tgt_in: np.ndarray    # (B, T) int64: <bos> y1 ... yn, padded
    tgt_out: np.ndarray   # (B, T) int64: y1 ... yn <eos>, padded
    n_src_tokens: int     # real (non-pad) source tokens
    n_tgt_tokens: int     # real (non-pad) tokens of tgt_out, the ones the loss counts
    indices: np.ndarray   # (B,) positions of these pairs in the dataset
    pad_id: int = field(default=0)

    def __len__(self) -> int:
        return self.src.shape[0]


def _check_int(value: object, name: str, minimum: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _as_id_lists(seqs: object, name: str) -> list[np.ndarray]:
    if isinstance(seqs, (str, bytes)) or not isinstance(seqs, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be a list of token-id sequences, got {type(seqs).__name__}")
    if len(seqs) == 0:
        raise ValueError(f"{name} must hold at least one sequence, got an empty list")
    out = []
    for i, s in enumerate(seqs):
        a = np.asarray(s)
        if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
            raise ValueError(f"{name}[{i}] must be a 1-D sequence of integer ids, got {s!r}")
        out.append(a.astype(np.int64, copy=False))
    return out


def pad_sequences(seqs: list[list[int]], pad_id: int, length: int | None = None) -> np.ndarray:
    """Stack sequences into an ``(N, L)`` int64 array, right-padded with ``pad_id``.

    ``L`` is ``length`` if given (it must fit the longest sequence), else the longest length.
    """
    arrays = _as_id_lists(seqs, "seqs")
    pad_id = _check_int(pad_id, "pad_id")
    lengths = _lengths(arrays)
    longest = int(lengths.max())
    if length is None:
        length = longest
    else:
        length = _check_int(length, "length", 0)
        if length < longest:
            raise ValueError(f"length={length} is shorter than the longest sequence ({longest} tokens)")
    return _padded(np.concatenate(arrays), lengths, pad_id, length)


def _lengths(arrays: list[np.ndarray]) -> np.ndarray:
    return np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))


def _padded(flat: np.ndarray, lengths: np.ndarray, pad_id: int, width: int,
            start: int = 0) -> np.ndarray:
    """(N, width) int64 of pad_id, row r holding the r-th run of ``lengths[r]`` ids of ``flat``
    (the sequences one after the other) from column ``start``: one vectorised write per batch
    instead of one per row."""
    out = np.full((len(lengths), width), pad_id, dtype=np.int64)
    cols = np.arange(width - start)
    out[:, start:][cols < lengths[:, None]] = flat          # row-major: the sequences' order
    return out


def make_batch(src_seqs: list[list[int]], tgt_seqs: list[list[int]], pad_id: int, bos_id: int,
               eos_id: int, indices: Sequence[int] | np.ndarray | None = None) -> Batch:
    """Pad a list of pairs and build the teacher-forcing shift. Sequences come WITHOUT bos/eos."""
    src = _as_id_lists(src_seqs, "src_seqs")
    tgt = _as_id_lists(tgt_seqs, "tgt_seqs")
    if len(src) != len(tgt):
        raise ValueError(f"src_seqs and tgt_seqs must have the same length, got {len(src)} and {len(tgt)}")
    pad_id, bos_id, eos_id = (_check_int(v, n) for v, n in
                              ((pad_id, "pad_id"), (bos_id, "bos_id"), (eos_id, "eos_id")))
    specials = np.array([pad_id, bos_id, eos_id])
    src_len, tgt_len = _lengths(src), _lengths(tgt)
    src_flat, tgt_flat = np.concatenate(src), np.concatenate(tgt)
    for name, seqs, lengths, flat in (("src_seqs", src, src_len, src_flat),
                                      ("tgt_seqs", tgt, tgt_len, tgt_flat)):
        special = np.isin(flat, specials)
        if special.any():                    # the sequence that holds the first one
            i = int(np.searchsorted(np.cumsum(lengths), special.argmax(), side="right"))
            raise ValueError(f"{name}[{i}] contains a pad/bos/eos id ({specials.tolist()}); "
                             f"pass sequences without special tokens, got {seqs[i].tolist()}")
    if (src_len == 0).any():
        i = int((src_len == 0).argmax())
        raise ValueError(f"src_seqs[{i}] is empty; a source needs at least one token "
                         f"(an all-padding row has nothing to attend to)")
    if indices is None:
        indices = np.arange(len(src), dtype=np.int64)
    else:
        indices = np.asarray(indices)
        if indices.shape != (len(src),) or (indices.size and not np.issubdtype(indices.dtype, np.integer)):
            raise ValueError(f"indices must be {len(src)} integers (one per pair), got shape "
                             f"{indices.shape} and dtype {indices.dtype}")
        indices = indices.astype(np.int64)

    width = int(tgt_len.max()) + 1                   # the longest target and its <bos>/<eos>
    src_arr = _padded(src_flat, src_len, pad_id, int(src_len.max()))            # (B, S)
    tgt_in = _padded(tgt_flat, tgt_len, pad_id, width, start=1)                  # (B, T)
    tgt_in[:, 0] = bos_id                                                        # <bos> y1 ... yn
    tgt_out = _padded(tgt_flat, tgt_len, pad_id, width)                          # y1 ... yn <eos>
    tgt_out[np.arange(len(tgt)), tgt_len] = eos_id
    return Batch(src=src_arr, tgt_in=tgt_in, tgt_out=tgt_out,
                 n_src_tokens=int(src_len.sum()), n_tgt_tokens=int(tgt_len.sum()) + len(tgt),
                 indices=indices, pad_id=pad_id)


def _as_lengths(lengths: object, name: str) -> np.ndarray:
    a = np.asarray(lengths)
    if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer) or (a < 0).any():
        raise ValueError(f"{name} must be a non-empty 1-D sequence of non-negative integers, "
                         f"got {lengths!r:.80}")
    return a.astype(np.int64)


class BatchSampler:
    """Length-bucketed, seeded batch sampler; yields arrays of dataset indices.

    Give exactly one of ``batch_size`` (examples per batch) and ``max_tokens`` (a budget of padded
    tokens per batch: rows × (longest src + longest tgt)). A single example longer than
    ``max_tokens`` still gets a batch of its own. With ``shuffle=False`` the data is taken in
    order (still sorted by length inside each bucket) and batches are not shuffled.

    Each epoch shuffles the examples, sorts each bucket of ``bucket_size`` consecutive ones by
    length (source, then target), cuts the batches and shuffles their order. Small buckets give
    batches that differ from epoch to epoch but hold more padding; ``bucket_size=None`` sorts the
    whole set at once, as fairseq does (the least padding: the same batches every epoch, in a new
    order, with ties between equal lengths broken anew).

    Lengths are counted as given; ``BatchSampler.from_pairs`` counts them as ``make_batch`` lays
    them out (``len(tgt) + 1`` for the shifted target), so ``max_tokens`` bounds the real arrays.
    """

    def __init__(self, src_lengths: Sequence[int], tgt_lengths: Sequence[int],
                 batch_size: int | None = None, max_tokens: int | None = None,
                 shuffle: bool = True, seed: int = 0, bucket_size: int | None = 1000):
        self.src_lengths = _as_lengths(src_lengths, "src_lengths")
        self.tgt_lengths = _as_lengths(tgt_lengths, "tgt_lengths")
        if len(self.src_lengths) != len(self.tgt_lengths):
            raise ValueError(f"src_lengths and tgt_lengths must have the same length, got "
                             f"{len(self.src_lengths)} and {len(self.tgt_lengths)}")
        if (batch_size is None) == (max_tokens is None):
            raise ValueError(f"give exactly one of batch_size and max_tokens, got "
                             f"batch_size={batch_size!r}, max_tokens={max_tokens!r}")
        self.batch_size = None if batch_size is None else _check_int(batch_size, "batch_size", 1)
        self.max_tokens = None if max_tokens is None else _check_int(max_tokens, "max_tokens", 1)
        if not isinstance(shuffle, (bool, np.bool_)):
            raise ValueError(f"shuffle must be a bool, got {shuffle!r}")
        self.shuffle = bool(shuffle)
        self.seed = _check_int(seed, "seed", 0)
        if bucket_size is not None:      # None: one bucket, the whole set
            bucket_size = _check_int(bucket_size, "bucket_size", 1)
        self.bucket_size = bucket_size
        self._epoch = 0
        self._offset = 0          # batch to start from on the next __iter__ (set by load_state_dict)
        self._done = 0            # batches handed out in the current epoch
        self._cache: tuple[int, list[np.ndarray]] | None = None

    @classmethod
    def from_pairs(cls, pairs_ids: Sequence[tuple[Sequence[int], Sequence[int]]], **kwargs) -> "BatchSampler":
        """Sampler for ``(src_ids, tgt_ids)`` pairs as ``make_batch`` will pad them."""
        if len(pairs_ids) == 0:
            raise ValueError("pairs_ids must hold at least one pair, got an empty list")
        return cls([len(s) for s, _ in pairs_ids], [len(t) + 1 for _, t in pairs_ids], **kwargs)

    @property
    def num_examples(self) -> int:
        return len(self.src_lengths)

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle to use. Moving to another epoch starts at its first
        batch; setting the current epoch again keeps a position restored by ``load_state_dict``."""
        epoch = _check_int(epoch, "epoch", 0)
        if epoch != self._epoch:
            self._epoch, self._offset, self._done = epoch, 0, 0

    # ---- batch construction ----------------------------------------------------------------
    def _batches(self) -> list[np.ndarray]:
        if self._cache is not None and self._cache[0] == self._epoch:
            return self._cache[1]
        n = self.num_examples
        rng = np.random.default_rng([self.seed, self._epoch])
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        # Sort by length inside each bucket of bucket_size consecutive (shuffled) examples.
        bucket = self.bucket_size or n
        sorted_parts = []
        for start in range(0, n, bucket):
            part = order[start:start + bucket]
            key = np.lexsort((self.tgt_lengths[part], self.src_lengths[part]))   # by src, then tgt
            sorted_parts.append(part[key])
        order = np.concatenate(sorted_parts)

        if self.batch_size is not None:
            batches = [order[i:i + self.batch_size] for i in range(0, n, self.batch_size)]
        else:
            batches, start, max_s, max_t = [], 0, 0, 0
            for pos, idx in enumerate(order):
                s, t = max(max_s, self.src_lengths[idx]), max(max_t, self.tgt_lengths[idx])
                if pos > start and (pos - start + 1) * (s + t) > self.max_tokens:
                    batches.append(order[start:pos])
                    start, s, t = pos, self.src_lengths[idx], self.tgt_lengths[idx]
                max_s, max_t = s, t
            batches.append(order[start:])
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        batches = [b.astype(np.int64) for b in batches]
        self._cache = (self._epoch, batches)
        return batches

    def __len__(self) -> int:
        """Number of batches in the current epoch (with ``max_tokens`` it can vary by epoch)."""
        return len(self._batches())

    def __iter__(self) -> Iterator[np.ndarray]:
        batches = self._batches()
        start, self._offset = self._offset, 0
        self._done = start
        for b in batches[start:]:
            self._done += 1
            yield b.copy()

    # ---- checkpointing ---------------------------------------------------------------------
    def _fingerprint(self) -> int:
        return zlib.crc32(self.src_lengths.tobytes() + self.tgt_lengths.tobytes())

    def state_dict(self) -> dict:
        """Everything needed to continue this epoch bit for bit (JSON-serialisable)."""
        return {"epoch": self._epoch, "batches_done": self._done, "seed": self.seed,
                "shuffle": self.shuffle, "batch_size": self.batch_size,
                "max_tokens": self.max_tokens, "bucket_size": self.bucket_size,
                "num_examples": self.num_examples, "lengths_crc32": self._fingerprint()}

    def load_state_dict(self, d: dict) -> None:
        """Restore a position; the next ``__iter__`` continues after the last batch handed out."""
        if not isinstance(d, dict):
            raise ValueError(f"state must be a dict from BatchSampler.state_dict, got {type(d).__name__}")
        missing = {"epoch", "batches_done"} - set(d)
        if missing:
            raise ValueError(f"state is missing the keys {sorted(missing)}")
        mine = self.state_dict()
        for key in ("seed", "shuffle", "batch_size", "max_tokens", "bucket_size",
                    "num_examples", "lengths_crc32"):
            if key in d and d[key] != mine[key]:
                raise ValueError(f"state was saved with {key}={d[key]!r}, but this sampler has "
                                 f"{key}={mine[key]!r}")
        epoch = _check_int(d["epoch"], "state['epoch']", 0)
        done = _check_int(d["batches_done"], "state['batches_done']", 0)
        self._epoch, self._offset, self._done = epoch, 0, 0
        n_batches = len(self._batches())
        if done > n_batches:
            raise ValueError(f"state['batches_done']={done} exceeds the {n_batches} batches of "
                             f"epoch {epoch}")
        self._offset = self._done = done


def iterate_batches(pairs_ids: Sequence[tuple[Sequence[int], Sequence[int]]], sampler: BatchSampler,
                    pad_id: int, bos_id: int, eos_id: int) -> Iterator[Batch]:
    """Yield a padded ``Batch`` for every index array the sampler produces."""
    if not isinstance(sampler, BatchSampler):
        raise ValueError(f"sampler must be a BatchSampler, got {type(sampler).__name__}")
    if len(pairs_ids) != sampler.num_examples:
        raise ValueError(f"pairs_ids has {len(pairs_ids)} pairs but the sampler was built for "
                         f"{sampler.num_examples}")
    for idx in sampler:
        yield make_batch([pairs_ids[i][0] for i in idx], [pairs_ids[i][1] for i in idx],
                         pad_id, bos_id, eos_id, indices=idx)
