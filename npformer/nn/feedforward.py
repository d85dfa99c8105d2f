"""Position-wise feed-forward network: linear2(dropout(activation(linear1(x))))."""
import numpy as np

from ..functional.activation_dropout import check_activation
from ..functional.swiglu import check_gated_activation
from ..backend import ops
from .dropout import check_probability
from .linear import Linear
from .module import Module


class FeedForward(Module):
    """Position-wise feed-forward: linear2(dropout(activation(linear1(x)))).

    Shape: (B, T, D) -> (B, T, d_ff) -> (B, T, D), applied to every position alike.
    ``bias``: whether the two linear layers add a bias (GPT-2's do, Llama's do not). A gated
    variant (``GatedFeedForward``) widens ``linear1`` to ``GATES`` x d_ff and replaces
    ``_activate`` and its backward; the rest is this class's."""

    GATES = 1                     # linear1's output, in units of d_ff

    def __init__(self, d_model, d_ff, dropout=0.0, activation="relu", bias=True, *, rng,
                 dtype=np.float32):
        super().__init__()
        if activation is not None:
            check_activation(activation)
        self.activation = activation
        self.linear1 = Linear(d_model, self.GATES * d_ff, bias=bias, rng=rng, dtype=dtype)
        # dropout after the activation, applied with it (one fused pass in the Numba backend);
        # train()/eval() switch it through self.training
        self.dropout = check_probability(dropout)
        self.rng = rng
        self.linear2 = Linear(d_ff, d_model, bias=bias, rng=rng, dtype=dtype)
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x):
        self._ops = ops()
        if self._relu_in_product():
            a, self._cache = self.linear1.relu_forward(x)   # (B, T, d_ff), one pass less
        else:
            h = self.linear1.forward(x)                 # (B, T, GATES d_ff)
            a, self._cache = self._activate(h)          # (B, T, d_ff)
        return self.linear2.forward(a)                  # (B, T, D)

    def _relu_in_product(self):
        """Whether the ReLU runs inside linear1's product, cell by cell (``Linear.relu_forward``,
        the same bits): in eval mode (no dropout), with ReLU, no adapters on linear1 (they add
        to the pre-activation), this class's activation, on a backend that offers it."""
        return (not self.training and self.activation == "relu" and not self.linear1.adapters
                and type(self)._activate is FeedForward._activate
                and hasattr(self._ops, "linear_relu_forward"))

    def backward(self, dout):
        return self.linear1.backward(self._activate_backward(self.linear2.backward(dout)))

    def _activate(self, h):
        return self._ops.activation_dropout_forward(h, self.activation, self.dropout, self.rng,
                                                    self.training)

    def _activate_backward(self, da):
        return self._ops.activation_dropout_backward(da, self._cache)


class GatedFeedForward(FeedForward):
    """The gated feed-forward: linear2(dropout(act(x W_gate) * (x W_up))), SwiGLU with
    ``activation`` "silu" (Llama's), GeGLU with "gelu" or "gelu_tanh" (Gemma's), ReGLU with
    "relu" (``functional.swiglu.GATED_ACTIVATIONS``).

    ``linear1`` fuses W_gate and W_up into one (2 d_ff, D) projection, its first d_ff rows the
    gate (Hugging Face's ``gate_proj`` and ``up_proj``, one product instead of two);
    ``linear2`` is ``down_proj``. ``bias``: whether the projections add one (Llama's do not).
    SiLU's gate runs through the backend's ``swiglu_*`` pair (the Numba backend fuses it), the
    others through ``gated_*`` (the reference's on every backend).
    Shape: (B, T, D) -> (B, T, 2 d_ff) -> (B, T, d_ff) -> (B, T, D).
    """

    GATES = 2

    def __init__(self, d_model, d_ff, dropout=0.0, activation="silu", bias=False, *, rng,
                 dtype=np.float32):
        check_gated_activation(activation)
        super().__init__(d_model, d_ff, dropout, None, bias, rng=rng, dtype=dtype)
        self.activation = activation
        self._fused = activation == "silu"         # (gated, silu): the fused SwiGLU pair

    def _activate(self, h):
        if self._fused:
            a, gate_cache = self._ops.swiglu_forward(h)                  # silu(gate) * up
        else:
            a, gate_cache = self._ops.gated_forward(h, self.activation)  # act(gate) * up
        a, drop_cache = self._ops.dropout_forward(a, self.dropout, self.rng, self.training)
        return a, (gate_cache, drop_cache)

    def _activate_backward(self, da):
        gate_cache, drop_cache = self._cache
        da = self._ops.dropout_backward(da, drop_cache)
        if self._fused:
            return self._ops.swiglu_backward(da, gate_cache)
        return self._ops.gated_backward(da, gate_cache)
