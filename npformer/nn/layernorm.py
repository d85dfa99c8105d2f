"""LayerNorm module (math in npformer.functional.layernorm)."""
import numpy as np

from .. import functional as F
from .module import Module, Parameter


class LayerNorm(Module):
    """Shape: (..., D) -> (..., D). Parameters: weight (D,) = 1, bias (D,) = 0 at start."""

    def __init__(self, d_model, eps=1e-5, *, dtype=np.float32):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(np.ones(d_model, dtype=dtype))
        self.bias = Parameter(np.zeros(d_model, dtype=dtype))
        self._cache = None

    def forward(self, x):
        y, self._cache = F.layernorm_forward(x, self.weight.data, self.bias.data, self.eps)
        return y

    def backward(self, dy):
        dx, dgamma, dbeta = F.layernorm_backward(dy, self._cache)
        self.weight.grad += dgamma
        self.bias.grad += dbeta
        return dx
