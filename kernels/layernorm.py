"""Fused LayerNorm: one row-parallel pass forward, one backward (docs/backprop.md#layernorm).

Same names, shapes and cache as :mod:`npformer.functional.layernorm`; the statistics and the
normalisation of a row are computed together instead of in five NumPy passes.
"""
import numpy as np
from numba import prange

from npformer.aligned import empty_aligned

from ._jit import kernel


@kernel(parallel=True)
def _layernorm_fwd(x, gamma, beta, eps, y, xhat, rstd):
    """x (N, D) -> y, xhat (N, D) and rstd (N,), written in place."""
    n, d = x.shape
    for r in prange(n):
        mean = 0.0
        for c in range(d):
            mean += x[r, c]
        mean /= d
        var = 0.0
        for c in range(d):
            xc = x[r, c] - mean
            var += xc * xc
        var /= d
        rs = 1.0 / np.sqrt(var + eps)
        rstd[r] = rs
        for c in range(d):
            xh = (x[r, c] - mean) * rs
            xhat[r, c] = xh
            y[r, c] = xh * gamma[c] + beta[c]


# Rows per chunk of the backward's dgamma/dbeta partial sums. Fixed, so the order of the sums, and
# with it every bit of the result, depends on the shape alone: 1, 2 or 64 threads give the same.
CHUNK_ROWS = 32


@kernel(parallel=True)
def _layernorm_bwd(dy, xhat, rstd, gamma, dx, dgamma, dbeta):
    """dy (N, D) -> dx (N, D) in place; dgamma, dbeta (D,) filled (not accumulated).

    Rows are split into chunks of ``CHUNK_ROWS``; each chunk sums its own dgamma/dbeta partials
    (no two threads write the same entry), which are then added in chunk order."""
    n, d = dy.shape
    n_chunks = max(1, (n + CHUNK_ROWS - 1) // CHUNK_ROWS)
    part_g = np.zeros((n_chunks, d), dtype=dgamma.dtype)
    part_b = np.zeros((n_chunks, d), dtype=dgamma.dtype)
    for ch in prange(n_chunks):
        start, stop = ch * CHUNK_ROWS, min(n, (ch + 1) * CHUNK_ROWS)
        for r in range(start, stop):
            mean_g = 0.0
            mean_gx = 0.0
            for c in range(d):
                g = dy[r, c] * gamma[c]
                mean_g += g
                mean_gx += g * xhat[r, c]
                part_g[ch, c] += dy[r, c] * xhat[r, c]
                part_b[ch, c] += dy[r, c]
            mean_g /= d
            mean_gx /= d
            rs = rstd[r]
            for c in range(d):
                dx[r, c] = rs * (dy[r, c] * gamma[c] - mean_g - xhat[r, c] * mean_gx)
    dgamma[:] = 0.0
    dbeta[:] = 0.0
    for ch in range(n_chunks):
        for c in range(d):
            dgamma[c] += part_g[ch, c]
            dbeta[c] += part_b[ch, c]


def layernorm_forward(x, gamma, beta, eps=1e-5):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta over the last axis. x (..., D) -> y (..., D)."""
    d = x.shape[-1]
    if gamma.shape != (d,) or beta.shape != (d,):
        raise ValueError(f"gamma, beta: expected shape ({d},), got {gamma.shape}, {beta.shape}")
    x2 = np.ascontiguousarray(x.reshape(-1, d))               # (N, D)
    y = empty_aligned(x2.shape, x2.dtype)          # the next layer's input: rows on cache lines
    xhat = np.empty_like(x2)
    rstd = np.empty((x2.shape[0], 1), dtype=x2.dtype)        # (N, 1), the reference's layout
    _layernorm_fwd(x2, gamma, beta, eps, y, xhat, rstd[:, 0])
    return y.reshape(x.shape), (xhat.reshape(x.shape), rstd.reshape(*x.shape[:-1], 1), gamma)


def layernorm_backward(dout, cache):
    """dx, dgamma, dbeta of the forward above (maths in the reference)."""
    xhat, rstd, gamma = cache
    if dout.shape != xhat.shape:
        raise ValueError(f"dout: expected shape {xhat.shape}, got {dout.shape}")
    d = xhat.shape[-1]
    dout2 = np.ascontiguousarray(dout.reshape(-1, d), dtype=xhat.dtype)   # (N, D)
    dx = np.empty_like(dout2)
    dgamma = np.empty(d, dtype=xhat.dtype)
    dbeta = np.empty(d, dtype=xhat.dtype)
    _layernorm_bwd(dout2, xhat.reshape(-1, d), rstd.reshape(-1), gamma, dx, dgamma, dbeta)
    return dx.reshape(xhat.shape), dgamma, dbeta
