"""Inverted dropout with the mask applied in one fused pass (docs/backprop.md#dropout).

The keep-mask is drawn from the caller's ``rng`` exactly as the reference draws it, so the
NumPy and Numba paths see identical masks for the same seed; only the multiply is compiled.
"""
import numpy as np
from numba import prange

from npformer.aligned import empty_aligned
from npformer.functional.dropout import keep_mask

from ._jit import kernel


@kernel(parallel=True)
def _apply_mask(x, keep, scale, out):
    """out = x * keep * scale over flat arrays."""
    for i in prange(x.shape[0]):
        out[i] = x[i] * scale if keep[i] else 0.0


def dropout_forward(x, p, rng, training=True):
    """Shape: x (...) -> out (...), same shape. Identity when not training or p == 0."""
    if not training or p == 0.0:
        return x, None
    keep = keep_mask(x.shape, p, rng)                     # (...) bool, True = kept
    scale = x.dtype.type(1.0 / (1.0 - p))
    out = empty_aligned(x.shape, x.dtype)          # often a linear layer's input
    _apply_mask(np.ascontiguousarray(x).reshape(-1), keep.reshape(-1), scale, out.reshape(-1))
    return out, (keep, scale)


def dropout_backward(dout, cache):
    """dx = dout * keep / (1 - p)."""
    if cache is None:
        return dout
    keep, scale = cache
    if dout.shape != keep.shape:
        raise ValueError(f"dout: expected shape {keep.shape}, got {dout.shape}")
    dx = np.empty(dout.shape, dtype=dout.dtype)
    _apply_mask(np.ascontiguousarray(dout).reshape(-1), keep.reshape(-1), dout.dtype.type(scale),
                dx.reshape(-1))
    return dx
