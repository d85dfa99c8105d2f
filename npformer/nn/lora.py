"""The trained half of a LoRA layer (math in npformer.functional.lora), and the two helpers its
hosts call: a projection (``Linear``, the attention's fused ``in_proj_weight``) adds each of its
adapters' updates into the adapter's rows of its output, and its backward skips dW when its
weight is frozen.

``npformer.lora.apply`` builds these and attaches them; docs/backprop.md#lora derives them.
"""
import math

import numpy as np

from ..backend import ops
from .init import zeros
from .module import Module, Parameter


class LoRA(Module):
    """delta = (alpha / r) * dropout(x) A^T B^T, added to rows ``start:stop`` of a frozen
    projection's output (PEFT's ``lora_A`` and ``lora_B``).

    Shape: x (..., in_features) -> delta (..., stop - start). Parameters: A (r, in_features),
    drawn as PEFT draws ``lora_A`` (U(-1/sqrt(in), 1/sqrt(in)), PyTorch's kaiming_uniform with
    a = sqrt(5)); B (stop - start, r), zero, so the model starts as its base. ``rng`` draws A;
    ``dropout_rng`` (the model's) the dropout masks. ``target``: the name it was asked for
    (PEFT's ``q_proj``, or npformer's ``in_proj``), for messages and exports. ``merged``:
    its update is in the host's weight (``npformer.lora.merge``); it then adds nothing, and
    ``kept`` holds the host's rows as they were, which ``npformer.lora.unmerge`` puts back.
    """

    def __init__(self, in_features, start, stop, rank, alpha, dropout=0.0, *, rng, dropout_rng,
                 dtype=np.float32, target=None):
        super().__init__()
        self.in_features, self.start, self.stop = in_features, start, stop
        self.rank, self.alpha, self.dropout = rank, alpha, dropout
        self.scaling = alpha / rank
        self.target = target
        self.weight_name = None          # the host weight's parameter name (npformer.lora.apply)
        bound = 1.0 / math.sqrt(in_features)
        self.A = Parameter(rng.uniform(-bound, bound, size=(rank, in_features)).astype(dtype))
        self.B = Parameter(zeros((stop - start, rank), dtype))
        self.rng = dropout_rng
        self.merged = False
        self.kept = None                 # the host's rows before merge, while merged
        self._cache = None
        self._ops = None

    @property
    def rows(self):
        return slice(self.start, self.stop)

    def delta_weight(self):
        """(alpha / r) B A, (stop - start, in_features): what ``merge`` adds to the host's rows."""
        return (self.B.data @ self.A.data) * self.B.data.dtype.type(self.scaling)

    def forward(self, x):
        self._ops = ops()                # its products run as the backend runs every product
        delta, self._cache = self._ops.adapter_forward(
            x, self.A.data, self.B.data, self.scaling, self.dropout, self.rng, self.training)
        return delta

    def backward(self, ddelta):
        """Adds dA, dB into .grad (where trained) and returns dx."""
        dx, da, db = self._ops.adapter_backward(ddelta, self._cache)
        if self.A.grad is not None:
            self.A.grad += da
        if self.B.grad is not None:
            self.B.grad += db
        return dx


def add_adapters(y, x, adapters, offset=0):
    """y (..., rows) += each adapter's update of x, in its rows (shifted by ``offset``: the
    first row of the weight that y's product used). Merged adapters are in the weight already;
    one asked to train is refused (its A and B would get no gradient)."""
    for lora in adapters:
        if lora.merged:
            if lora.training:
                raise ValueError(f"LoRA {lora.target}: merged into the base weights; "
                                 f"npformer.lora.unmerge(model) before training")
            continue
        y[..., lora.start - offset:lora.stop - offset] += lora.forward(x)
    return y


def projection_backward(f, dy, cache, w_grad, b_grad=None, adapters=(), offset=0):
    """dx of a projection y = x W^T + b plus its adapters, given dy (..., rows) and the
    forward's ``cache`` (backend ``f``'s ``linear_forward``). A trained W (``w_grad`` not None)
    gets dW added into ``w_grad``; a frozen one (None) costs dX = dY W alone, no dY^T X; the
    bias likewise. Each adapter gets its rows of dy and adds its share of dx."""
    if w_grad is not None:
        dx = f.linear_backward_accumulate(dy, cache, w_grad, b_grad)
    else:
        dx = f.linear_input_backward(dy, cache)      # dX = dY W, no dW product
        if b_grad is not None:
            b_grad += dy.reshape(-1, dy.shape[-1]).sum(axis=0)
    for lora in adapters:
        if not lora.merged:
            dx += lora.backward(dy[..., lora.start - offset:lora.stop - offset])
    return dx
