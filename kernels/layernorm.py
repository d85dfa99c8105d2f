"""Fused LayerNorm: one row-parallel pass forward, one backward (docs/backprop.md#layernorm).

Same names, shapes and cache as :mod:`npformer.functional.layernorm`; the statistics and the
normalisation of a row are computed together instead of in five NumPy passes.
"""
import numpy as np
from numba import njit, prange

from npformer.aligned import empty_aligned

from ._jit import FASTMATH, kernel


@njit(inline="always", fastmath=FASTMATH, cache=True)
def _normalize_row(x, r, gamma, beta, eps, y, xhat, rstd):
    """Row r of x (N, D) -> row r of y and xhat, rstd[r]: the forward's work on one row."""
    d = x.shape[1]
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


@kernel(parallel=True)
def _layernorm_fwd(x, gamma, beta, eps, y, xhat, rstd):
    """x (N, D) -> y, xhat (N, D) and rstd (N,), written in place."""
    for r in prange(x.shape[0]):
        _normalize_row(x, r, gamma, beta, eps, y, xhat, rstd)


@kernel(parallel=True)
def _add_layernorm_fwd(x, z, gamma, beta, eps, y, xhat, rstd):
    """LN(x + z): x, z (N, D) -> y, xhat (N, D) and rstd (N,), written in place. Row by row,
    the sum s = x + z (rounded to y's dtype, as the residual sum kernels/dropout.py's ``_add``
    stores it) is written into xhat's row, then normalised by the forward's own row work:
    the bits of the residual sum followed by :func:`layernorm_forward`."""
    for r in prange(x.shape[0]):
        for c in range(x.shape[1]):
            xhat[r, c] = x[r, c] + z[r, c]
        _normalize_row(xhat, r, gamma, beta, eps, y, xhat, rstd)


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
    return _rows_forward(_layernorm_fwd, (x,), gamma, beta, eps)


def add_layernorm_forward(x, z, gamma, beta, eps=1e-5):
    """LN(x + z) in one pass, for a post-norm residual connection with dropout off (eval): the
    bits of ``dropout_add_forward(x, z, p, rng, training=False)`` then :func:`layernorm_forward`
    on its sum, and the same cache, so :func:`layernorm_backward` follows it as it follows
    :func:`layernorm_forward`. x, z (..., D) of one shape and dtype -> y (..., D)."""
    if z.shape != x.shape or z.dtype != x.dtype:
        raise ValueError(f"z: expected shape {x.shape} and dtype {x.dtype} (those of x), got "
                         f"{z.shape} and {z.dtype}")
    return _rows_forward(_add_layernorm_fwd, (x, z), gamma, beta, eps)


def _rows_forward(forward, inputs, gamma, beta, eps):
    """(y, cache) of ``forward(*rows, gamma, beta, eps, y, xhat, rstd)`` over ``inputs`` (each
    (..., D), the first's shape) as rows (N, D)."""
    shape, d = inputs[0].shape, inputs[0].shape[-1]
    if gamma.shape != (d,) or beta.shape != (d,):
        raise ValueError(f"gamma, beta: expected shape ({d},), got {gamma.shape}, {beta.shape}")
    rows = [np.ascontiguousarray(a.reshape(-1, d)) for a in inputs]      # (N, D) each
    y = empty_aligned(rows[0].shape, rows[0].dtype)   # the next layer's input: rows on cache lines
    xhat = np.empty_like(rows[0])
    rstd = np.empty((rows[0].shape[0], 1), dtype=rows[0].dtype)    # (N, 1), the reference's layout
    forward(*rows, gamma, beta, eps, y, xhat, rstd[:, 0])
    return y.reshape(shape), (xhat.reshape(shape), rstd.reshape(*shape[:-1], 1), gamma)


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
