"""Fused RMSNorm: one row-parallel pass forward, one backward (docs/backprop.md#rmsnorm).

Same names and shapes as :mod:`npformer.functional.rmsnorm`. Half-precision inputs (which the
reference normalises in float32) take the reference itself.

A row's sum of squares is accumulated in float64 (float32 rows included), and 1 / rms too, from
which xhat and y are computed before rounding to the row's dtype. The forward writes y and the
two per-row factors (float64, and rounded to the row's dtype) and no xhat: the cache keeps x,
and the backward, which must read a row of N x D anyway, computes the row's xhat again from x
and the float64 factor, by the forward's operations, so to the forward's bits.
"""
import numpy as np
from numba import prange

from npformer.aligned import empty_aligned
from npformer.functional import rmsnorm as reference

from ._jit import kernel
from .layernorm import CHUNK_ROWS


@kernel(parallel=True)
def _rmsnorm_fwd(x, gamma, eps, y, rstd, rstd64):
    """x (N, D) -> y (N, D), and 1 / rms (N,) twice: in x's dtype (``rstd``) and in float64
    (``rstd64``), all written in place."""
    n, d = x.shape
    for r in prange(n):
        ms = 0.0
        for c in range(d):
            ms += x[r, c] * x[r, c]
        rs = 1.0 / np.sqrt(ms / d + eps)
        rstd[r], rstd64[r] = rs, rs
        for c in range(d):
            y[r, c] = x[r, c] * rs * gamma[c]


@kernel(parallel=True)
def _rmsnorm_bwd(dy, x, rstd, rstd64, gamma, dx, dgamma):
    """dy (N, D) -> dx (N, D) in place; dgamma (D,) filled. A row's xhat is computed again into
    a row of x's dtype (rounded as the forward's was). dgamma's partial sums are per chunk of
    ``CHUNK_ROWS`` rows, added in chunk order: the same bits on any number of threads."""
    n, d = dy.shape
    n_chunks = max(1, (n + CHUNK_ROWS - 1) // CHUNK_ROWS)
    part = np.zeros((n_chunks, d), dtype=dgamma.dtype)
    for ch in prange(n_chunks):
        start, stop = ch * CHUNK_ROWS, min(n, (ch + 1) * CHUNK_ROWS)
        xhat = np.empty(d, dtype=dx.dtype)                  # one row, in L1
        for r in range(start, stop):
            rs64 = rstd64[r]
            mean_gx = 0.0
            for c in range(d):
                xhat[c] = x[r, c] * rs64                    # rounded to x's dtype here
                mean_gx += dy[r, c] * gamma[c] * xhat[c]
                part[ch, c] += dy[r, c] * xhat[c]
            mean_gx /= d
            rs = rstd[r]
            for c in range(d):
                dx[r, c] = rs * (dy[r, c] * gamma[c] - xhat[c] * mean_gx)
    dgamma[:] = 0.0
    for ch in range(n_chunks):
        for c in range(d):
            dgamma[c] += part[ch, c]


def rmsnorm_forward(x, gamma, eps=1e-6):
    """y = gamma * x / sqrt(mean(x^2) + eps) over the last axis. x (..., D) -> y (..., D); the
    cache holds x's rows (N, D) themselves (no copy of a contiguous x)."""
    if x.dtype.itemsize < 4:
        return reference.rmsnorm_forward(x, gamma, eps)
    d = x.shape[-1]
    if gamma.shape != (d,):
        raise ValueError(f"gamma: expected shape ({d},), got {gamma.shape}")
    x2 = np.ascontiguousarray(x.reshape(-1, d))               # (N, D)
    y = empty_aligned(x2.shape, x2.dtype)                     # pooled: no fresh pages
    rstd = np.empty(x2.shape[0], dtype=x2.dtype)              # (N,)
    rstd64 = np.empty(x2.shape[0], dtype=np.float64)
    _rmsnorm_fwd(x2, gamma.astype(x2.dtype, copy=False), eps, y, rstd, rstd64)
    return y.reshape(x.shape), (x2, rstd, rstd64, gamma, x.shape)


def rmsnorm_backward(dout, cache):
    """dx, dgamma of the forward above (maths in the reference)."""
    if len(cache) == 4:                                       # the reference's (half precision)
        return reference.rmsnorm_backward(dout, cache)
    x2, rstd, rstd64, gamma, shape = cache
    if dout.shape != shape:
        raise ValueError(f"dout: expected shape {shape}, got {dout.shape}")
    dout2 = np.ascontiguousarray(dout.reshape(x2.shape), dtype=x2.dtype)   # (N, D)
    dx = empty_aligned(x2.shape, x2.dtype)
    dgamma = np.empty(x2.shape[1], dtype=x2.dtype)
    _rmsnorm_bwd(dout2, x2, rstd, rstd64, gamma.astype(x2.dtype, copy=False), dx, dgamma)
    return dx.reshape(shape), dgamma.astype(gamma.dtype, copy=False)
