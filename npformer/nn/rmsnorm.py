"""RMSNorm module (math in npformer.functional.rmsnorm)."""
import numpy as np

from ..backend import ops
from .init import ones
from .module import Module, Parameter


class RMSNorm(Module):
    """Shape: (..., D) -> (..., D). Parameter: weight (D,) = 1 at start (no bias).

    ``gain_offset``: the gain is ``gain_offset + weight`` (Gemma's norm: 1 + w, its weight
    starting at 0); the gradient of the weight is the gain's, the offset being a constant."""

    def __init__(self, d_model, eps=1e-6, *, dtype=np.float32, gain_offset=0.0):
        super().__init__()
        self.eps, self.gain_offset = eps, gain_offset
        self.weight = Parameter(ones(d_model, dtype))
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x):
        self._ops = ops()
        gain = self.weight.data + self.gain_offset if self.gain_offset else self.weight.data
        y, self._cache = self._ops.rmsnorm_forward(x, gain, self.eps)
        return y

    def backward(self, dout):
        dx, dgamma = self._ops.rmsnorm_backward(dout, self._cache)
        if self.weight.grad is not None:             # None: frozen (npformer.lora)
            self.weight.grad += dgamma
        return dx
