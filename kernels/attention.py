"""Fused scaled dot-product attention: scores, scale, mask, softmax, dropout and the weighted sum
of values in one compiled pass per (batch, head), and the matching backward pass.

Same maths, names and shapes as :func:`npformer.functional.attention_forward` /
``attention_backward`` (see docs/backprop.md#attention). The B*H heads are independent, so the
kernels run ``prange`` over chunks of them. Each head is copied into small contiguous tiles and
multiplied with hand-written matrix products (T x d_head with T ~ 15 and d_head ~ 32: far too
small for a BLAS call per head to pay), which LLVM vectorises because the tiles are contiguous.

Outputs are written in (B, T, H, d) order and returned as (B, H, T, d) views, so that
``merge_heads`` afterwards is a free reshape instead of a copy.
"""
import math

import numpy as np
from numba import prange

from ._jit import kernel


@kernel
def _load(src, dst):
    """Copy a (T, d) strided view into a contiguous tile (so the products below vectorise)."""
    for i in range(dst.shape[0]):
        for c in range(dst.shape[1]):
            dst[i, c] = src[i, c]


@kernel
def _load_t(src, dst):
    """Copy the transpose of a (T, d) strided view into a contiguous (d, T) tile."""
    for i in range(dst.shape[1]):
        for c in range(dst.shape[0]):
            dst[c, i] = src[i, c]


@kernel
def _matmul_nn(a, b, out):
    """out = a b: a (M, K), b (K, N) -> out (M, N)."""
    out[:, :] = 0.0
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            aij = a[i, j]
            for c in range(b.shape[1]):
                out[i, c] += aij * b[j, c]


@kernel
def _matmul_tn(a, b, out):
    """out = a^T b: a (K, M), b (K, N) -> out (M, N)."""
    out[:, :] = 0.0
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            aij = a[i, j]
            for c in range(b.shape[1]):
                out[j, c] += aij * b[i, c]


