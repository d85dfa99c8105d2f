"""RMSNorm module (math in npformer.functional.rmsnorm)."""
import numpy as np

from ..backend import ops
from .init import ones
from .module import Module, Parameter


class RMSNorm(Module):
    """Shape: (..., D) -> (..., D). Parameter: weight (D,) = 1 at start (no bias)."""

    def __init__(self, d_model, eps=1e-6, *, dtype=np.float32):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(ones(d_model, dtype))
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x):
        self._ops = ops()
        y, self._cache = self._ops.rmsnorm_forward(x, self.weight.data, self.eps)
        return y

    def backward(self, dout):
        dx, dgamma = self._ops.rmsnorm_backward(dout, self._cache)
        if self.weight.grad is not None:             # None: frozen (npformer.lora)
            self.weight.grad += dgamma
        return dx
