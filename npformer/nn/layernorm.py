"""LayerNorm module (math in npformer.functional.layernorm)."""
import numpy as np

from ..backend import ops
from .init import ones, zeros
from .module import Module, Parameter


class LayerNorm(Module):
    """Shape: (..., D) -> (..., D). Parameters: weight (D,) = 1, bias (D,) = 0 at start."""

    def __init__(self, d_model, eps=1e-5, *, dtype=np.float32):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(ones(d_model, dtype))
        self.bias = Parameter(zeros(d_model, dtype))
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x):
        self._ops = ops()
        y, self._cache = self._ops.layernorm_forward(x, self.weight.data, self.bias.data, self.eps)
        return y

    def fuses_add(self, x, y):
        """Whether :meth:`add_forward` takes x + y: operands of one shape and dtype, and a
        backend that sums and normalises in one pass (the kernels' ``add_layernorm_forward``)."""
        return (x.shape == y.shape and x.dtype == y.dtype
                and hasattr(ops(), "add_layernorm_forward"))

    def add_forward(self, x, y):
        """LN(x + y) in one pass (see :meth:`fuses_add`), with the bits and the cache of
        :meth:`forward` on the sum: :meth:`backward` follows either."""
        self._ops = ops()
        out, self._cache = self._ops.add_layernorm_forward(x, y, self.weight.data,
                                                           self.bias.data, self.eps)
        return out

    def backward(self, dy):
        dx, dgamma, dbeta = self._ops.layernorm_backward(dy, self._cache)
        if self.weight.grad is not None:             # None: frozen (npformer.lora)
            self.weight.grad += dgamma
        if self.bias.grad is not None:
            self.bias.grad += dbeta
        return dx
