"""Dropout module: active in train mode, identity in eval mode."""
from ..backend import ops
from .module import Module


def check_probability(p):
    """p if it is a dropout probability in [0, 1), else ValueError."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: expected a probability in [0, 1), got {p}")
    return p


class Dropout(Module):
    """Inverted dropout with probability ``p``, drawing from the model's shared generator."""

    def __init__(self, p, *, rng):
        super().__init__()
        self.p, self.rng = check_probability(p), rng
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x):
        self._ops = ops()
        out, self._cache = self._ops.dropout_forward(x, self.p, self.rng, self.training)
        return out

    def backward(self, dout):
        return self._ops.dropout_backward(dout, self._cache)
