"""Dropout module: active in train mode, identity in eval mode."""
from .. import functional as F
from .module import Module


class Dropout(Module):
    """Inverted dropout with probability ``p``, drawing from the model's shared generator."""

    def __init__(self, p, *, rng):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {p}")
        self.p, self.rng = p, rng
        self._cache = None

    def forward(self, x):
        out, self._cache = F.dropout_forward(x, self.p, self.rng, self.training)
        return out

    def backward(self, dout):
        return F.dropout_backward(dout, self._cache)
