"""Scaled dot-product attention: batched matrix products through the measured dispatcher
(``matmul.matmul``: NumPy/BLAS or a Numba kernel, whichever is faster for the shape), and one
fused, head-parallel Numba pass for everything between them.

Same maths, names and shapes as :func:`npformer.functional.attention_forward` /
``attention_backward`` (see docs/backprop.md#attention). Measured (BENCHMARKS.md): a batched
``np.matmul`` over B*H heads of (T, 32) x (32, T) runs at 50-90 GFLOP/s on one core (NumPy hands
each head to BLAS with little overhead), faster than hand-written per-head tile products in Numba
(~10 GFLOP/s: loops of 16-64 iterations are mostly loop overhead). What the reference does slowly
is the element-wise work between the products: ``np.where`` for the mask, max, exp, sum, divide,
dropout, and in backward five more passes. Here each of those is one pass over a row that stays
in L1: scale + mask + max + exp + normalise + dropout forward; dropout + softmax backward + scale
backward. float32 rows use a vectorisable ``exp`` (``_fastexp.exp32``); float64 keeps
``math.exp``, so the float64 path matches the reference to ~1e-15.

Outputs are written in (B, T, H, d) order and returned as (B, H, T, d) views, so ``merge_heads``
afterwards is a free reshape; :func:`attention_backward_into` writes dq, dk, dv straight into the
caller's buffers (the self-attention module passes three slices of one (B, T, 3D) array).
"""
import math

import numpy as np
from numba import prange

from ._fastexp import exp32
from ._jit import kernel
from .matmul import matmul


@kernel(parallel=True)
def _softmax_rows(s, mask, n_h, scale, neg_inf, fast_exp, keep, drop_scale, use_dropout, probs_d):
    """In place: s (B*H, Tq*Tk), each head's raw scores flattened -> softmax(scale * s) over the
    unmasked keys of each row.

    mask bool (B|1, H|1, Tq|1, Tk), True = may attend. Masked entries are exactly 0; a row with
    every key masked is all 0 (never NaN). With dropout, probs_d = probs * keep * drop_scale
    (keep, probs_d shaped as s). ``scale`` and ``neg_inf`` have the dtype of s, so float32 rows
    are computed in float32.

    Rows are only Tk ~ 16 long, too short for LLVM's vector loops (it vectorises 64 at a time and
    runs shorter loops scalar), so the one costly step, exp, runs over the whole head as a single
    flat loop. All loops start at 0 and index without division (both keep them vectorisable)."""
    n_bh, tq_tk = s.shape
    tk = mask.shape[3]
    tq = tq_tk // tk
    zero, one = scale - scale, scale / scale                 # 0 and 1 in the dtype of s
    for bh in prange(n_bh):
        head = s[bh]                                         # (Tq*Tk,) one head, contiguous
        mb = bh // n_h if mask.shape[0] > 1 else 0
        mh = bh % n_h if mask.shape[1] > 1 else 0
        m = mask[mb, mh]                                     # (Tq|1, Tk)
        mq = m.shape[0] > 1
        for i in range(tq):                                  # scale; subtract the unmasked max
            mi = i if mq else 0
            row_max = neg_inf
            for j in range(tk):
                x = head[i * tk + j] * scale
                x = x if m[mi, j] else neg_inf
                row_max = x if x > row_max else row_max
            if row_max == neg_inf:                           # all masked: the row becomes 0
                row_max = zero
            for j in range(tk):
                head[i * tk + j] = head[i * tk + j] * scale - row_max
        if fast_exp:                                         # one long loop: vectorised
            for idx in range(tq_tk):
                head[idx] = exp32(head[idx])
        else:
            for idx in range(tq_tk):
                head[idx] = math.exp(head[idx])
        for i in range(tq):                                  # masked entries exactly 0; normalise
            mi = i if mq else 0
            total = zero
            for j in range(tk):
                e = head[i * tk + j] if m[mi, j] else zero
                total += e
                head[i * tk + j] = e
            inv = one / total if total > zero else zero
            for j in range(tk):
                head[i * tk + j] *= inv
        if use_dropout:
            for idx in range(tq_tk):
                probs_d[bh, idx] = head[idx] * drop_scale if keep[bh, idx] else zero


@kernel(parallel=True)
def _softmax_rows_backward(dp, probs, keep, drop_scale, use_dropout, scale):
    """In place: dp (R, Tk) = dL/d(dropped probs) -> dL/d(raw scores):
    dropout backward, softmax backward ds = p (dp - sum(dp p)), times the score scale."""
    n_rows, tk = dp.shape
    zero = scale - scale
    for r in prange(n_rows):
        if use_dropout:
            for j in range(tk):
                dp[r, j] = dp[r, j] * drop_scale if keep[r, j] else zero
        dot = zero
        for j in range(tk):
            dot += dp[r, j] * probs[r, j]
        for j in range(tk):
            dp[r, j] = probs[r, j] * (dp[r, j] - dot) * scale


_TRUE = np.ones((1, 1, 1, 1), dtype=bool)
_TRUE_2D = np.ones((1, 1), dtype=bool)        # stands in for the keep-mask without dropout


