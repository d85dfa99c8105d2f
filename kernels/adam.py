"""One fused, in-place Adam/AdamW update over the flat parameter buffer.

Element for element the same operations, in the same order, as :meth:`npformer.optim.Adam.step`
(and torch.optim.Adam's single-tensor path), so float64 results agree to round-off; but one pass
over memory instead of about ten, with no temporaries. Compiled without fastmath.
"""
import numpy as np
from numba import prange

from ._jit import kernel


@kernel(parallel=True, fastmath=False)
def _adam_step(p, g, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, bias_c1, bias_c2_sqrt):
    step_size = lr / bias_c1
    for i in prange(p.shape[0]):
        gi = g[i]
        if weight_decay != 0.0:
            if decoupled:
                p[i] *= 1.0 - lr * weight_decay               # AdamW: shrink the weight first
            else:
                gi = gi + weight_decay * p[i]                 # Adam: L2 term in the gradient
        mi = m[i] + (1.0 - beta1) * (gi - m[i])               # m <- beta1 m + (1 - beta1) g
        vi = v[i] * beta2 + (1.0 - beta2) * gi * gi           # v <- beta2 v + (1 - beta2) g^2
        m[i] = mi
        v[i] = vi
        denom = np.sqrt(v[i]) / bias_c2_sqrt + eps
        p[i] -= step_size * (m[i] / denom)


def adam_step(params, grads, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,
              decoupled):
    """Update ``params``, ``exp_avg`` and ``exp_avg_sq`` (all (P,), one dtype) in place for step
    number ``step`` (1-based), given ``grads``."""
    arrays = (params, grads, exp_avg, exp_avg_sq)
    if any(a.ndim != 1 or a.shape != params.shape or a.dtype != params.dtype
           or not a.flags.c_contiguous for a in arrays):
        raise ValueError("adam_step: expected params, grads, exp_avg, exp_avg_sq as contiguous 1-D "
                         f"arrays of one shape and dtype, got {[(a.shape, a.dtype) for a in arrays]}")
    if step < 1:
        raise ValueError(f"step: expected a step number >= 1, got {step}")
    _adam_step(params, grads, exp_avg, exp_avg_sq, float(lr), float(beta1), float(beta2),
               float(eps), float(weight_decay), bool(decoupled), 1.0 - beta1 ** step,
               np.sqrt(1.0 - beta2 ** step))
