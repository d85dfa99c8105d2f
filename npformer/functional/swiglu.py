"""The gated feed-forward's hidden layer: act(gate) * up, where gate and up are the two halves of
one fused projection. With SiLU (x * sigmoid(x)) it is SwiGLU, Llama's, Qwen's and Mistral's;
with GELU (exact or tanh) GeGLU, Gemma's; with ReLU ReGLU. ``GATED_ACTIVATIONS`` holds the
activations a gate can apply: the element-wise ones of :mod:`.activations` and SiLU.

Derivation: docs/backprop.md#swiglu.
"""
import numpy as np

from .activations import ACTIVATIONS


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


GATED_ACTIVATIONS = {"silu": (silu_forward, silu_backward), **ACTIVATIONS}


def check_gated_activation(activation):
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(GATED_ACTIVATIONS)} for a gated "
                         f"feed-forward, got {activation!r}")


def gated_forward(h, activation):
    """h (..., 2F) = [gate | up] -> out (..., F) = act(gate) * up, ``act`` the
    ``GATED_ACTIVATIONS`` entry ``activation`` (Hugging Face's ``gate_proj`` and ``up_proj``
    outputs, fused into one projection: its first F columns are the gate)."""
    check_gated_activation(activation)
    act_forward, _ = GATED_ACTIVATIONS[activation]
    f = h.shape[-1] // 2
    act, act_cache = act_forward(h[..., :f])
    up = h[..., f:]
    return act * up, (activation, act, up, act_cache)


def gated_backward(dout, cache):
    """d gate = act'(gate) * (dout * up), d up = dout * act(gate); returned side by side as
    dh (..., 2F), the gradient of the fused projection's output."""
    activation, act, up, act_cache = cache
    _, act_backward = GATED_ACTIVATIONS[activation]
    return np.concatenate([act_backward(dout * up, act_cache), dout * act], axis=-1)


def swiglu_forward(h):
    """h (..., 2F) = [gate | up] -> out (..., F) = silu(gate) * up: :func:`gated_forward` with
    SiLU, its cache (silu(gate), up, silu's cache)."""
    out, (_, act, up, silu_cache) = gated_forward(h, "silu")
    return out, (act, up, silu_cache)


def swiglu_backward(dout, cache):
    """:func:`gated_backward` of SiLU's gate: dh (..., 2F) = [d gate | d up]."""
    return gated_backward(dout, ("silu", *cache))
