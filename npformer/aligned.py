"""Arrays whose rows start on cache lines, and large ones reused instead of mapped afresh.

A 64-byte vector load from an address that is not a multiple of 64 touches two cache lines,
which slows the Numba backend's blocked kernel down on every row of b that starts past a cache
line (docs/kernels.md, "Alignment"). NumPy aligns its arrays to 16 bytes only, so the arrays
that feed matrix products (the model's flat parameter buffer, the kernels' outputs) are
allocated here.

Large arrays (the logits and their gradient: batch x vocabulary floats) are allocated anew in
every step. The C library hands memory that large to the operating system on free and maps it
again on the next allocation, and every fresh page then costs a fault and zeroing on first
touch. So buffers of ``POOL_MIN_BYTES`` and more come from a small pool: one is handed out
again only when nothing references it any more (its reference count says so), so no array
ever shares memory with another live one. At most ``POOL_IDLE_BYTES`` of idle buffers are kept;
:func:`release_pool` frees them. This concerns npformer's own arrays only, not the process's
allocator.
"""
import math
import operator
import sys
import threading

import numpy as np

ALIGNMENT = 64                   # bytes: one cache line, one AVX-512 register
POOL_MIN_BYTES = 1 << 22         # arrays from 4 MiB up come from the pool
POOL_IDLE_BYTES = 1 << 30        # idle buffers kept for reuse, at most
_pool = []                       # uint8 buffers, least recently handed out first
_pool_lock = threading.Lock()
_IDLE_REFS = 4                   # an idle buffer: _pool, the caller's name, _idle's, getrefcount's


def _idle(buf):
    return sys.getrefcount(buf) <= _IDLE_REFS


def _pooled_bytes(nbytes):
    """A uint8 buffer of at least ``nbytes`` that nothing else references: an idle one from the
    pool at most a quarter larger, else a new one; idle buffers beyond POOL_IDLE_BYTES (least
    recently used first) are let go."""
    with _pool_lock:
        for i in range(len(_pool)):                # (not enumerate: its tuple holds a reference)
            buf = _pool[i]
            if nbytes <= buf.nbytes <= nbytes + nbytes // 4 and _idle(buf):
                del _pool[i]
                _pool.append(buf)
                return buf
        buf = np.empty(nbytes, dtype=np.uint8)
        _pool.append(buf)
        idle_bytes = 0
        for i in range(len(_pool) - 2, -1, -1):            # newest first; the new one is in use
            old = _pool[i]
            if _idle(old):
                idle_bytes += old.nbytes
                if idle_bytes > POOL_IDLE_BYTES:
                    del _pool[i]
            del old
        return buf


def release_pool():
    """Let the pool's idle buffers go (their memory returns to the operating system)."""
    with _pool_lock:
        keep, buf = [], None
        for i in range(len(_pool)):
            buf = _pool[i]
            if not _idle(buf):
                keep.append(buf)
        del buf
        _pool[:] = keep


def empty_aligned(shape, dtype, aligned_rows=False):
    """np.empty(shape, dtype) whose first element starts a cache line (ALIGNMENT bytes; an
    empty array has no first element, and NumPy may place it anywhere). With ``aligned_rows``,
    every row (last axis) starts a cache line: rows are padded to a multiple of ALIGNMENT bytes
    and the result is a view of the unpadded part (not C-contiguous where padding was needed)."""
    dtype, shape = np.dtype(dtype), _shape(shape)
    per_line = ALIGNMENT // dtype.itemsize
    if aligned_rows and shape and shape[-1] % per_line:
        padded = empty_aligned(shape[:-1] + (shape[-1] + per_line - shape[-1] % per_line,), dtype)
        return padded[..., :shape[-1]]
    nbytes = math.prod(shape) * dtype.itemsize + ALIGNMENT
    buf = _pooled_bytes(nbytes) if nbytes >= POOL_MIN_BYTES else np.empty(nbytes, dtype=np.uint8)
    return _aligned_view(buf, shape, dtype)


def zeros_aligned(shape, dtype):
    """np.zeros(shape, dtype) whose first element starts a cache line, its pages left untouched
    until written (np.zeros of a fresh block: the operating system's zero pages, not the pool's
    used buffers): a gradient buffer that an evaluating model never writes costs no memory."""
    dtype, shape = np.dtype(dtype), _shape(shape)
    buf = np.zeros(math.prod(shape) * dtype.itemsize + ALIGNMENT, dtype=np.uint8)
    return _aligned_view(buf, shape, dtype)


def _shape(shape):
    """A shape as a tuple of ints (an int, a NumPy integer or a 0-d array: one axis)."""
    try:
        return (operator.index(shape),)
    except TypeError:
        return tuple(map(int, shape))


def _aligned_view(buf, shape, dtype):
    """The array of ``shape`` and ``dtype`` at the first cache line of the byte buffer ``buf``
    (ALIGNMENT bytes longer than the array)."""
    start = -buf.__array_interface__["data"][0] % ALIGNMENT
    return buf[start:start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


def rows_aligned(x):
    """Whether every row of x (last axis) has unit stride and starts a cache line."""
    return ((x.shape[-1] == 1 or x.strides[-1] == x.itemsize) and x.ctypes.data % ALIGNMENT == 0
            and all(stride % ALIGNMENT == 0 for stride in x.strides[:-1]))
