"""Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_."""
import math

import numpy as np

from .. import runtime
from ..validation import check_real
from .adam import check_model


def sum_of_squares(x):
    """x . x of a 1-D array, in its dtype, inside npformer's BLAS scope (one thread): a BLAS
    shares a dot product between its threads, and the partial sums' order would follow their
    number."""
    with runtime.blas_scope():
        return np.dot(x, x)


def grad_norm(model):
    """||g||, the L2 norm of every parameter's gradient at once (inf or NaN if one is not finite)."""
    check_model(model, "clip")
    if model.flat_grads is None:
        model.flatten_parameters()
    return float(np.sqrt(sum_of_squares(model.flat_grads)))


def clip_grad_norm(model, max_norm, norm=None):
    """Scale all gradients by min(1, max_norm / (||g|| + 1e-6)), ||g|| the L2 norm over every
    parameter at once (``norm``, where the caller has it: a data-parallel run computes it in its
    exchange, see ``npformer.training.collective``). Returns the norm before clipping: inf or NaN
    when a gradient is not finite (the gradients are then left as they are; the training loop
    stops on it)."""
    check_real("max_norm", max_norm, minimum=0, min_open=True)
    total = grad_norm(model) if norm is None else float(norm)
    coef = max_norm / (total + 1e-6)
    if math.isfinite(total) and coef < 1.0:      # a non-finite norm is reported, not scaled in
        model.flat_grads *= coef
    return total
