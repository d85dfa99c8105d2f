"""Arrays whose rows start on cache lines.

A 64-byte vector load from an address that is not a multiple of 64 touches two cache lines,
which slows the Numba backend's blocked kernel down on every row of b that starts past a cache
line (docs/kernels.md, "Alignment"). NumPy aligns its arrays to 16 bytes only, so the arrays that feed matrix products (the model's
flat parameter buffer, the kernels' outputs) are allocated here.
"""
import numpy as np

ALIGNMENT = 64                   # bytes: one cache line, one AVX-512 register


def empty_aligned(shape, dtype, aligned_rows=False):
    """np.empty(shape, dtype) whose first element starts a cache line (ALIGNMENT bytes; an
    empty array has no first element, and NumPy may place it anywhere). With ``aligned_rows``,
    every row (last axis) starts a cache line: rows are padded to a multiple of ALIGNMENT bytes
    and the result is a view of the unpadded part (not C-contiguous where padding was needed)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if np.ndim(shape) == 0 else tuple(shape)
    per_line = ALIGNMENT // dtype.itemsize
    if aligned_rows and shape and shape[-1] % per_line:
        padded = empty_aligned(shape[:-1] + (shape[-1] + per_line - shape[-1] % per_line,), dtype)
        return padded[..., :shape[-1]]
    n = int(np.prod(shape, dtype=np.int64))
    buf = np.empty(n * dtype.itemsize + ALIGNMENT, dtype=np.uint8)
    start = -buf.ctypes.data % ALIGNMENT
    return buf[start:start + n * dtype.itemsize].view(dtype).reshape(shape)


def zeros_aligned(shape, dtype):
    """np.zeros(shape, dtype) whose first element starts a cache line."""
    out = empty_aligned(shape, dtype)
    out.fill(0)
    return out


def rows_aligned(x):
    """Whether every row of x (last axis) has unit stride and starts a cache line."""
    return ((x.shape[-1] == 1 or x.strides[-1] == x.itemsize) and x.ctypes.data % ALIGNMENT == 0
            and all(stride % ALIGNMENT == 0 for stride in x.strides[:-1]))
