"""Exercise: softmax cross-entropy with ignore_index and label smoothing, as
torch.nn.functional.cross_entropy(..., reduction="mean").

Derivation: docs/backprop.md#cross-entropy (section "Cross-entropy").

The loss is the mean over the rows whose target is not ``ignore_index`` of
(1 - eps) * (-log p[target]) + eps * mean_k(-log p[k]), p = softmax(logits), eps the smoothing.
Shapes: logits (N, V), targets (N,) integers -> a float loss. If every target is ignored the
loss is 0.
Write ``cross_entropy_backward``: given dout (the gradient reaching the loss, a number: 1.0 to
minimise the loss itself), return dlogits (N, V). Ignored rows get zero.

Simplify (after 11a, cross_entropy_staged, which takes the same backward one intermediate at a
time): substitute its lines into one another until dlogits is one expression in the softmax,
the targets, eps, valid and count, with no dlogp, dz or de left.
"""
import numpy as np

from npformer.functional import log_softmax


from npformer.functional.loss import cross_entropy_forward  # given, its docstring:
# "Returns (loss, cache)."


from npformer.functional.loss import cross_entropy_backward  # yours, its docstring:
# "dout (a number) -> dlogits (N, V)."
