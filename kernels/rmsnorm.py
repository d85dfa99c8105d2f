"""Fused RMSNorm: one row-parallel pass forward, one backward (docs/backprop.md#rmsnorm).

Same names and shapes as :mod:`npformer.functional.rmsnorm`. Half-precision inputs (which the
reference normalises in float32) take the reference itself.
"""
import numpy as np
from numba import prange

from npformer.aligned import empty_aligned
from npformer.functional import rmsnorm as reference

from ._jit import kernel
from .layernorm import CHUNK_ROWS


@kernel(parallel=True)
def _rmsnorm_fwd(x, gamma, eps, y, xhat, rstd):
    """x (N, D) -> y, xhat (N, D) and rstd (N,), written in place."""
    n, d = x.shape
    for r in prange(n):
        ms = 0.0
        for c in range(d):
            ms += x[r, c] * x[r, c]
        rs = 1.0 / np.sqrt(ms / d + eps)
        rstd[r] = rs
        for c in range(d):
            xh = x[r, c] * rs
            xhat[r, c] = xh
            y[r, c] = xh * gamma[c]


@kernel(parallel=True)
def _rmsnorm_bwd(dy, xhat, rstd, gamma, dx, dgamma):
    """dy (N, D) -> dx (N, D) in place; dgamma (D,) filled. dgamma's partial sums are per chunk
    of ``CHUNK_ROWS`` rows, added in chunk order: the same bits on any number of threads."""
    n, d = dy.shape
    n_chunks = max(1, (n + CHUNK_ROWS - 1) // CHUNK_ROWS)
    part = np.zeros((n_chunks, d), dtype=dgamma.dtype)
    for ch in prange(n_chunks):
        start, stop = ch * CHUNK_ROWS, min(n, (ch + 1) * CHUNK_ROWS)
        for r in range(start, stop):
            mean_gx = 0.0
            for c in range(d):
                mean_gx += dy[r, c] * gamma[c] * xhat[r, c]
                part[ch, c] += dy[r, c] * xhat[r, c]
            mean_gx /= d
            rs = rstd[r]
            for c in range(d):
                dx[r, c] = rs * (dy[r, c] * gamma[c] - xhat[r, c] * mean_gx)
    dgamma[:] = 0.0
    for ch in range(n_chunks):
        for c in range(d):
            dgamma[c] += part[ch, c]


def rmsnorm_forward(x, gamma, eps=1e-6):
    """y = gamma * x / sqrt(mean(x^2) + eps) over the last axis. x (..., D) -> y (..., D)."""
    if x.dtype.itemsize < 4:
        return reference.rmsnorm_forward(x, gamma, eps)
    d = x.shape[-1]
    if gamma.shape != (d,):
        raise ValueError(f"gamma: expected shape ({d},), got {gamma.shape}")
    x2 = np.ascontiguousarray(x.reshape(-1, d))               # (N, D)
    y = empty_aligned(x2.shape, x2.dtype)
    xhat = empty_aligned(x2.shape, x2.dtype)                   # pooled: no fresh pages
    rstd = np.empty((x2.shape[0], 1), dtype=x2.dtype)        # (N, 1), the reference's layout
    _rmsnorm_fwd(x2, gamma.astype(x2.dtype, copy=False), eps, y, xhat, rstd[:, 0])
    return y.reshape(x.shape), (xhat.reshape(x.shape), rstd.reshape(*x.shape[:-1], 1), gamma,
                                x.dtype)


def rmsnorm_backward(dout, cache):
    """dx, dgamma of the forward above (maths in the reference)."""
    xhat, rstd, gamma, dtype = cache
    if xhat.dtype.itemsize < 4 or dtype.itemsize < 4:
        return reference.rmsnorm_backward(dout, cache)
    if dout.shape != xhat.shape:
        raise ValueError(f"dout: expected shape {xhat.shape}, got {dout.shape}")
    d = xhat.shape[-1]
    dout2 = np.ascontiguousarray(dout.reshape(-1, d), dtype=xhat.dtype)   # (N, D)
    dx = empty_aligned(dout2.shape, dout2.dtype)
    dgamma = np.empty(d, dtype=xhat.dtype)
    _rmsnorm_bwd(dout2, xhat.reshape(-1, d), rstd.reshape(-1), gamma.astype(xhat.dtype, copy=False),
                 dx, dgamma)
    return dx.reshape(xhat.shape), dgamma.astype(gamma.dtype, copy=False)
