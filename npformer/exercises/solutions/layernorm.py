"""Exercise: layer normalisation over the last axis, as torch.nn.LayerNorm.

Derivation: docs/backprop.md#layernorm (section "LayerNorm").

y = gamma * (x - mu) / sqrt(var + eps) + beta, mu and var (biased) over the last axis.
Shapes: x (..., D), gamma (D,), beta (D,) -> y (..., D); the cache holds xhat (..., D),
rstd = 1 / sqrt(var + eps) (..., 1) and gamma.
Write ``layernorm_backward``: given dout (..., D), return dx (..., D), dgamma (D,), dbeta (D,).
Remember that mu and var depend on every x of the row.

Simplify (after 4a, layernorm_staged, which takes the same backward one intermediate at a time):
substitute its lines into one another until dx is one expression in xhat, rstd and
g = dout * gamma, with no dvar, dxc or dmu left, as CS231n's second batch-norm derivation does.
"""
import numpy as np


from npformer.functional.layernorm import layernorm_forward  # given, its docstring:
# "Returns (y, cache)."


from npformer.functional.layernorm import layernorm_backward  # yours, its docstring:
# "dout (..., D) -> dx (..., D), dgamma (D,), dbeta (D,)."
