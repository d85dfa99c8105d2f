"""Token embedding module (math in npformer.functional.embedding)."""
import math

import numpy as np

from ..backend import ops
from .init import drawing_nothing, normal
from .module import Module, Parameter


class Embedding(Module):
    """out = scale * weight[ids]; ``scale`` is sqrt(d_model) in the Transformer.

    The row ``padding_idx`` starts at zero and never receives a gradient.
    Shape: ids (B, T) int -> (B, T, D). Parameter: weight (num_embeddings, D).
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, scale=1.0, *, rng,
                 dtype=np.float32):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.scale = padding_idx, scale
        # std d^-1/2, so that the scaled vectors (scale = sqrt(d)) have unit variance per entry
        w = normal(rng, (num_embeddings, embedding_dim), 1.0 / math.sqrt(embedding_dim), dtype)
        if padding_idx is not None and not drawing_nothing():
            w[padding_idx] = 0
        self.weight = Parameter(w)
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, ids):
        self._ops = ops()
        out, self._cache = self._ops.embedding_forward(ids, self.weight.data, self.scale)
        return out

    def backward(self, dout):
        if self.weight.grad is None:            # frozen (npformer.lora): no scatter-add
            return
        into = getattr(self._ops, "embedding_backward_into", None)   # the kernels': no (V, D) dw
        if into is not None:
            into(dout, self._cache, self.weight.grad, self.padding_idx)
        else:
            self.weight.grad += self._ops.embedding_backward(dout, self._cache, self.padding_idx)


class PositionEmbedding(Module):
    """Learned positions (GPT-2's ``wpe``): out = x + weight[start:start + T], one trained vector
    per position instead of the fixed sinusoidal table (math in npformer.functional.embedding).

    Shape: x (B, T, D) -> (B, T, D). Parameter: weight (max_len, D), N(0, std^2) at start.
    """

    def __init__(self, max_len, embedding_dim, std=0.02, *, rng, dtype=np.float32):
        super().__init__()
        self.max_len, self.embedding_dim = max_len, embedding_dim
        self.weight = Parameter(normal(rng, (max_len, embedding_dim), std, dtype))
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x, start=0):
        self._ops = ops()
        out, self._cache = self._ops.position_embedding_forward(x, self.weight.data, start)
        return out

    def backward(self, dout):
        """Adds dweight into .grad and returns dx (= dout)."""
        if self.weight.grad is None:            # frozen (npformer.lora)
            return dout
        dx, dw = self._ops.position_embedding_backward(dout, self._cache)
        self.weight.grad += dw
        return dx
