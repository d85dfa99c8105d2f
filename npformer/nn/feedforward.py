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
