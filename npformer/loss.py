"""The public loss: ``loss, dlogits = nf.cross_entropy(logits, targets, ...)``."""
import numpy as np

from .backend import ops


def cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.0):
    """Softmax cross-entropy, mean over targets != ignore_index, as torch.nn.functional.cross_entropy.

    Returns the loss (a float) and its gradient with respect to ``logits`` (same shape), ready for
    ``model.backward``. Shape: logits (..., V), targets (...) int.
    """
    logits = np.asarray(logits)
    targets = np.asarray(targets)
    if logits.ndim < 2:
        raise ValueError(f"logits: expected shape (..., V) with at least 2 dims, got {logits.shape}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets: expected shape {logits.shape[:-1]} (logits without the last "
                         f"axis), got {targets.shape}")
    if not np.issubdtype(targets.dtype, np.integer):
        raise ValueError(f"targets: expected an integer dtype, got {targets.dtype}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing: expected a number in [0, 1], got {label_smoothing}")
    vocab = logits.shape[-1]
    real = targets[targets != ignore_index]
    if real.size and (real.min() < 0 or real.max() >= vocab):
        bad = real.min() if real.min() < 0 else real.max()
        raise ValueError(f"targets: expected class ids in [0, {vocab}) or ignore_index="
                         f"{ignore_index}, found {bad}")
    flat_logits = logits.reshape(-1, vocab)                       # (N, V)
    f = ops()                                                     # NumPy reference or Numba kernel
    loss, cache = f.cross_entropy_forward(flat_logits, targets.reshape(-1), ignore_index,
                                          label_smoothing)
    return loss, f.cross_entropy_backward(1.0, cache).reshape(logits.shape)
