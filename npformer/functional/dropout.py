"""Inverted dropout: zero each unit with probability p and scale survivors by 1/(1-p), so the
expected activation is unchanged and evaluation needs no rescaling.

Derivation: docs/backprop.md#dropout.
"""
import numpy as np


def dropout_forward(x, p, rng, training=True):
    """Shape: x (...) -> out (...), same shape. Identity when not training or p == 0."""
    if not training or p == 0.0:
        return x, None
    keep = rng.random(x.shape, dtype=np.float32) >= p      # (...) bool, True = kept
    scale = x.dtype.type(1.0 / (1.0 - p))
    return x * keep * scale, (keep, scale)


def dropout_backward(dout, cache):
    """out = x * keep / (1-p) is linear in x: dx = dout * keep / (1-p)."""
    if cache is None:
        return dout
    keep, scale = cache
    return dout * keep * scale
