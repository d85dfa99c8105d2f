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
at once.

A 2-D product (a linear layer's) is computed in **cells** by :func:`_cell_gemm`: a range of rows
times a range of panels, which the dispatcher's worker threads share. A cell packs its panels of
b, chunk by chunk, into a contiguous aligned buffer first (GotoBLAS's packing), so ``b`` may have
any strides (``w.T`` needs no copy beforehand) and a panel's rows lie one after the other in
memory, whatever the row stride of b (rows 4 KiB apart, N = 1024 float32, would all compete for
the same few cache sets). Each element of out is still one fused multiply-add per s from zero
over each chunk of K, the chunks added in order: the bits :func:`run_blocked` gives it, whatever
the cells (``tests/test_kernels_blocked_matmul.py`` holds the two schemes equal bit for bit).
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
ALIAS_BYTES = 1 << 10            # a transposed a whose steps lie a multiple of this apart is
                                 # packed: they fall in at most 4 of the 64 sets of a 4 KiB L1 way
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


@njit(inline="always", cache=True)
def _block_rows(row, tile, tile_end):
    """The 4 rows r0 <= r1 <= r2 <= r3 of the block starting at ``row`` of the tile
    [tile, tile_end): moved back to end at the tile's last row, the last row repeated where the
    tile has fewer than 4 (see the module docstring)."""
    r0 = max(min(row, tile_end - BLOCK_ROWS), tile)
    return r0, min(r0 + 1, tile_end - 1), min(r0 + 2, tile_end - 1), min(r0 + 3, tile_end - 1)


@njit(inline="always", fastmath=FASTMATH, cache=True)
def _fma_block(a0, a1, a2, a3, b0, b1, acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31):
    """One step s of a block: acc[i][j] += a_i * b_j for the 4 rows' a[r_i, s] and the two
    vectors of b[s, c:c+32]; each accumulator by one fused multiply-add."""
    x = vsplat(a0)
    acc00, acc01 = vfma(x, b0, acc00), vfma(x, b1, acc01)
    x = vsplat(a1)
    acc10, acc11 = vfma(x, b0, acc10), vfma(x, b1, acc11)
    x = vsplat(a2)
    acc20, acc21 = vfma(x, b0, acc20), vfma(x, b1, acc21)
    x = vsplat(a3)
    acc30, acc31 = vfma(x, b0, acc30), vfma(x, b1, acc31)
    return acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31


@njit(inline="always", fastmath=FASTMATH, cache=True)
def _finish_block(out, at, row_stride, row, r0, r1, r2, r3, accumulate,
                  acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31):
    """Store a block's 4 rows (:func:`_finish_row`) at element ``at`` of out's row 0, rows
    ``row_stride`` elements apart; rows before ``row`` belong to the block before."""
    _finish_row(out, at + r0 * row_stride, acc00, acc01, accumulate, r0 >= row)
    _finish_row(out, at + r1 * row_stride, acc10, acc11, accumulate, r1 >= row and r1 > r0)
    _finish_row(out, at + r2 * row_stride, acc20, acc21, accumulate, r2 >= row and r2 > r1)
    _finish_row(out, at + r3 * row_stride, acc30, acc31, accumulate, r3 >= row and r3 > r2)


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
                        r0, r1, r2, r3 = _block_rows(row, tile, tile_end)
                        acc00 = acc01 = acc10 = acc11 = vsplat(zero)
                        acc20 = acc21 = acc30 = acc31 = vsplat(zero)
                        for s in range(kk):
                            b_row = b_head + s * bs2 + c
                            acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31 = _fma_block(
                                a[g, h, r0, s], a[g, h, r1, s], a[g, h, r2, s], a[g, h, r3, s],
                                vload(b, b_row), vload(b, b_row + LANES),     # b[s, c:c+32]
                                acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31)
                        _finish_block(out, out_head + c, os2, row, r0, r1, r2, r3, accumulate,
                                      acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31)


@njit(inline="always", cache=True)
def _block_steps(a, ap, packed, blk, r0, r1, r2, r3, s, k0):
    """a[r_i, s] for the 4 rows of a block: from the packed tile ``ap`` once ``packed``; else
    from a, stored into ``ap`` where one is given (None: no packing, a branch Numba removes
    while compiling), so that the tile is packed by its first panel's pass."""
    if ap is not None and packed:
        return ap[blk, s - k0, 0], ap[blk, s - k0, 1], ap[blk, s - k0, 2], ap[blk, s - k0, 3]
    x0, x1, x2, x3 = a[r0, s], a[r1, s], a[r2, s], a[r3, s]
    if ap is not None:
        ap[blk, s - k0, 0], ap[blk, s - k0, 1] = x0, x1
        ap[blk, s - k0, 2], ap[blk, s - k0, 3] = x2, x3
    return x0, x1, x2, x3


@njit(inline="always", cache=True)
def _pack_panel(b, bp, i, c, k0, k1):
    """bp[i, s - k0, :] = b[s, c:c+32] for the steps of the chunk [k0, k1): two vectors a
    step where b's rows have unit stride (x of a weight gradient), else element by element
    (``w.T``, whose columns are the weight's rows)."""
    row_stride = b.strides[0] // b.itemsize
    if b.strides[1] == b.itemsize:
        for s in range(k0, k1):
            at = (i * bp.shape[1] + s - k0) * BLOCK_COLS
            vstore(bp, at, vload(b, s * row_stride + c))
            vstore(bp, at + LANES, vload(b, s * row_stride + c + LANES))
    else:
        for s in range(k0, k1):
            for j in range(BLOCK_COLS):
                bp[i, s - k0, j] = b[s, c + j]


@kernel
def _cell_gemm(a, b, out, zero, row0, row1, panel0, panel1, tile_rows, k_chunk, bp, ap):
    """out[row0:row1, the columns of panels panel0 .. panel1 - 1] (=) a @ b: one cell of a 2-D
    product; a (M, K) and b (K, N) any strides, out (M, N) with unit stride along its rows.

    Every element is the sum :func:`_blocked_gemm` computes, by the same operations in the
    same order: over each chunk of ``k_chunk`` rows of K, one fused multiply-add per s from
    zero, the chunk's sum then added to what the chunks before stored; and the loops are its
    loops (chunk of K; tile of ``tile_rows`` rows; panel; block of 4 rows). What differs: per
    chunk, the cell's panels of b are first copied into ``bp`` (panel1 - panel0, k_chunk, 32),
    C-contiguous and aligned, as GotoBLAS packs them. A panel then is k_chunk rows of 128 bytes
    (float32) one after the other, whatever b's strides: no copy of ``w.T`` beforehand, and no
    rows 4 KiB apart (N = 1024) competing for the same few cache sets. The same holds for a
    transposed ``a`` whose steps s lie a multiple of ``ALIAS_BYTES`` apart (``dY.T`` of a weight
    gradient, dY 1024 wide): given ``ap`` (tile_rows // 4, k_chunk, 4), the first panel's
    pass over a tile reads a in place and stores each block's steps there as it goes (the
    stores ride along with the multiply-adds: no pass of its own), and the other panels read
    the packed tile instead of those few sets; None: a is read in place. A panel of 32 columns
    starts at ``min(32 p, N - 32)``."""
    kk, n = b.shape
    row_stride = out.strides[0] // out.itemsize
    for k0 in range(0, kk, k_chunk):
        k1 = min(k0 + k_chunk, kk)
        for i in range(panel1 - panel0):
            c = min((panel0 + i) * BLOCK_COLS, n - BLOCK_COLS)
            _pack_panel(b, bp, i, c, k0, k1)
        for tile in range(row0, row1, tile_rows):
            tile_end = min(tile + tile_rows, row1)
            for i in range(panel1 - panel0):
                c = min((panel0 + i) * BLOCK_COLS, n - BLOCK_COLS)
                for blk, row in enumerate(range(tile, tile_end, BLOCK_ROWS)):
                    r0, r1, r2, r3 = _block_rows(row, tile, tile_end)
                    acc00 = acc01 = acc10 = acc11 = vsplat(zero)
                    acc20 = acc21 = acc30 = acc31 = vsplat(zero)
                    for s in range(k0, k1):
                        b_row = (i * k_chunk + s - k0) * BLOCK_COLS
                        a0, a1, a2, a3 = _block_steps(a, ap, i > 0, blk, r0, r1, r2, r3, s, k0)
                        acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31 = _fma_block(
                            a0, a1, a2, a3,
                            vload(bp, b_row), vload(bp, b_row + LANES),
                            acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31)
                    _finish_block(out, c, row_stride, row, r0, r1, r2, r3, k0 > 0,
                                  acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31)


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
    if kk <= k_chunk:                        # one chunk (attention's products): no views to make
        _blocked_gemm(a4, b4, out4, zero, tile_rows or _tile_rows(kk, a.itemsize), False)
        return out
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


def chunk_rows(k, n):
    """The rows of K summed per chunk in a product of N columns: ``K_CHUNK``, or all of K where
    N is not a multiple of 32 (an overlapped column would be added twice)."""
    return K_CHUNK if n % BLOCK_COLS == 0 else k


def panels(n):
    """How many 32-column panels cover N columns (the last one moved back to end at N)."""
    return -(-n // BLOCK_COLS)


def run_cell(a, b, out, rows, panel_range):
    """One cell of a 2-D product by :func:`_cell_gemm`: out[r0:r1, the panels' columns] = a @ b
    for ``rows`` = (r0, r1) and ``panel_range`` = (p0, p1), every element with the bits
    :func:`run_blocked` gives it (the same chunks of K, the same operations). No checks: a
    (M, K), b (K, N) of one float dtype, N >= 32, K >= 1, out (M, N) with unit-stride rows,
    overlapping neither."""
    (r0, r1), (p0, p1) = rows, panel_range
    kk, n = b.shape
    k_chunk = min(chunk_rows(kk, n), kk)
    tile_rows = _tile_rows(k_chunk, a.itemsize)
    bp = empty_aligned((p1 - p0, k_chunk, BLOCK_COLS), a.dtype)
    packed = (p1 - p0 > 1                           # a panel after the first to read it back
              and a.strides[1] > a.strides[0] and a.strides[1] % ALIAS_BYTES == 0)
    ap = empty_aligned((tile_rows // BLOCK_ROWS, k_chunk, BLOCK_ROWS), a.dtype) if packed else None
    _cell_gemm(a, b, out, a.dtype.type(0), r0, r1, p0, p1, tile_rows, k_chunk, bp, ap)
    return out
