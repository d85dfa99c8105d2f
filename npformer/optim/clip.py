"""Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_."""
import numpy as np


def clip_grad_norm(model, max_norm):
    """Scale all gradients by min(1, max_norm / (||g|| + 1e-6)), ||g|| the L2 norm over every
    parameter at once. Returns the norm before clipping."""
    if max_norm <= 0:
        raise ValueError(f"max_norm: expected a positive number, got {max_norm}")
    if model.flat_grads is None:
        model.flatten_parameters()
    grads = model.flat_grads
    total = float(np.sqrt(np.dot(grads, grads)))
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        grads *= coef
    return total
