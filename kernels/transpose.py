"""Copying a transposed weight matrix into row-major memory, tile by tile.

The blocked matmul reads rows of its second operand as vectors, so ``x @ w.T`` first copies
``w.T`` (a view whose unit stride runs down the columns) into rows. NumPy copies such a view
along the destination's rows, so consecutive reads of the source land on different cache
lines. :func:`copy_rows` walks a 2-D matrix in TILE x TILE tiles instead: a tile's 16 source
lines and 16 destination lines stay in L1 while it is copied. Attention's batched per-head
transposes (32 x 32 and smaller) are small enough for NumPy's own copy, which is used.
"""
from ._jit import kernel

TILE = 16


@kernel
def _copy_tiled(src, dst):
    """dst[...] = src for 2-D arrays of one shape, tile by tile (TILE x TILE)."""
    n_r, n_c = src.shape
    for r0 in range(0, n_r, TILE):
        r1 = min(r0 + TILE, n_r)
        for c0 in range(0, n_c, TILE):
            c1 = min(c0 + TILE, n_c)
            for c in range(c0, c1):                  # down a column: src's unit stride
                for r in range(r0, r1):
                    dst[r, c] = src[r, c]


def copy_rows(src, dst):
    """dst[...] = src for arrays of one shape and dtype, by tiles where src is a 2-D transposed
    view (see the module docstring). Returns dst."""
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ValueError(f"copy_rows: expected src and dst of one shape and dtype, got "
                         f"{src.dtype} {src.shape} and {dst.dtype} {dst.shape}")
    if src.ndim == 2 and src.size and src.strides[0] == src.itemsize and src.shape[1] > 1:
        _copy_tiled(src, dst)
    else:
        dst[...] = src
    return dst
