"""Many small matrix products, register-blocked: ``out[g] = a[g] @ b[g]`` head by head.

The products of attention are 1,024 matrices of (16-64) x (16-64) x 32 per call. BLAS pays a
per-call cost for each of them (packing, dispatch) that is comparable to the arithmetic, and a
plain Numba loop is held back by the latency of its multiply-adds. This kernel computes a block
of 4 rows x 32 columns of ``out`` in eight vector accumulators (``_simd``: 16 lanes each),
walking the shared dimension once:

    for s in range(K):                 # b[s, c:c+32] as two vectors, a[r:r+4, s] as 4 scalars
        acc[i][j] += a[r + i, s] * b[s, c + 16 j : c + 16 (j + 1)]    (i < 4, j < 2)

Eight independent accumulators keep both FMA pipes busy (one chain of FMAs waits 4 cycles for
each result); the block's a-scalars and b-vectors come from L1. Measured on L2-sized groups of
heads, B*H = 128 (BENCHMARKS.md): 2.5x faster than BLAS at T=16, 2.2x at T=32, 1.8x at T=64.

Edges without remainder loops: the last row block and the last column block are moved back so
that they end at the last row / column, overlapping the block before them (with fewer than 4
rows, a row is repeated). The overlapped entries are computed again and written again with the
same value, which is harmless because ``out`` is no input. Hence ``N >= 32`` is required.

Operands: ``a`` any strides (its entries are read one by one, so ``a`` may be a transposed
view); ``b`` and ``out`` with unit stride along their last axis (rows are read and written as
vectors). The wrapper :func:`blocked_matmul` checks this; the matmul dispatcher offers the
kernel as the candidate ``"numba-blocked"`` where it applies and keeps it only for shapes where
it measures faster than BLAS. Serial and ``nogil``: attention runs it on two Python threads.
"""
import numpy as np

from ._jit import kernel
from ._simd import LANES, empty_aligned, vfma, vload, vsplat, vstore

BLOCK_ROWS = 4
BLOCK_COLS = 2 * LANES           # two vectors per row
TILE_BYTES = 1 << 16             # rows of a per tile: about this many bytes of a (L2-resident)


@kernel
def _blocked_gemm(a, b, out, zero, tile_rows):
    """out[g, h] = a[g, h] @ b[g, h]; a (G, H, M, K), b (G, H, K, N), out (G, H, M, N).

    b and out: unit stride along the last axis, N >= BLOCK_COLS, out overlapping neither a nor
    b. ``zero`` is 0 in the dtype of the arrays. Loop order, outermost first: head; a tile of
    ``tile_rows`` rows of a (kept in L2 while every column panel passes); a panel of 32 columns
    of b (K x 32, kept in L1 while the row blocks of the tile pass); a block of 4 rows; K.
    Row blocks start at 0, 4, ... within a tile (the last one clamped to end at the tile's last
    row, or repeating rows when the tile has fewer than 4); column panels at 0, 32, ... (the
    last one moved back to N - 32)."""
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
                        out_block = out_head + c
                        vstore(out, out_block + r0 * os2, acc00)
                        vstore(out, out_block + r0 * os2 + LANES, acc01)
                        vstore(out, out_block + r1 * os2, acc10)
                        vstore(out, out_block + r1 * os2 + LANES, acc11)
                        vstore(out, out_block + r2 * os2, acc20)
                        vstore(out, out_block + r2 * os2 + LANES, acc21)
                        vstore(out, out_block + r3 * os2, acc30)
                        vstore(out, out_block + r3 * os2 + LANES, acc31)


def _rows_unit_stride(x):
    return x.shape[-1] == 1 or x.strides[-1] == x.itemsize


def applies(a, b, out=None):
    """Whether :func:`blocked_matmul` can compute a @ b into out (see the module docstring)."""
    return (a.ndim <= 4 and a.ndim == b.ndim and a.dtype == b.dtype
            and a.dtype in (np.float32, np.float64) and a.shape[-2] >= 1 and a.shape[-1] >= 1
            and b.shape[-1] >= BLOCK_COLS and _rows_unit_stride(b)
            and (out is None or (_rows_unit_stride(out) and not np.may_share_memory(out, a)
                                 and not np.may_share_memory(out, b))))


def _as_4d(x):
    return x.reshape((1,) * (4 - x.ndim) + x.shape)      # a view: only leading axes of size 1


def blocked_matmul(a, b, out=None, tile_rows=None):
    """a @ b by :func:`_blocked_gemm`. Shape: a (..., M, K), b (..., K, N) with the same
    leading shape (at most two leading axes) -> (..., M, N), written into ``out`` if given.
    ``tile_rows`` (a multiple of 4) defaults to about ``TILE_BYTES`` of a's rows."""
    if not applies(a, b, out):
        raise ValueError(f"blocked_matmul: expected float a (..., M, K) and b (..., K, N) with "
                         f"N >= {BLOCK_COLS}, b and out with unit stride along their last axis "
                         f"and out overlapping neither, got a {a.dtype} {a.shape}, b {b.dtype} "
                         f"{b.shape}, strides {b.strides}")
    if out is None:
        out = empty_aligned(a.shape[:-1] + (b.shape[-1],), a.dtype)
    if tile_rows is None:
        tile_rows = TILE_BYTES // (a.shape[-1] * a.itemsize) // BLOCK_ROWS * BLOCK_ROWS
    elif tile_rows % BLOCK_ROWS:
        raise ValueError(f"tile_rows: expected a positive multiple of {BLOCK_ROWS}, got {tile_rows}")
    tile_rows = max(BLOCK_ROWS, tile_rows)
    if out.size:
        _blocked_gemm(_as_4d(a), _as_4d(b), _as_4d(out), a.dtype.type(0), tile_rows)
    return out
