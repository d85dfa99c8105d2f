"""The decoding cache: each attention layer's keys and values during incremental decoding.

``KVCache`` preallocates them and appends each step's positions in place; beam search reorders
its rows. The row movers it calls, ``take_rows`` and ``move_rows``, come from the active backend
(``ops()``): their reference is :mod:`npformer.functional.kv_cache`, their Numba twins
``kernels/kv_cache.py``.
"""
import numpy as np

from ..aligned import empty_aligned
from ..backend import ops


class KVCache:
    """Keys and values of attention, preallocated: ``k`` (B, H, T_max, d_k), ``v`` (B, H, T_max,
    d_v), filled up to ``length``. Incremental decoding appends one position per step (a
    language model's prompt: several at once), never copying what is already there. Beam search
    moves rows (``reorder``): in place when only some rows change and each takes a row that
    stays, else by gathering all rows into a second pair of buffers, which then become ``k`` and
    ``v`` (the first pair is the next such reorder's target: never a fresh array).

    A cache of the encoder memory (cross-attention) is filled once and never grows. The buffers
    come from ``npformer.aligned``'s pool, in sizes rounded up to a few classes, so the next
    batch's caches reuse the memory of this one's instead of having it mapped afresh.
    """

    def __init__(self, batch_size, n_heads, capacity, d_k, d_v, dtype):
        self.k = _cache_buffer((batch_size, n_heads, capacity, d_k), dtype)
        self.v = _cache_buffer((batch_size, n_heads, capacity, d_v), dtype)
        self.batch_size, self.length = batch_size, 0
        self._spare = None                        # (k, v) the next reorder gathers into

    @property
    def capacity(self):
        return self.k.shape[2]

    def append(self, k, v):
        """Add positions: k (B, H, t, d_k), v (B, H, t, d_v)."""
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KVCache: {end} positions exceed its capacity of {self.capacity}")
        self.k[:self.batch_size, :, self.length:end] = k
        self.v[:self.batch_size, :, self.length:end] = v
        self.length = end

    def keys(self):
        return self.k[:self.batch_size, :, :self.length]          # (B, H, length, d_k), a view

    def values(self):
        return self.v[:self.batch_size, :, :self.length]

    def repeat_rows(self, times):
        """Each row becomes ``times`` consecutive rows, in place: row i of the B rows is then
        rows i * times ... (i + 1) * times - 1 of the B * times (np.repeat along the rows)."""
        n, t = self.batch_size, self.length
        if n * times > self.k.shape[0]:
            raise ValueError(f"KVCache: {n * times} rows exceed the {self.k.shape[0]} it holds")
        for buf in (self.k, self.v):
            rows = buf[:n, :, :t].copy()                 # the rows overlap their destinations
            for j in range(times):
                buf[j:n * times:times, :, :t] = rows
        self.batch_size = n * times

    def reorder(self, index):
        """Keep rows ``index`` (B',), in that order (a row may be repeated); at most as many rows
        as the cache was made for. Where every row that changes takes a row that stays (beam
        search places each prefix's first continuation in its parent's row: see
        ``npformer.decoding.search``), only the changed rows are copied, in place; otherwise
        all rows are gathered into the spare buffers, which become ``k`` and ``v``."""
        n, t = len(index), self.length
        if n > self.k.shape[0]:
            raise ValueError(f"KVCache: {n} rows exceed the {self.k.shape[0]} it holds")
        index = np.asarray(index, dtype=np.int64)
        changed = np.flatnonzero(index != np.arange(n))                 # rows that get new ones
        src = index[changed]
        overwritten = np.zeros(max(n, self.batch_size), dtype=bool)
        overwritten[changed] = True
        if not overwritten[src].any():               # no row is read after it is overwritten
            if len(changed):
                ops().move_rows(self.k[:, :, :t], src, changed)
                ops().move_rows(self.v[:, :, :t], src, changed)
            self.batch_size = n
            return
        if self._spare is None:
            self._spare = (_cache_buffer(self.k.shape, self.k.dtype),
                           _cache_buffer(self.v.shape, self.v.dtype))
        k, v = self._spare
        ops().take_rows(self.k[:, :, :t], index, k[:n, :, :t])
        ops().take_rows(self.v[:, :, :t], index, v[:n, :, :t])
        self._spare, self.k, self.v = (self.k, self.v), k, v
        self.batch_size = n


_SIZE_CLASSES = 4                # cache buffers: sizes rounded up to 2 ** (i / 4) elements


def _cache_buffer(shape, dtype):
    """np.empty(shape, dtype) from ``npformer.aligned``'s pool, its size rounded up to the next
    of ``_SIZE_CLASSES`` classes per doubling (the pool hands a buffer out again for a request
    at most a quarter smaller: caches of similar sizes then share one class)."""
    n = int(np.prod(shape, dtype=np.int64))
    size = 1 if n <= 1 else int(np.ceil(2.0 ** (np.ceil(_SIZE_CLASSES * np.log2(n))
                                                 / _SIZE_CLASSES)))
    return empty_aligned(max(size, n), dtype)[:n].reshape(shape)
