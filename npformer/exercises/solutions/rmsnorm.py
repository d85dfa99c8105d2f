"""Exercise: RMSNorm over the last axis (Llama, Qwen, Mistral): LayerNorm without the mean and
without the shift.

Derivation: docs/backprop.md#rmsnorm (section "RMSNorm").

y = gamma * x * r, r = 1 / sqrt(mean(x^2) + eps), the mean over the last axis.
Shapes: x (..., D), gamma (D,) -> y (..., D); the cache holds xhat = x * r (..., D),
rstd = r (..., 1), gamma and x's dtype.
Write ``rmsnorm_backward``: given dout (..., D), return dx (..., D) and dgamma (D,).

Simplify (after 5a, rmsnorm_staged, which takes the same backward one intermediate at a time):
substitute its lines into one another until dx is one expression in xhat, rstd and
g = dout * gamma, with no dms or dsq left.
"""
import numpy as np


from npformer.functional.rmsnorm import rmsnorm_forward  # given, its docstring:
# "Returns (y, cache). A half-precision x is normalised in float32 (Hugging Face's order)."


from npformer.functional.rmsnorm import rmsnorm_backward  # yours, its docstring:
# "dout (..., D) -> dx (..., D) of x's dtype, dgamma (D,) of gamma's."