@kernel(parallel=True)
def _scores(q, k, mask, scale, s):
    """s = scale * q k^T minus each row's max over the unmasked entries; masked entries -inf.

    q (B,H,Tq,dk), k (B,H,Tk,dk) (any strides), mask bool (B|1, H|1, Tq|1, Tk) -> s (B,H,Tq,Tk).
    exp(s) is then the unnormalised softmax, 0 exactly where masked (all-masked rows included)."""
    n_b, n_h, tq, dk = q.shape
    tk = k.shape[2]
    n_chunks = min(n_b * n_h, 64)
    for ch in prange(n_chunks):
        qq = np.empty((tq, dk), dtype=q.dtype)               # per-thread tiles, reused per head
        kt = np.empty((dk, tk), dtype=q.dtype)               # K^T: the product vectorises over keys
        p = np.empty((tq, tk), dtype=q.dtype)
        for bh in range(ch * n_b * n_h // n_chunks, (ch + 1) * n_b * n_h // n_chunks):
            b, h = bh // n_h, bh % n_h
            _load(q[b, h], qq)
            _load_t(k[b, h], kt)
            _matmul_nn(qq, kt, p)                            # raw scores (Tq, Tk)
            m = mask[b if mask.shape[0] > 1 else 0, h if mask.shape[1] > 1 else 0]
            for i in range(tq):
                mrow = m[i if m.shape[0] > 1 else 0]
                row_max = -np.inf
                for j in range(tk):
                    if mrow[j]:
                        p[i, j] *= scale
                        row_max = max(row_max, p[i, j])
                if row_max == -np.inf:                       # all masked: exp(-inf) = 0 everywhere
                    row_max = 0.0
                for j in range(tk):
                    s[b, h, i, j] = p[i, j] - row_max if mrow[j] else -np.inf


@kernel(parallel=True)
def _normalise_and_mix(e, v, keep, drop_scale, use_dropout, out):
    """e = exp(s) (B,H,Tq,Tk) -> probs in place (rows sum to 1, all-zero rows stay 0), and
    out (B,Tq,H,dv) = dropout(probs) v."""
    n_b, n_h, tq, tk = e.shape
    dv = v.shape[3]
    n_chunks = min(n_b * n_h, 64)
    for ch in prange(n_chunks):
        vv = np.empty((tk, dv), dtype=v.dtype)
        p = np.empty((tq, tk), dtype=v.dtype)
        o = np.empty((tq, dv), dtype=v.dtype)
        for bh in range(ch * n_b * n_h // n_chunks, (ch + 1) * n_b * n_h // n_chunks):
            b, h = bh // n_h, bh % n_h
            _load(v[b, h], vv)
            for i in range(tq):
                total = 0.0
                for j in range(tk):
                    total += e[b, h, i, j]
                inv = 1.0 / total if total > 0.0 else 0.0
                for j in range(tk):
                    pij = e[b, h, i, j] * inv
                    e[b, h, i, j] = pij
                    if use_dropout:
                        pij = pij * drop_scale if keep[b, h, i, j] else 0.0
                    p[i, j] = pij
            _matmul_nn(p, vv, o)                             # (Tq, dv)
            for i in range(tq):
                out[b, i, h] = o[i]


@kernel(parallel=True)
def _attention_bwd(dout, q, k, v, probs, keep, drop_scale, use_dropout, scale, dq, dk, dv):
    """dout (B,H,Tq,dv) -> dq (B,Tq,H,dk), dk (B,Tk,H,dk), dv (B,Tk,H,dv), written in place."""
    n_b, n_h, tq, d_k = q.shape
    tk, d_v = k.shape[2], v.shape[3]
    n_chunks = min(n_b * n_h, 64)
    for ch in prange(n_chunks):
        qq = np.empty((tq, d_k), dtype=q.dtype)
        kk = np.empty((tk, d_k), dtype=q.dtype)
        vt = np.empty((d_v, tk), dtype=q.dtype)             # V^T
        go = np.empty((tq, d_v), dtype=q.dtype)             # dout tile
        p = np.empty((tq, tk), dtype=q.dtype)               # probs
        pd = np.empty((tq, tk), dtype=q.dtype)              # dropout(probs)
        ds = np.empty((tq, tk), dtype=q.dtype)              # dL/dP', then dL/dS
        gq = np.empty((tq, d_k), dtype=q.dtype)
        gk = np.empty((tk, d_k), dtype=q.dtype)
        gv = np.empty((tk, d_v), dtype=q.dtype)
        for bh in range(ch * n_b * n_h // n_chunks, (ch + 1) * n_b * n_h // n_chunks):
            b, h = bh // n_h, bh % n_h
            _load(q[b, h], qq)
            _load(k[b, h], kk)
            _load_t(v[b, h], vt)
            _load(dout[b, h], go)
            _load(probs[b, h], p)
            _matmul_nn(go, vt, ds)                           # dP' = dout V^T   (Tq, Tk)
            if use_dropout:
                for i in range(tq):
                    for j in range(tk):
                        kept = keep[b, h, i, j]
                        pd[i, j] = p[i, j] * drop_scale if kept else 0.0
                        ds[i, j] = ds[i, j] * drop_scale if kept else 0.0
            else:
                pd[:, :] = p
            for i in range(tq):                              # softmax backward, times scale
                dot = 0.0
                for j in range(tk):
                    dot += ds[i, j] * p[i, j]
                for j in range(tk):
                    ds[i, j] = p[i, j] * (ds[i, j] - dot) * scale
            _matmul_nn(ds, kk, gq)                           # dq = dS K        (Tq, dk)
            _matmul_tn(ds, qq, gk)                           # dk = dS^T q      (Tk, dk)
            _matmul_tn(pd, go, gv)                           # dv = P'^T dout   (Tk, dv)
            for i in range(tq):
                dq[b, i, h] = gq[i]
            for j in range(tk):
                dk[b, j, h] = gk[j]
                dv[b, j, h] = gv[j]


_TRUE = np.ones((1, 1, 1, 1), dtype=bool)


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


def attention_forward(q, k, v, mask=None, dropout_p=0.0, rng=None, training=False):
    """out = dropout(softmax(q k^T / sqrt(d_k), mask)) v, as the NumPy reference.

    Shape: q (B, H, Tq, dk), k (B, H, Tk, dk), v (B, H, Tk, dv), mask bool broadcastable to
    (B, H, Tq, Tk), True = may attend -> out (B, H, Tq, dv). The dropout mask is drawn from
    ``rng`` exactly as the reference draws it, so both backends see the same masks.
    """
    _check_qkv(q, k, v)
    n_b, n_h, tq, _ = q.shape
    tk, dv = k.shape[2], v.shape[3]
    full = (n_b, n_h, tq, tk)
    if mask is None:
        mask = _TRUE
    mask_b = np.asarray(mask, dtype=bool)
    mask_b = mask_b.reshape((1,) * (4 - mask_b.ndim) + mask_b.shape)   # (B|1, H|1, Tq|1, Tk)
    if mask_b.ndim != 4 or any(m not in (1, f) for m, f in zip(mask_b.shape, full)):
        raise ValueError(f"mask: expected a bool array broadcastable to {full}, got shape "
                         f"{np.shape(mask)}")
    mask_b = np.ascontiguousarray(np.broadcast_to(mask_b, mask_b.shape[:3] + (tk,)))
    use_dropout = bool(training and dropout_p > 0.0)
    if use_dropout:
        keep = rng.random(full, dtype=np.float32) >= dropout_p     # same draws as the reference
        drop_scale = 1.0 / (1.0 - dropout_p)
        drop_cache = (keep, q.dtype.type(drop_scale))
    else:
        keep, drop_scale, drop_cache = _TRUE, 1.0, None
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = np.empty((n_b, tq, n_h, dv), dtype=q.dtype)                # (B, Tq, H, dv)
    probs = np.empty(full, dtype=q.dtype)                            # (B, H, Tq, Tk)
    _scores(q, k, mask_b, scale, probs)                              # s - rowmax, -inf if masked
    np.exp(probs, out=probs)             # NumPy's SIMD exp; a Numba loop would call scalar exp
    _normalise_and_mix(probs, v, keep, drop_scale, use_dropout, out)
    # the cache keeps the reference layout (probs at index 3); probs_d is recomputed in backward
    return out.transpose(0, 2, 1, 3), (q, k, v, probs, None, drop_cache, scale)


def attention_backward(dout, cache):
    """Gradients dq, dk, dv (shapes of q, k, v) of the fused forward; see the reference for the maths."""
    q, k, v, probs, _, drop_cache, scale = cache
    n_b, n_h, tq, d_k = q.shape
    tk, d_v = k.shape[2], v.shape[3]
    if dout.shape != (n_b, n_h, tq, d_v):
        raise ValueError(f"dout: expected shape {(n_b, n_h, tq, d_v)}, got {dout.shape}")
    if drop_cache is None:
        keep, drop_scale, use_dropout = _TRUE, 1.0, False
    else:
        keep, drop_scale = drop_cache
        use_dropout = True
    dout = dout.astype(q.dtype, copy=False)
    dq = np.empty((n_b, tq, n_h, d_k), dtype=q.dtype)                # (B, Tq, H, dk)
    dk = np.empty((n_b, tk, n_h, d_k), dtype=q.dtype)                # (B, Tk, H, dk)
    dv = np.empty((n_b, tk, n_h, d_v), dtype=q.dtype)                # (B, Tk, H, dv)
    _attention_bwd(dout, q, k, v, probs, keep, float(drop_scale), use_dropout, scale, dq, dk, dv)
    return dq.transpose(0, 2, 1, 3), dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3)
