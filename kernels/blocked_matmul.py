"""Matrix products register-blocked in explicit vectors: ``out = a @ b``, for attention's many
small per-head products and for the large products of the linear layers.

BLAS pays a per-matrix cost (packing, dispatch) that is comparable to the arithmetic of
attention's (16-64) x (16-64) x 32 products, and a plain Numba loop is held back by the latency
of its multiply-adds. This kernel computes a block of 4 rows x 32 columns of ``out`` in eight
vector accumulators (``_simd``: 16 lanes each), walking the shared dimension once:

    for s in range(K):                 # b[s, c:c+32] as two vectors, a[r:r+4, s] as 4 scalars
        acc[i][j] += a[r + i, s] * b[s, c + 16 j : c + 16 (j + 1)]    (i < 4, j < 2)

Eight independent accumulators keep both FMA pipes busy (one chain of FMAs waits 4 cycles for
each result). Around the block, the loops follow GotoBLAS's order, without its packing: a tile
of rows of ``a`` (about ``TILE_BYTES``, kept in L2) meets every 32-column panel of ``b`` in
turn (K x 32, kept in L1 while the tile's row blocks pass it). Where a panel would be too deep
for L1 (K > ``K_CHUNK``, as in a weight gradient dW = dY^T X, whose K is the number of
tokens), the product is summed over chunks of K: the first chunk stores its block, the others
add theirs to what is stored.

Where it beats BLAS (an AVX-512 CPU whose BLAS runs AVX2 kernels; attention's small
products) is for the dispatcher's rules and BENCHMARKS.md to say.

Edges without remainder loops: the last row block of a tile and the last column panel are moved
back to end at the last row / column, so they overlap the block before them (a tile of fewer
than 4 rows repeats its last row). Overlapped columns are computed again and stored again with
the same value; overlapped rows are computed again but stored only by the first block that
owns them. Hence ``N >= 32``, and chunking over K only where N is a multiple of 32 (an
overlapped column would be added twice).

Operands: ``a`` any strides (its entries are read one by one, so ``a`` may be a transposed
view); ``b`` and ``out`` with unit stride along their last axis (rows are read and written as
vectors), best 64-byte aligned (``npformer.aligned.empty_aligned``). The wrapper
:func:`blocked_matmul` checks this; the matmul dispatcher offers the kernel as
``"numba-blocked"``. Serial and ``nogil``: attention's parts run it on several Python threads
at once, and the dispatcher gives each worker thread a part of a large product's rows (every row
is computed the same way whichever part holds it).
"""
import numpy as np
from numba import njit

from npformer.aligned import empty_aligned

from ._jit import FASTMATH, kernel
from ._product_operands import check_operands
from ._simd import LANES, vadd, vfma, vload, vsplat, vstore

BLOCK_ROWS = 4
BLOCK_COLS = 2 * LANES           # two vectors per row
TILE_BYTES = 1 << 16             # rows of a per tile: about this many bytes of a (L2-resident)
K_CHUNK = 256                    # deepest b panel: 256 x 32 float32 = 32 KB, within L1 (64 KB
                                 # for float64, within L2)


@njit(inline="always", fastmath=FASTMATH, cache=True)
def _finish_row(out, at, acc0, acc1, accumulate, owned):
    """Store one row of a block (two vectors at element ``at`` of out), added to what out holds
    there if ``accumulate``; only if this block ``owned`` the row (see the module docstring)."""
    if owned:
        if accumulate:
            acc0, acc1 = vadd(acc0, vload(out, at)), vadd(acc1, vload(out, at + LANES))
        vstore(out, at, acc0)
        vstore(out, at + LANES, acc1)


