"""The decoding cache's row movers (``take_rows``, ``move_rows``), as
:mod:`npformer.functional.kv_cache`, each in one pass over the rows it writes, shared by the
runtime's worker threads.

A cache's rows are views ``buf[:, :, :t]`` of a buffer (B, H, T_max, d): each row holds, per
head, one run of t * d consecutive elements (the first t positions). The kernels copy those
runs through a one-dimensional view of the memory the rows span, so that every run is a
contiguous loop LLVM vectorises, where indexing the strided 4-D view element by element copies
at a fraction of the memory's speed. Views of any other layout go to the NumPy reference.

Who copies: a beam search moves a few hundred rows of each layer's keys and values at every
step, a copy of some tens of microseconds. Handing parts to other threads costs about as much
again (starting Numba's parallel pool, or waking the runtime's workers), so these kernels are
serial over a range of rows, and only a copy of more than ``PART_ELEMENTS`` elements is cut
into parts of at least that many for the runtime's workers (``runtime.run_parts``). A copy is
a copy on any thread, so the parts change no bit.
"""
import numpy as np
from numba import njit
from numpy.lib.stride_tricks import as_strided

from npformer import runtime
from npformer.functional import kv_cache as _reference

from ._jit import kernel

PART_ELEMENTS = 1 << 21          # elements copied per part, at least: a part handed to another
                                 # thread then costs a small share of its copy


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


@kernel
def _take_runs(x, x_row, x_head, out, out_row, out_head, n_h, n, index, r0, r1):
    """Rows r0 .. r1 - 1 of out = rows index[r] of x: n_h runs of n elements each (flat views,
    ``_runs``)."""
    for r in range(r0, r1):
        src, dst = index[r] * x_row, r * out_row
        for h in range(n_h):
            a, b = src + h * x_head, dst + h * out_head
            _copy(x[a:a + n], out[b:b + n])


def _in_parts(copy, rows, per_row):
    """``copy(i0, i1)`` over rows 0 .. rows - 1 of a mover, ``per_row`` elements each, in
    consecutive ranges of at least ``PART_ELEMENTS`` elements on the runtime's workers (one
    range, on this thread, where the rows hold fewer)."""
    count = max(1, min(runtime.workers(), rows * per_row // PART_ELEMENTS))
    bounds = [rows * i // count for i in range(count + 1)]
    runtime.run_parts(lambda i: copy(bounds[i], bounds[i + 1]), range(count))


def take_rows(x, index, out):
    """out[r] = x[index[r]], as the NumPy reference, in one pass shared by the workers (NumPy's
    fancy index first copies the rows into a fresh array). ``out`` must not overlap ``x``. Returns out."""
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
    index = np.ascontiguousarray(index, dtype=np.int64)
    _in_parts(lambda r0, r1: _take_runs(*src, *dst, n_h, t * d, index, r0, r1), len(index),
              n_h * t * d)
    return out


@kernel
def _move_runs(x, row, head, n_h, n, src, dst, i0, i1):
    """Rows dst[i] = rows src[i] for i in i0 .. i1 - 1, in place: n_h runs of n elements each (a
    flat view, ``_runs``)."""
    for i in range(i0, i1):
        s, r = src[i] * row, dst[i] * row
        for h in range(n_h):
            a, b = s + h * head, r + h * head
            _copy(x[a:a + n], x[b:b + n])


def move_rows(x, src, dst):
    """x[dst[i]] = x[src[i]] in place, as the NumPy reference, in one pass shared by the
    workers. No row of ``dst`` may be in ``src`` (rows are read and written by different
    threads). Returns x."""
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
    _in_parts(lambda i0, i1: _move_runs(*runs, n_h, t * d, src, dst, i0, i1), len(src),
              n_h * t * d)
    return x