def _check_qkv(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention_forward: expected q, k, v of shape (B, H, T, d), got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention_forward: q (B, H, Tq, dk), k (B, H, Tk, dk), v (B, H, Tk, dv) "
                         f"do not agree, got {q.shape}, {k.shape}, {v.shape}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (np.float32, np.float64):
        raise ValueError(f"attention_forward: expected q, k, v all float32 or all float64, got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")


def _mask4(mask, full):
    """A bool mask broadcastable to full = (B, H, Tq, Tk) -> contiguous (B|1, H|1, Tq|1, Tk)."""
    if mask is None:
        mask = _TRUE
    mask_b = np.asarray(mask, dtype=bool)
    mask_b = mask_b.reshape((1,) * (4 - mask_b.ndim) + mask_b.shape)
    if mask_b.ndim != 4 or any(m not in (1, f) for m, f in zip(mask_b.shape, full)):
        raise ValueError(f"mask: expected a bool array broadcastable to {full}, got shape "
                         f"{np.shape(mask)}")
    return np.ascontiguousarray(np.broadcast_to(mask_b, mask_b.shape[:3] + (full[3],)))


def attention_forward(q, k, v, mask=None, dropout_p=0.0, rng=None, training=False):
    """out = dropout(softmax(q k^T / sqrt(d_k), mask)) v, as the NumPy reference.

    Shape: q (B, H, Tq, dk), k (B, H, Tk, dk), v (B, H, Tk, dv), mask bool broadcastable to
    (B, H, Tq, Tk), True = may attend -> out (B, H, Tq, dv). The dropout mask is drawn from
    ``rng`` exactly as the reference draws it, so both backends see the same masks.
    """
    _check_qkv(q, k, v)
    n_b, n_h, tq, d_k = q.shape
    tk, d_v = k.shape[2], v.shape[3]
    full = (n_b, n_h, tq, tk)
    mask_b = _mask4(mask, full)
    scale = 1.0 / math.sqrt(d_k)
    probs = matmul(q, k.swapaxes(-1, -2))                            # raw scores (B, H, Tq, Tk)
    use_dropout = bool(training and dropout_p > 0.0)
    if use_dropout:
        keep = rng.random(full, dtype=np.float32) >= dropout_p     # same draws as the reference
        drop_scale = q.dtype.type(1.0 / (1.0 - dropout_p))
        probs_d = np.empty_like(probs)
        drop_cache = (keep, drop_scale)
    else:
        keep, drop_scale, probs_d, drop_cache = _TRUE, q.dtype.type(1.0), probs, None
    heads = (n_b * n_h, tq * tk)                                     # (B*H, Tq*Tk) views
    _softmax_rows(probs.reshape(heads), mask_b, n_h, q.dtype.type(scale), q.dtype.type(-np.inf),
                  q.dtype == np.float32, keep.reshape(heads) if use_dropout else _TRUE_2D,
                  drop_scale, use_dropout, probs_d.reshape(heads))  # probs (B, H, Tq, Tk)
    out = np.empty((n_b, tq, n_h, d_v), dtype=q.dtype)                # (B, Tq, H, dv)
    out_bhtd = out.transpose(0, 2, 1, 3)                             # (B, H, Tq, dv) view
    matmul(probs_d, v, out=out_bhtd)
    return out_bhtd, (q, k, v, probs, probs_d, drop_cache, scale)


def attention_backward_into(dout, cache, dq, dk, dv):
    """attention_backward writing into given arrays dq (B, H, Tq, dk), dk (B, H, Tk, dk),
    dv (B, H, Tk, dv) (views of a larger buffer are fine). Returns (dq, dk, dv)."""
    q, k, v, probs, probs_d, drop_cache, scale = cache
    n_b, n_h, tq, d_k = q.shape
    tk, d_v = k.shape[2], v.shape[3]
    if dout.shape != (n_b, n_h, tq, d_v):
        raise ValueError(f"dout: expected shape {(n_b, n_h, tq, d_v)}, got {dout.shape}")
    for name, arr, shape in (("dq", dq, q.shape), ("dk", dk, k.shape), ("dv", dv, v.shape)):
        if arr.shape != shape or arr.dtype != q.dtype:
            raise ValueError(f"{name}: expected a {q.dtype} array of shape {shape}, got "
                             f"{arr.dtype} {arr.shape}")
    if drop_cache is None:
        keep, drop_scale, use_dropout = _TRUE, q.dtype.type(1.0), False
    else:
        (keep, drop_scale), use_dropout = drop_cache, True
    dout = dout.astype(q.dtype, copy=False)
    matmul(probs_d.swapaxes(-1, -2), dout, out=dv)                   # dv = P'^T dout (B,H,Tk,dv)
    ds = matmul(dout, v.swapaxes(-1, -2))                            # dP' = dout v^T (B,H,Tq,Tk)
    _softmax_rows_backward(ds.reshape(-1, tk), probs.reshape(-1, tk),
                           keep.reshape(-1, tk) if use_dropout else _TRUE_2D,
                           drop_scale, use_dropout, q.dtype.type(scale))     # dS, in place
    matmul(ds, k, out=dq)                                            # dq = dS k      (B,H,Tq,dk)
    matmul(ds.swapaxes(-1, -2), q, out=dk)                           # dk = dS^T q    (B,H,Tk,dk)
    return dq, dk, dv


def attention_backward(dout, cache):
    """Gradients dq, dk, dv (shapes of q, k, v) of the forward; see the reference for the maths.

    They are (B, H, T, d) views of (B, T, H, d) arrays, so ``merge_heads`` of each is free."""
    q, k, v = cache[:3]
    n_b, n_h, tq, d_k = q.shape
    tk, d_v = k.shape[2], v.shape[3]
    dq = np.empty((n_b, tq, n_h, d_k), dtype=q.dtype).transpose(0, 2, 1, 3)
    dk = np.empty((n_b, tk, n_h, d_k), dtype=q.dtype).transpose(0, 2, 1, 3)
    dv = np.empty((n_b, tk, n_h, d_v), dtype=q.dtype).transpose(0, 2, 1, 3)
    return attention_backward_into(dout, cache, dq, dk, dv)
