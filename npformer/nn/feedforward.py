"""Position-wise feed-forward network: linear2(dropout(activation(linear1(x))))."""
import numpy as np

from ..functional.activation_dropout import check_activation
from ..backend import ops
from .dropout import check_probability
from .linear import Linear
from .module import Module


class FeedForward(Module):
    """Shape: (B, T, D) -> (B, T, d_ff) -> (B, T, D), applied to every position alike."""

    def __init__(self, d_model, d_ff, dropout=0.0, activation="relu", bias=True, *, rng,
                 dtype=np.float32):
        """``bias``: whether the two linear layers add a bias (GPT-2's do, Llama's do not)."""
        super().__init__()
        check_activation(activation)
        self.activation = activation
        self.linear1 = Linear(d_model, d_ff, bias=bias, rng=rng, dtype=dtype)
        # dropout after the activation, applied with it by activation_dropout_forward (one fused
        # pass in the Numba backend); train()/eval() switch it through self.training
        self.dropout = check_probability(dropout)
        self.rng = rng
        self.linear2 = Linear(d_ff, d_model, bias=bias, rng=rng, dtype=dtype)
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x):
        self._ops = ops()
        h = self.linear1.forward(x)                     # (B, T, d_ff)
        h, self._cache = self._ops.activation_dropout_forward(
            h, self.activation, self.dropout, self.rng, self.training)
        return self.linear2.forward(h)                  # (B, T, D)

    def backward(self, dy):
        dh = self.linear2.backward(dy)                  # (B, T, d_ff)
        dh = self._ops.activation_dropout_backward(dh, self._cache)
        return self.linear1.backward(dh)                # (B, T, D)


class SwiGLUFeedForward(Module):
    """Llama's gated feed-forward: linear2(dropout(silu(x W_gate) * (x W_up))).

    ``linear1`` fuses W_gate and W_up into one (2 d_ff, D) projection, its first d_ff rows the
    gate (Hugging Face's ``gate_proj`` and ``up_proj``, one product instead of two);
    ``linear2`` is ``down_proj``. ``bias``: whether the projections add one (Llama's do not).
    Shape: (B, T, D) -> (B, T, 2 d_ff) -> (B, T, d_ff) -> (B, T, D).
    """

    def __init__(self, d_model, d_ff, dropout=0.0, bias=False, *, rng, dtype=np.float32):
        super().__init__()
        self.linear1 = Linear(d_model, 2 * d_ff, bias=bias, rng=rng, dtype=dtype)
        self.dropout = check_probability(dropout)
        self.rng = rng
        self.linear2 = Linear(d_ff, d_model, bias=bias, rng=rng, dtype=dtype)
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x):
        self._ops = ops()
        h = self.linear1.forward(x)                     # (B, T, 2 d_ff): [gate | up]
        a, swiglu_cache = self._ops.swiglu_forward(h)   # (B, T, d_ff)
        a, drop_cache = self._ops.dropout_forward(a, self.dropout, self.rng, self.training)
        self._cache = (swiglu_cache, drop_cache)
        return self.linear2.forward(a)                  # (B, T, D)

    def backward(self, dout):
        swiglu_cache, drop_cache = self._cache
        da = self._ops.dropout_backward(self.linear2.backward(dout), drop_cache)
        return self.linear1.backward(self._ops.swiglu_backward(da, swiglu_cache))
