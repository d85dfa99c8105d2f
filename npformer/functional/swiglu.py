"""The gated feed-forward of Llama, Qwen and Mistral: SiLU (x * sigmoid(x)) and SwiGLU,
silu(gate) * up, where gate and up are the two halves of one fused projection.

Derivation: docs/backprop.md#swiglu.
"""
import numpy as np


def _sigmoid(x):
    """1 / (1 + e^-x) without overflow: e^-|x| only (for x < 0, sigmoid = e^x / (1 + e^x))."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def silu_forward(x):
    """y = x * sigmoid(x) (SiLU, the "swish" of Llama's gate). Shape preserved."""
    s = _sigmoid(x)
    return x * s, (x, s)


def silu_backward(dout, cache):
    """dy/dx = s + x s (1 - s), s = sigmoid(x)."""
    x, s = cache
    return dout * (s * (1.0 + x * (1.0 - s)))


def swiglu_forward(h):
    """h (..., 2F) = [gate | up] -> out (..., F) = silu(gate) * up (Llama's ``gate_proj`` and
    ``up_proj`` outputs, fused into one projection: its first F columns are the gate)."""
    f = h.shape[-1] // 2
    gate, up = h[..., :f], h[..., f:]
    act, silu_cache = silu_forward(gate)
    return act * up, (act, up, silu_cache)


def swiglu_backward(dout, cache):
    """d gate = silu'(gate) * (dout * up), d up = dout * silu(gate); returned side by side as
    dh (..., 2F), the gradient of the fused projection's output."""
    act, up, silu_cache = cache
    return np.concatenate([silu_backward(dout * up, silu_cache), dout * act], axis=-1)
