"""The decoding cache's row movers (``take_rows``, ``move_rows``), as
:mod:`npformer.functional.kv_cache`, each in one parallel pass over the rows it writes.
"""
import numpy as np
from numba import prange

from ._jit import kernel


@kernel(parallel=True, work=2)
def _take_rows(x, index, out):
    """out[r] = x[index[r]] for 4-D x, out (rows of a cache; views, strided between rows)."""
    n, n_h, t, d = out.shape
    for r in prange(n):
        src = index[r]
        for h in range(n_h):
            for j in range(t):
                for c in range(d):
                    out[r, h, j, c] = x[src, h, j, c]


def take_rows(x, index, out):
    """out[r] = x[index[r]], as the NumPy reference, in one parallel pass (NumPy's fancy index
    first copies the rows into a fresh array). ``out`` must not overlap ``x``. Returns out."""
    if x.ndim != 4 or out.ndim != 4 or out.shape[1:] != x.shape[1:] or len(index) != len(out):
        raise ValueError(f"take_rows: expected 4-D x and out of equal rows and index of one "
                         f"entry per row of out, got {x.shape}, {out.shape}, {len(index)}")
    if len(index) and (index.min() < 0 or index.max() >= len(x)):
        raise ValueError(f"take_rows: index: expected rows in [0, {len(x)}), got "
                         f"{index.min()}..{index.max()}")
    if out.size:
        _take_rows(x, np.ascontiguousarray(index, dtype=np.int64), out)
    return out


def _moved(x, src, dst):
    """_move_rows's work: the elements of the rows it writes."""
    return len(dst) * (x.size // len(x))


@kernel(parallel=True, work=_moved)
def _move_rows(x, src, dst):
    """x[dst[i]] = x[src[i]] for 4-D x (a cache's rows; a view, strided between rows)."""
    _, n_h, t, d = x.shape
    for i in prange(len(dst)):
        s, r = src[i], dst[i]
        for h in range(n_h):
            for j in range(t):
                for c in range(d):
                    x[r, h, j, c] = x[s, h, j, c]


def move_rows(x, src, dst):
    """x[dst[i]] = x[src[i]] in place, as the NumPy reference, in one parallel pass. No row of
    ``dst`` may be in ``src`` (rows are read and written by different threads). Returns x."""
    src = np.ascontiguousarray(src, dtype=np.int64)
    dst = np.ascontiguousarray(dst, dtype=np.int64)
    if x.ndim != 4 or src.shape != dst.shape or src.ndim != 1:
        raise ValueError(f"move_rows: expected 4-D x and 1-D src and dst of equal length, got "
                         f"{x.shape}, {src.shape}, {dst.shape}")
    if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= len(x)):
        raise ValueError(f"move_rows: src and dst: expected rows in [0, {len(x)}), got "
                         f"{src.min()}..{src.max()} and {dst.min()}..{dst.max()}")
    written = np.zeros(len(x), dtype=bool)
    written[dst] = True
    if written[src].any():
        raise ValueError("move_rows: a row of dst is also in src (it would be read after it "
                         "is written)")
    if len(src) and x.size:
        _move_rows(x, src, dst)
    return x
