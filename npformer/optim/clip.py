"""Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_."""
import math
import numbers

import numpy as np


def clip_grad_norm(model, max_norm):
    """Scale all gradients by min(1, max_norm / (||g|| + 1e-6)), ||g|| the L2 norm over every
    parameter at once. Returns the norm before clipping: inf or NaN when a gradient is not finite
    (the gradients are then left as they are; the training loop stops on it)."""
    if (isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real)
            or not (math.isfinite(max_norm) and max_norm > 0)):
        raise ValueError(f"max_norm: expected a finite positive number, got {max_norm!r}")
    if model.flat_grads is None:
        model.flatten_parameters()
    grads = model.flat_grads
    total = float(np.sqrt(np.dot(grads, grads)))
    coef = max_norm / (total + 1e-6)
    if math.isfinite(total) and coef < 1.0:      # a non-finite norm is reported, not scaled in
        grads *= coef
    return total
