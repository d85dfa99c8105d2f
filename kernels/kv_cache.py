"""The decoding cache's row movers (``take_rows``, ``move_rows``), as
:mod:`npformer.functional.kv_cache`, each in one parallel pass over the rows it writes.

A cache's rows are views ``buf[:, :, :t]`` of a buffer (B, H, T_max, d): each row holds, per
head, one run of t * d consecutive elements (the first t positions). The kernels copy those
runs through a one-dimensional view of the memory the rows span, so that every run is a
contiguous loop LLVM vectorises, where indexing the strided 4-D view element by element copies
at a fraction of the memory's speed. Views of any other layout go to the NumPy reference.
"""
import numpy as np
from numba import njit, prange
from numpy.lib.stride_tricks import as_strided

from npformer.functional import kv_cache as _reference

from ._jit import kernel


def _runs(x):
    """(flat, row, head) for a 4-D x (B, H, t, d) whose every x[b, h] is one run of t * d
    consecutive elements: ``flat`` the 1-D view of the memory from x's first element to its
    last, ``row`` and ``head`` the strides of x's first two axes in elements (x[b, h] starts at
    flat[b * row + h * head]; the runs one after the other, apart); None for any other layout,
    or an empty x."""
    n_b, n_h, t, d = x.shape
    size = x.itemsize
    if x.size == 0 or (d > 1 and x.strides[3] != size) or (t > 1 and x.strides[2] != d * size):
        return None
    row = x.strides[0] // size if n_b > 1 else 0
    head = x.strides[1] // size if n_h > 1 else 0
    if (n_b > 1 and x.strides[0] % size) or (n_h > 1 and x.strides[1] % size) or \
            (n_h > 1 and head < t * d) or (n_b > 1 and row < (n_h - 1) * head + t * d):
        return None                              # (runs that overlap, or go backwards)
    span = (n_b - 1) * row + (n_h - 1) * head + t * d              # x's first to last element
    return as_strided(x, shape=(span,), strides=(size,)), row, head


@njit(inline="always", cache=True)
def _copy(src, dst):
    """dst[c] = src[c] over two 1-D views of one length (runs that never overlap). Indexed from
    0 by the loop, never by an offset added to it: Numba then knows no index is negative and
    the loop vectorises (``x[b + c]`` on the flat view stays element by element)."""
    for c in range(len(dst)):
        dst[c] = src[c]


def _taken(x, x_row, x_head, out, out_row, out_head, n_h, n, index):
    """_take_runs's work: the elements it writes."""
    return len(index) * n_h * n


@kernel(parallel=True, work=_taken)
def _take_runs(x, x_row, x_head, out, out_row, out_head, n_h, n, index):
    """Row r of out = row index[r] of x: n_h runs of n elements each (flat views, ``_runs``)."""
    for r in prange(len(index)):
        src, dst = index[r] * x_row, r * out_row
        for h in range(n_h):
            a, b = src + h * x_head, dst + h * out_head
            _copy(x[a:a + n], out[b:b + n])


def take_rows(x, index, out):
    """out[r] = x[index[r]], as the NumPy reference, in one parallel pass (NumPy's fancy index
    first copies the rows into a fresh array). ``out`` must not overlap ``x``. Returns out."""
    if x.ndim != 4 or out.ndim != 4 or out.shape[1:] != x.shape[1:] or len(index) != len(out):
        raise ValueError(f"take_rows: expected 4-D x and out of equal rows and index of one "
                         f"entry per row of out, got {x.shape}, {out.shape}, {len(index)}")
    if len(index) and (index.min() < 0 or index.max() >= len(x)):
        raise ValueError(f"take_rows: index: expected rows in [0, {len(x)}), got "
                         f"{index.min()}..{index.max()}")
    src, dst = _runs(x), _runs(out)
    if src is None or dst is None or x.dtype != out.dtype:
        return _reference.take_rows(x, index, out)
    _, n_h, t, d = x.shape
    _take_runs(*src, *dst, n_h, t * d, np.ascontiguousarray(index, dtype=np.int64))
    return out


def _moved(x, row, head, n_h, n, src, dst):
    """_move_runs's work: the elements it writes."""
    return len(dst) * n_h * n


@kernel(parallel=True, work=_moved)
def _move_runs(x, row, head, n_h, n, src, dst):
    """Row dst[i] = row src[i], in place: n_h runs of n elements each (a flat view, ``_runs``)."""
    for i in prange(len(dst)):
        s, r = src[i] * row, dst[i] * row
        for h in range(n_h):
            a, b = s + h * head, r + h * head
            _copy(x[a:a + n], x[b:b + n])


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
    runs = _runs(x)
    if not len(src) or runs is None:
        return _reference.move_rows(x, src, dst) if len(src) else x
    _, n_h, t, d = x.shape
    _move_runs(*runs, n_h, t * d, src, dst)
    return x
