"""Exercise: SiLU and SwiGLU, the gated feed-forward of Llama, Qwen and Mistral.

Derivation: docs/backprop.md#swiglu (section "SwiGLU").

silu(x) = x * sigmoid(x). SwiGLU takes h (..., 2F) = [gate | up], the two halves of one fused
projection, and gives out (..., F) = silu(gate) * up.
Write ``silu_backward`` (dout (...) -> dx (...)) and ``swiglu_backward`` (dout (..., F) ->
dh (..., 2F): the gate's gradient and the up half's, side by side).
"""
import numpy as np


from npformer.functional.swiglu import _sigmoid  # given, its docstring:
# "1 / (1 + e^-x) without overflow."


from npformer.functional.swiglu import silu_forward  # given, its docstring:
# "Returns (x * sigmoid(x), cache)."


from npformer.functional.swiglu import silu_backward  # yours, its docstring:
# "dout (...) -> dx (...)."


def swiglu_forward(h):
    """h (..., 2F) -> (silu(gate) * up (..., F), cache)."""
    f = h.shape[-1] // 2
    gate, up = h[..., :f], h[..., f:]
    act, silu_cache = silu_forward(gate)
    return act * up, (act, up, silu_cache)


def swiglu_backward(dout, cache):
    """dout (..., F) -> dh (..., 2F) = [d gate | d up]."""
    act, up, silu_cache = cache
    # --- your code ---
    return np.concatenate([silu_backward(dout * up, silu_cache), dout * act], axis=-1)
    # --- end of your code ---
