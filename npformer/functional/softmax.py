"""Softmax over the last axis with a boolean mask, safe for rows where every entry is masked.

Derivation: docs/backprop.md#softmax.
"""
import numpy as np


def softmax_forward(scores, mask=None):
    """p = exp(s - max s) / sum exp(s - max s) over the last axis, masked entries excluded.

    ``mask`` is boolean, broadcastable to ``scores``, True where the entry takes part. Masked
    entries get probability exactly 0 (they are set to -inf, never to a "small" number, which
    would leak probability). A row whose entries are all masked gives all zeros, not NaN.
    Shape: scores (..., K) -> p (..., K). Returns ``(p, cache)``; the cache is p itself, all
    the backward needs.
    """
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)              # (..., 1)
    row_max[~np.isfinite(row_max)] = 0.0                      # all-masked rows: avoid -inf - -inf
    e = np.exp(scores - row_max)
    total = e.sum(axis=-1, keepdims=True)
    total[total == 0] = 1.0                                   # all-masked rows: 0 / 1 = 0
    e /= total
    return e, e


def softmax_backward(dout, cache):
    """For p = softmax(s) (``cache`` is p, ``dout`` is dp): ds_i = p_i (dp_i - sum_j dp_j p_j).

    The Jacobian is diag(p) - p p^T; multiplying it by dp gives the line above. Masked entries
    have p = 0 and therefore get zero gradient, and all-zero rows stay zero.
    """
    p = cache
    return p * (dout - (dout * p).sum(axis=-1, keepdims=True))
