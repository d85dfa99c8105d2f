"""Linear layer module (owns weight and bias; math in npformer.functional.linear)."""
import numpy as np

from ..backend import ops
from .init import xavier_uniform, zeros
from .lora import add_adapters, projection_backward
from .module import Module, Parameter


class Linear(Module):
    """y = x W^T + b.

    Shape: input (..., in_features) -> output (..., out_features).
    Parameters: weight (out_features, in_features), bias (out_features,).
    ``adapters``: the LoRA updates ``npformer.lora.apply`` attached (each adds to its rows of
    y); a frozen weight (``npformer.lora``) gets no dW: its backward is dX = dY W alone.
    """

    def __init__(self, in_features, out_features, bias=True, *, rng, dtype=np.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(xavier_uniform(rng, (out_features, in_features), dtype))
        self.bias = Parameter(zeros(out_features, dtype)) if bias else None
        self.adapters = []
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x):
        self._ops = ops()
        y, self._cache = self._ops.linear_forward(x, self.weight.data,
                                          None if self.bias is None else self.bias.data)
        return add_adapters(y, x, self.adapters) if self.adapters else y

    def relu_forward(self, x):
        """relu(x W^T + b) with the ReLU applied in the product's cells, on a backend that has
        ``linear_relu_forward`` (the kernels; a feed-forward block in eval mode asks): the bits
        of :meth:`forward` then the backend's ReLU. Returns (a, the activation's cache for
        ``activation_dropout_backward``); :meth:`backward` works after it as after forward."""
        if self.adapters:
            raise ValueError("relu_forward: expected a layer without adapters (they add to the "
                             f"pre-activation), got {len(self.adapters)}")
        self._ops = ops()
        a, (self._cache, act_cache) = self._ops.linear_relu_forward(
            x, self.weight.data, None if self.bias is None else self.bias.data)
        return a, act_cache

    def backward(self, dy):
        """Adds dW, db into .grad (in place, where trained) and returns dx."""
        return projection_backward(self._ops, dy, self._cache, self.weight.grad,
                                   None if self.bias is None else self.bias.grad, self.adapters)
