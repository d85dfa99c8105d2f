"""Exercise: one Adam (or AdamW) update, in place, as torch.optim.Adam / AdamW. Not a backward:
it is checked against npformer's own update, to 1e-12.

Derivation: docs/backprop.md#adam (section "Adam").

p, g, m, v: arrays of one shape (the parameters, their gradient, the two running averages, 0
at the start); t: the step number, 1 at the first update; lr, beta1, beta2, eps,
weight_decay: numbers; decoupled: True for AdamW (p <- p (1 - lr wd) first), False for Adam
(g <- g + wd p). Write ``adam_step``: update p, m and v in place (g stays as it is), in this
order: m <- beta1 m + (1 - beta1) g; v <- beta2 v + (1 - beta2) g^2; then p moves by
lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
"""
import math

import numpy as np


def adam_step(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay, decoupled):
    """Updates p, m, v in place; returns nothing."""
    # --- your code ---
    if weight_decay != 0:
        if decoupled:
            p *= 1.0 - lr * weight_decay
        else:
            g = g + weight_decay * p
    m += (1.0 - beta1) * (g - m)
    v *= beta2
    v += (1.0 - beta2) * g * g
    step_size = lr / (1.0 - beta1 ** t)
    denom = np.sqrt(v)
    denom /= math.sqrt(1.0 - beta2 ** t)
    denom += eps
    p -= step_size * (m / denom)
    # --- end of your code ---
