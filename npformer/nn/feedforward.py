"""Position-wise feed-forward network: linear2(dropout(activation(linear1(x))))."""
import numpy as np

from .. import functional as F
from .dropout import Dropout
from .linear import Linear
from .module import Module


class FeedForward(Module):
    """Shape: (B, T, D) -> (B, T, d_ff) -> (B, T, D), applied to every position alike."""

    def __init__(self, d_model, d_ff, dropout=0.0, activation="relu", *, rng, dtype=np.float32):
        super().__init__()
        if activation not in F.ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(F.ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.linear1 = Linear(d_model, d_ff, rng=rng, dtype=dtype)
        self.dropout = Dropout(dropout, rng=rng)
        self.linear2 = Linear(d_ff, d_model, rng=rng, dtype=dtype)
        self._act_cache = None

    def forward(self, x):
        act_forward, _ = F.ACTIVATIONS[self.activation]
        h = self.linear1.forward(x)                     # (B, T, d_ff)
        h, self._act_cache = act_forward(h)
        h = self.dropout.forward(h)
        return self.linear2.forward(h)                  # (B, T, D)

    def backward(self, dy):
        _, act_backward = F.ACTIVATIONS[self.activation]
        dh = self.linear2.backward(dy)
        dh = self.dropout.backward(dh)
        dh = act_backward(dh, self._act_cache)
        return self.linear1.backward(dh)
