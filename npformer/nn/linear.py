"""Linear layer module (owns weight and bias; math in npformer.functional.linear)."""
import numpy as np

from ..backend import ops
from .init import xavier_uniform, zeros
from .module import Module, Parameter


class Linear(Module):
    """y = x W^T + b.

    Shape: input (..., in_features) -> output (..., out_features).
    Parameters: weight (out_features, in_features), bias (out_features,).
    """

    def __init__(self, in_features, out_features, bias=True, *, rng, dtype=np.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(xavier_uniform(rng, (out_features, in_features), dtype))
        self.bias = Parameter(zeros(out_features, dtype)) if bias else None
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x):
        self._ops = ops()
        y, self._cache = self._ops.linear_forward(x, self.weight.data,
                                          None if self.bias is None else self.bias.data)
        return y

    def backward(self, dy):
        """Adds dW, db into .grad (in place) and returns dx."""
        return self._ops.linear_backward_accumulate(dy, self._cache, self.weight.grad,
                                                    None if self.bias is None else self.bias.grad)