@kernel
def _blocked_gemm(a, b, out, zero, tile_rows, accumulate):
    """out[g, h] (+)= a[g, h] @ b[g, h]; a (G, H, M, K), b (G, H, K, N), out (G, H, M, N).

    b and out: unit stride along the last axis, N >= BLOCK_COLS (a multiple of it if
    ``accumulate``), out overlapping neither a nor b. ``zero`` is 0 in the dtype of the arrays.
    Loop order, outermost first: head; a tile of ``tile_rows`` rows of a; a panel of 32 columns
    of b; a block of 4 rows of the tile; K."""
    n_g, n_h, m, kk = a.shape
    n = b.shape[3]
    bs0, bs1, bs2 = b.strides[0] // b.itemsize, b.strides[1] // b.itemsize, b.strides[2] // b.itemsize
    os0, os1, os2 = (out.strides[0] // out.itemsize, out.strides[1] // out.itemsize,
                     out.strides[2] // out.itemsize)
    for g in range(n_g):
        for h in range(n_h):
            b_head, out_head = g * bs0 + h * bs1, g * os0 + h * os1
            for tile in range(0, m, tile_rows):
                tile_end = min(tile + tile_rows, m)
                for col in range(0, n, BLOCK_COLS):
                    c = min(col, n - BLOCK_COLS)               # columns c .. c + 31
                    for row in range(tile, tile_end, BLOCK_ROWS):
                        r0 = max(min(row, tile_end - BLOCK_ROWS), tile)     # rows r0 .. r3
                        r1 = min(r0 + 1, tile_end - 1)
                        r2, r3 = min(r0 + 2, tile_end - 1), min(r0 + 3, tile_end - 1)
                        acc00 = acc01 = acc10 = acc11 = vsplat(zero)
                        acc20 = acc21 = acc30 = acc31 = vsplat(zero)
                        for s in range(kk):
                            b_row = b_head + s * bs2 + c
                            b0, b1 = vload(b, b_row), vload(b, b_row + LANES)   # b[s, c:c+32]
                            x = vsplat(a[g, h, r0, s])
                            acc00, acc01 = vfma(x, b0, acc00), vfma(x, b1, acc01)
                            x = vsplat(a[g, h, r1, s])
                            acc10, acc11 = vfma(x, b0, acc10), vfma(x, b1, acc11)
                            x = vsplat(a[g, h, r2, s])
                            acc20, acc21 = vfma(x, b0, acc20), vfma(x, b1, acc21)
                            x = vsplat(a[g, h, r3, s])
                            acc30, acc31 = vfma(x, b0, acc30), vfma(x, b1, acc31)
                        at = out_head + c                     # rows before `row` are stored
                        _finish_row(out, at + r0 * os2, acc00, acc01, accumulate, r0 >= row)
                        _finish_row(out, at + r1 * os2, acc10, acc11, accumulate,
                                    r1 >= row and r1 > r0)
                        _finish_row(out, at + r2 * os2, acc20, acc21, accumulate,
                                    r2 >= row and r2 > r1)
                        _finish_row(out, at + r3 * os2, acc30, acc31, accumulate,
                                    r3 >= row and r3 > r2)


def _rows_unit_stride(x):
    return x.size == 0 or x.shape[-1] == 1 or x.strides[-1] == x.itemsize


def _check(a, b, out):
    """Raise ValueError naming the argument unless :func:`_blocked_gemm` can compute a @ b into
    out: the product's own conditions (``check_operands``), then the kernel's."""
    check_operands(a, b, out, "blocked_matmul")
    if a.ndim > 4:
        raise ValueError(f"blocked_matmul: expected at most two batch axes, got a {a.shape}")
    if b.shape[-1] < BLOCK_COLS:
        raise ValueError(f"blocked_matmul: b: expected N >= {BLOCK_COLS} columns, got shape "
                         f"{b.shape}")
    if not _rows_unit_stride(b):
        raise ValueError(f"blocked_matmul: b: expected rows with unit stride, got strides "
                         f"{b.strides}")
    if out is not None and not _rows_unit_stride(out):
        raise ValueError(f"blocked_matmul: out: expected rows with unit stride, got strides "
                         f"{out.strides}")
    if out is not None and (np.may_share_memory(out, a) or np.may_share_memory(out, b)):
        raise ValueError("blocked_matmul: out: expected an array overlapping neither a nor b")


def applies(a, b, out=None):
    """Whether :func:`blocked_matmul` can compute a @ b into out (see the module docstring)."""
    try:
        _check(a, b, out)
    except ValueError:
        return False
    return True


def _as_4d(x):
    return x.reshape((1,) * (4 - x.ndim) + x.shape)      # a view: only leading axes of size 1


def _tile_rows(k, itemsize):
    return max(BLOCK_ROWS, TILE_BYTES // (k * itemsize) // BLOCK_ROWS * BLOCK_ROWS)


def run_blocked(a, b, out, tile_rows=None, k_chunk=K_CHUNK):
    """:func:`blocked_matmul` without its checks, for callers that made them (the dispatcher)."""
    kk = a.shape[-1]
    if out.size == 0:
        return out
    if kk == 0:
        out.fill(0)
        return out
    if b.shape[-1] % BLOCK_COLS:
        k_chunk = kk                                       # overlapping panels: no chunks
    a4, b4, out4, zero = _as_4d(a), _as_4d(b), _as_4d(out), a.dtype.type(0)
    for k0 in range(0, kk, k_chunk):
        k1 = min(k0 + k_chunk, kk)
        rows = tile_rows or _tile_rows(k1 - k0, a.itemsize)
        _blocked_gemm(a4[..., k0:k1], b4[..., k0:k1, :], out4, zero, rows, k0 > 0)
    return out


def blocked_matmul(a, b, out=None, tile_rows=None, k_chunk=K_CHUNK):
    """a @ b by :func:`_blocked_gemm`. Shape: a (..., M, K), b (..., K, N) with the same
    leading shape (at most two leading axes) -> (..., M, N), written into ``out`` if given.
    ``tile_rows`` (a multiple of 4) defaults to about ``TILE_BYTES`` of a's rows; K is summed
    in chunks of ``k_chunk`` where N is a multiple of 32. Raises ValueError naming the operand
    that does not fit (see the module docstring for what fits)."""
    _check(a, b, out)
    if tile_rows is not None and (tile_rows < BLOCK_ROWS or tile_rows % BLOCK_ROWS):
        raise ValueError(f"tile_rows: expected a positive multiple of {BLOCK_ROWS}, got {tile_rows}")
    if k_chunk < 1:
        raise ValueError(f"k_chunk: expected a positive number of rows of b, got {k_chunk}")
    if out is None:
        out = empty_aligned(a.shape[:-1] + (b.shape[-1],), a.dtype)
    return run_blocked(a, b, out, tile_rows, k_chunk)
