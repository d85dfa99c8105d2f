"""Soft-capping (Gemma 2's attention scores and final logits): a smooth clip to (-cap, cap).

Derivation: docs/backprop.md#soft-capping.
"""
import numpy as np


def softcap_forward(x, cap):
    """y = cap * tanh(x / cap): close to x where |x| is small against ``cap``, never beyond it.

    Shape: x (...) -> y (...); ``cap`` a positive number (not trained).
    """
    t = np.tanh(x / cap)
    return cap * t, t


def softcap_backward(dout, cache):
    """With t = tanh(x / cap): dy/dx = cap * (1 - t^2) / cap = 1 - t^2, so

      dx = dout * (1 - t^2)

    ``cache`` is t (the cap cancels: the backward does not need it).
    """
    t = cache
    return dout * (1 - t * t)
