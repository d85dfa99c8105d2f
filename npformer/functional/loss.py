"""Softmax cross-entropy with ``ignore_index`` and ``label_smoothing``, defined exactly as
``torch.nn.functional.cross_entropy(..., reduction="mean")``.

Derivation: docs/backprop.md#cross-entropy.
"""
import numpy as np


def log_softmax(logits):
    """log p = z - max z - log sum exp(z - max z), over the last axis."""
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def top_log_softmax(logits, n, offset=None):
    """The ``n`` best next tokens of every row, by log-probability in float64, as a search
    reads them: ids (R, n) best first and their log-probabilities (R, n).

    logits (R, V) -> log p = log_softmax(float64(logits)) (R, V); the rows are ranked by
    ``offset[r] + log p[r, c]`` (offset (R,) float64, e.g. a beam's running scores; None: by
    log p alone), ties by the lower id. Greedy search takes n = 1, beam search n = 2K with its
    scores as offset. (The Numba twin gives the same bits without the (R, V) float64 arrays.)
    """
    logp = log_softmax(logits.astype(np.float64))                       # (R, V)
    key = logp if offset is None else offset[:, None] + logp
    ids = np.argsort(-key, axis=-1, kind="stable")[:, :n]               # best first, ties by id
    return ids, np.take_along_axis(logp, ids, axis=-1)


def cross_entropy_forward(logits, targets, ignore_index=-100, label_smoothing=0.0):
    """Mean over non-ignored positions of

        (1 - eps) * (-log p[target]) + eps * mean_k(-log p[k])

    (the smoothed target puts 1 - eps + eps/V on the true class and eps/V on every class).
    Shape: logits (N, V), targets (N,) int -> scalar loss. If every target is ignored the loss
    is 0 and so is the gradient (PyTorch returns NaN there).
    """
    n, vocab = logits.shape
    logp = log_softmax(logits)                                # (N, V)
    valid = targets != ignore_index                           # (N,)
    count = int(valid.sum())
    safe_targets = np.where(valid, targets, 0)
    nll = -logp[np.arange(n), safe_targets]                   # (N,)
    per_token = (1.0 - label_smoothing) * nll
    if label_smoothing:
        per_token = per_token - label_smoothing * logp.mean(axis=-1)
    loss = float((per_token * valid).sum() / count) if count else 0.0
    return loss, (logp, safe_targets, valid, count, label_smoothing)


def cross_entropy_backward(dout, cache):
    """dL/dz = (softmax(z) - q) / count on non-ignored rows, 0 on ignored rows,
    with q = (1 - eps) * onehot(target) + eps / V, times ``dout``: the scalar gradient reaching
    the loss (1.0 when the loss itself is minimised)."""
    logp, safe_targets, valid, count, eps = cache
    n, vocab = logp.shape
    if count == 0:
        return np.zeros_like(logp)
    grad = np.exp(logp)                                       # softmax, (N, V)
    if eps:
        grad -= eps / vocab
    grad[np.arange(n), safe_targets] -= 1.0 - eps
    grad *= (valid * (dout / count))[:, None].astype(grad.dtype)
    return grad
