"""dropout(activation(h)) in one element-wise pass each way, on every core.

Same names, shapes and maths as :mod:`npformer.functional.activation_dropout` (ReLU or exact
GELU, then inverted dropout with the reference's keep-mask); the reference makes two passes
forward and two backward, each allocating a new array. The cache keeps h (the pre-activation)
and the keep-mask; the backward recomputes act'(h) from h.
"""
import math

import numpy as np
from numba import prange

from npformer.functional.activation_dropout import _check_activation
from npformer.functional.dropout import keep_mask

from ._jit import kernel

_GELU = 1                      # activation codes inside the kernels (0 = ReLU)
_NO_MASK = np.ones(1, dtype=bool)


@kernel(parallel=True)
def _forward(h, code, keep, scale, use_dropout, out):
    """out = act(h) * keep * scale over flat arrays (without dropout: out = act(h))."""
    inv_sqrt2 = 1.0 / math.sqrt(2.0)
    for i in prange(h.shape[0]):
        x = h[i]
        if code == _GELU:
            y = x * (0.5 * (1.0 + math.erf(x * inv_sqrt2)))
        else:
            y = x if x > 0 else x - x                 # (x - x: a zero of x's dtype)
        if use_dropout:
            y = y * scale if keep[i] else y - y
        out[i] = y


@kernel(parallel=True)
def _backward(dout, h, code, keep, scale, use_dropout, dh):
    """dh = act'(h) * dout * keep * scale over flat arrays."""
    inv_sqrt2 = 1.0 / math.sqrt(2.0)
    inv_sqrt2pi = 1.0 / math.sqrt(2.0 * math.pi)
    for i in prange(h.shape[0]):
        g = dout[i]
        if use_dropout:
            g = g * scale if keep[i] else g - g
        x = h[i]
        if code == _GELU:
            cdf = 0.5 * (1.0 + math.erf(x * inv_sqrt2))
            g = g * (cdf + x * math.exp(-0.5 * x * x) * inv_sqrt2pi)
        elif not x > 0:
            g = g - g
        dh[i] = g


def activation_dropout_forward(h, activation, p, rng, training=True):
    """Shape: h (...) -> out (...), same shape; as the reference."""
    _check_activation(activation)
    use_dropout = bool(training and p > 0.0)
    keep = keep_mask(h.shape, p, rng) if use_dropout else None   # the reference's draws
    scale = h.dtype.type(1.0 / (1.0 - p)) if use_dropout else h.dtype.type(1.0)
    h = np.ascontiguousarray(h)
    out = np.empty(h.shape, dtype=h.dtype)
    code = _GELU if activation == "gelu" else 0
    _forward(h.reshape(-1), code, _NO_MASK if keep is None else keep.reshape(-1), scale,
             use_dropout, out.reshape(-1))
    return out, (code, h, keep, scale)


def activation_dropout_backward(dout, cache):
    """dh (shape of h) = act'(h) * dout * keep * scale."""
    code, h, keep, scale = cache
    if dout.shape != h.shape:
        raise ValueError(f"dout: expected shape {h.shape}, got {dout.shape}")
    dout = np.ascontiguousarray(dout, dtype=h.dtype)
    dh = np.empty(h.shape, dtype=h.dtype)
    _backward(dout.reshape(-1), h.reshape(-1), code, _NO_MASK if keep is None else keep.reshape(-1),
              scale, keep is not None, dh.reshape(-1))
    return dh
