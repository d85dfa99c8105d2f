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
import threading

import numpy as np
from numba import prange

from npformer import runtime
from npformer.aligned import empty_aligned

from ._fastexp import exp32
from ._jit import kernel
from ._rows import row_max as _row_max
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


def cross_entropy_backward(dout, cache):
    """dL/dz = (softmax(z) - q) * dout / count on non-ignored rows, 0 on ignored rows. (N, V).
    ``dout`` is the scalar gradient reaching the loss (1.0 when the loss itself is minimised)."""
    logits, lse, safe_targets, valid, count, eps = cache
    grad = empty_aligned(logits.shape, logits.dtype)         # large: from npformer's pool
    if count == 0:
        grad.fill(0)
        return grad
    vocab = logits.shape[1]
    dt = logits.dtype.type
    _grad_rows(logits, lse, safe_targets, valid, dt(eps / vocab), dt(1.0 - eps), dt(dout / count),
               logits.dtype == np.float32, grad)
    return grad


@kernel(fastmath=False)
def _top_rows(x, row_max, lse, offset, ids, logp):
    """For each row r of x (R, V): the ids (R, n) and log-probabilities (R, n) of the n best
    entries by key = offset[r] + ((x[r, c] - row_max[r]) - lse[r]), computed in float64 in the
    reference's order of operations (no fastmath: no reassociation), best first, ties by the
    lower id. offset (R,) or (0,): none.

    One pass over the row keeps the n best so far, sorted; the key never decreases as x grows,
    so an entry below the n-th best's x cannot enter and is skipped on one comparison."""
    n_rows, vocab = x.shape
    n = ids.shape[1]
    with_offset = offset.shape[0] > 0
    keys = np.empty(n)                                       # a row's n best keys, best first
    for r in range(n_rows):
        m, l = row_max[r], lse[r]
        s = offset[r] if with_offset else 0.0
        held = 0                                             # entries in keys so far
        floor = x[r, 0]                                      # x of the n-th best (when held == n)
        for c in range(vocab):
            xc = x[r, c]
            if held == n and xc < floor:
                continue
            lp = (np.float64(xc) - m) - l
            key = s + lp if with_offset else lp
            if held == n and not key > keys[n - 1]:          # equal keys: the lower id stays
                continue
            j = held if held < n else n - 1                  # insert, after any equal key
            while j > 0 and keys[j - 1] < key:
                keys[j], ids[r, j], logp[r, j] = keys[j - 1], ids[r, j - 1], logp[r, j - 1]
                j -= 1
            keys[j], ids[r, j], logp[r, j] = key, c, lp
            if held < n:
                held += 1
            if held == n:
                floor = x[r, ids[r, n - 1]]


TOP_PART_ROWS = 32               # rows per part of top_log_softmax (fixed: the bits never depend
                                 # on the parts, which only share the rows between the workers)
_part_scratch = threading.local()    # each worker's float64 rows of a part, reused


def _scratch_rows(rows, cols):
    """A (rows, cols) float64 array of this thread's own, reused from call to call (a part's
    rows are too large to come from the allocator's free lists: each would be mapped afresh)."""
    buf = getattr(_part_scratch, "buf", None)
    if buf is None or buf.size < rows * cols:
        buf = _part_scratch.buf = np.empty(rows * cols)
    return buf[:rows * cols].reshape(rows, cols)


def top_log_softmax(logits, n, offset=None):
    """The ``n`` best next tokens of every row and their float64 log-probabilities, as the
    reference (:func:`npformer.functional.top_log_softmax`), bit for bit, without its (R, V)
    float64 arrays of log-probabilities and keys.

    The log-normaliser of each row is the reference's own NumPy arithmetic (the same exp and the
    same pairwise sum give the same bits); the selection is one Numba pass over the logits
    (:func:`_top_rows`) that computes the float64 key only for entries that may enter. Both run
    on parts of ``TOP_PART_ROWS`` rows, which the runtime's workers share (NumPy releases the
    GIL in its loops, the kernel is ``nogil``) and whose float64 rows stay in cache from the
    subtraction to the sum. (The Numba backend's decoder states call its fast path,
    ``top_log_softmax_bounded`` in kernels/bounded_top.py, unless built with ``exact=True``.)"""
    x = np.ascontiguousarray(logits)                                   # (R, V)
    n_rows, vocab = x.shape
    n = min(int(n), vocab)
    ids = np.empty((n_rows, n), dtype=np.int64)
    logp = np.empty((n_rows, n), dtype=np.float64)
    offset = None if offset is None else np.ascontiguousarray(offset, dtype=np.float64)
    no_offset = np.empty(0)

    def part(r0):
        rows = slice(r0, min(r0 + TOP_PART_ROWS, n_rows))
        xs = x[rows]
        row_max = xs.max(axis=-1, keepdims=True).astype(np.float64)    # (r, 1), exact
        z = np.subtract(xs, row_max, out=_scratch_rows(*xs.shape))     # z = x - max x, float64
        lse = np.log(np.exp(z, out=z).sum(axis=-1))                    # (r,) log sum exp(z)
        _top_rows(xs, row_max[:, 0], lse,
                  no_offset if offset is None else offset[rows], ids[rows], logp[rows])
    if n:
        runtime.run_parts(part, range(0, n_rows, TOP_PART_ROWS))
    return ids, logp
