"""Fused softmax cross-entropy with ignore_index and label smoothing, as
:mod:`npformer.functional.loss` (docs/backprop.md#cross-entropy).

The reference materialises log p, exp(log p) and the gradient: three (N, V) arrays (~45 MB each
at N = 1920, V = 5893). Here the forward keeps one number per row (log-sum-exp) and the backward
writes the gradient straight into the one (N, V) array it returns.

Both passes are row-parallel kernels. The forward takes each row while it sits in L2: its
maximum (eight running maxima, which vectorise), its sum (for label smoothing's mean) and the
sum of exp(z - max); the backward writes (softmax - q) * factor. float32 rows use the
vectorisable ``_fastexp.exp32`` (rows of V ~ 6000 are long vector loops); float64 rows use
``math.exp``.
"""
import math

import numpy as np
from numba import prange

from npformer.aligned import empty_aligned

from ._fastexp import exp32
from ._jit import kernel
from .attention import _row_max
from npformer.functional.loss import log_softmax  # noqa: F401  (same public names as the reference)

@kernel(parallel=True)
def _row_stats(z, fast_exp, with_sum, row_max, sum_exp, row_sum):
    """Per row r of z (N, V): row_max[r] = max_c z[r, c], sum_exp[r] = sum_c exp(z[r, c] -
    row_max[r]) and, if ``with_sum``, row_sum[r] = sum_c z[r, c]. One task per row: the row is
    read from memory once and then from cache."""
    n, vocab = z.shape
    for r in prange(n):
        row = z[r]
        m = _row_max(row, vocab, -np.inf)
        acc = m - m                                          # 0 in the dtype of z
        if fast_exp:
            for c in range(vocab):
                acc += exp32(row[c] - m)
        else:
            for c in range(vocab):
                acc += math.exp(row[c] - m)
        row_max[r] = m
        sum_exp[r] = acc
        if with_sum:
            total = m - m
            for c in range(vocab):
                total += row[c]
            row_sum[r] = total


@kernel(parallel=True)
def _grad_rows(z, lse, targets, valid, smooth, on_target, factor, fast_exp, grad):
    """grad = (softmax(z) - q) * factor on valid rows, 0 on ignored rows; softmax = exp(z - lse),
    q = smooth everywhere plus on_target at the target."""
    n, vocab = z.shape
    zero = factor - factor
    for r in prange(n):
        if valid[r]:
            l = lse[r]
            if fast_exp:
                for c in range(vocab):
                    grad[r, c] = (exp32(z[r, c] - l) - smooth) * factor
            else:
                for c in range(vocab):
                    grad[r, c] = (math.exp(z[r, c] - l) - smooth) * factor
            grad[r, targets[r]] -= on_target * factor
        else:
            for c in range(vocab):
                grad[r, c] = zero


def cross_entropy_forward(logits, targets, ignore_index=-100, label_smoothing=0.0):
    """Mean over non-ignored rows of (1 - eps) * (-log p[target]) + eps * mean_k(-log p[k]).

    Shape: logits (N, V), targets (N,) int -> scalar loss. Loss and gradient are 0 when every
    target is ignored.
    """
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits, targets: expected shapes (N, V) and (N,), got {logits.shape} "
                         f"and {targets.shape}")
    n, vocab = logits.shape
    logits = np.ascontiguousarray(logits)
    valid = targets != ignore_index                           # (N,)
    safe_targets = np.where(valid, targets, 0).astype(np.int64)
    if n and (safe_targets.min() < 0 or safe_targets.max() >= vocab):
        raise ValueError(f"targets: expected class ids in [0, {vocab}) or ignore_index, got "
                         f"{safe_targets.min()}..{safe_targets.max()}")
    count = int(valid.sum())
    row_max, sum_exp, row_sum = (np.empty(n, dtype=logits.dtype) for _ in range(3))
    if n:
        _row_stats(logits, logits.dtype == np.float32, bool(label_smoothing), row_max, sum_exp,
                   row_sum)
    lse = row_max + np.log(sum_exp)                           # (N,) log-sum-exp
    nll = lse - logits[np.arange(n), safe_targets]            # -log p[target]
    per_row = (1.0 - label_smoothing) * nll.astype(np.float64)
    if label_smoothing:
        mean_z = row_sum / vocab                              # mean_k(-log p_k) = lse - mean_k z_k
        per_row += label_smoothing * (lse - mean_z)
    loss = float(per_row[valid].sum() / count) if count else 0.0
    return loss, (logits, lse, safe_targets, valid, count, float(label_smoothing))


def cross_entropy_backward(dloss, cache):
    """dL/dz = (softmax(z) - q) * dloss / count on non-ignored rows, 0 on ignored rows. (N, V)."""
    logits, lse, safe_targets, valid, count, eps = cache
    grad = empty_aligned(logits.shape, logits.dtype)         # large: from npformer's pool
    if count == 0:
        grad.fill(0)
        return grad
    vocab = logits.shape[1]
    dt = logits.dtype.type
    _grad_rows(logits, lse, safe_targets, valid, dt(eps / vocab), dt(1.0 - eps), dt(dloss / count),
               logits.dtype == np.float32, grad)
    return grad
