"""Scaled dot-product attention: the six matrix products per head by single-threaded BLAS or
a register-blocked Numba kernel (the dispatch table's choice), and one fused Numba pass for
everything between them, over the runtime's worker threads.

Same maths, names and shapes as :func:`npformer.functional.attention_forward` /
``attention_backward`` (see docs/backprop.md#attention). Every product goes through the matmul
dispatcher, limited to its thread-safe variants:

- ``P v``, ``P'^T dout``, ``dS k``, ``dS^T q`` (rows of the second operand contiguous along d):
  BLAS or :mod:`npformer.kernels.blocked_matmul`, which keeps a 4 x 32 block of the result in
  vector registers (offered for d >= 32); at T <= 32 BLAS's per-matrix cost is a large share of
  a (16-32) x 32 product, which the blocked kernel does not pay.
- ``q k^T`` and ``dout v^T`` (a transposed second operand, of Tk columns): BLAS, possibly on a
  contiguous copy of that operand, or, for Tk >= 32, the blocked kernel on such a copy.

What the reference also does slowly is the element-wise work between the products
(``np.where`` for the mask, max, exp, sum, divide, dropout; five more passes in backward), each
a pass over all B*H*Tq*Tk scores in memory. Here:

- The heads are computed in parts of about ``CHUNK_BYTES`` of scores (a few batch elements, or
  heads when B = 1), so a part's scores stay in L2 from the product that writes them, through
  the Numba pass, to the product that reads them. The parts depend on the shape alone.
- The runtime's worker threads (``npformer.runtime.run_parts``) take the parts in turn, each the
  next one not yet taken (``np.matmul`` and the ``nogil`` kernels release the GIL; a waiting
  thread blocks, it does not spin). Parts write disjoint outputs, so the bits do not depend on
  which thread computed what. The Numba passes are serial for that reason: several threads
  must not enter Numba's parallel pool at once.
- The Numba pass works row by row: scale + mask, the row maximum (eight running maxima, which
  vectorise), exp + sum, normalise + dropout forward; backward: dropout + softmax backward +
  scale backward. float32 rows use a vectorisable ``exp``
  (``_fastexp.exp32``); float64 keeps ``math.exp``, so the float64 path matches the reference
  to ~1e-15.

Outputs are written in (B, T, H, d) order and returned as (B, H, T, d) views, so ``merge_heads``
afterwards is a free reshape; :func:`attention_backward_into` writes dq, dk, dv straight into the
caller's buffers (the self-attention module passes three slices of one (B, T, 3D) array).
"""
import math

import numpy as np
from numba import njit

from npformer import runtime
from npformer.aligned import empty_aligned
from npformer.functional.dropout import keep_mask

from ._fastexp import exp32
from ._jit import FASTMATH, kernel
from .matmul import THREAD_SAFE, matmul

SPLIT_MIN = 1 << 15              # score entries (B*H*Tq*Tk) from which both cores work
CHUNK_BYTES = 1 << 19            # scores per part, sized to stay in L2 between the products


@njit(inline="always", fastmath=FASTMATH, cache=True)
def _row_max(x, n, neg_inf):
    """max(x[:n]) in eight independent running maxima. One running maximum is a chain of
    dependent compares that LLVM does not vectorise (it dominated the softmax pass at T=64);
    eight chains run in parallel."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = neg_inf
    n8 = n - n % 8
    for j in range(0, n8, 8):
        m0, m1, m2, m3 = max(m0, x[j]), max(m1, x[j + 1]), max(m2, x[j + 2]), max(m3, x[j + 3])
        m4, m5, m6, m7 = max(m4, x[j + 4]), max(m5, x[j + 5]), max(m6, x[j + 6]), max(m7, x[j + 7])
    for j in range(n8, n):
        m0 = max(m0, x[j])
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@kernel
def _softmax_rows(s, bias, n_h, scale, neg_inf, fast_exp, keep, drop_scale, use_dropout, probs_d):
    """In place: s (B*H, Tq*Tk), each head's raw scores flattened -> softmax(scale * s + bias)
    over each row of Tk keys.

    bias (B|1, H|1, Tq|1, Tk) is 0 where a key may be attended and -inf where it is masked.
    Masked entries are exactly 0; a row with every key masked is all 0 (never NaN). With dropout,
    probs_d = probs * keep * drop_scale (keep, probs_d shaped as s). ``scale`` and ``neg_inf``
    have the dtype of s, so float32 rows are computed in float32.

    LLVM vectorises a loop 64 elements at a time and runs shorter loops scalar. Rows of >= 32
    keys take one vectorised pass for exp, sum and store; for shorter rows exp runs over the whole
    head as one flat loop instead. All loops start at 0 and index without division."""
    n_bh, tq_tk = s.shape
    tk = bias.shape[3]
    tq = tq_tk // tk
    zero, one = scale - scale, scale / scale                 # 0 and 1 in the dtype of s
    short = tk < 32
    x = np.empty(tk, dtype=s.dtype)                          # (Tk,) one row, scaled and masked
    for bh in range(n_bh):
        head = s[bh]                                         # (Tq*Tk,) one head, contiguous
        mb = bh // n_h if bias.shape[0] > 1 else 0
        mh = bh % n_h if bias.shape[1] > 1 else 0
        m = bias[mb, mh]                                     # (Tq|1, Tk)
        mq = m.shape[0] > 1
        for i in range(tq):
            mi = i if mq else 0
            row = i * tk
            for j in range(tk):                              # scale, mask
                x[j] = head[row + j] * scale + m[mi, j]
            row_max = _row_max(x, tk, neg_inf)
            if row_max == neg_inf:                           # all masked: the row becomes 0
                row_max = zero
            if short:                                        # exp below, over the whole head
                for j in range(tk):
                    head[row + j] = x[j] - row_max
                continue
            total = zero
            if fast_exp:                                     # exp32 stops at exp(-87) > 0
                for j in range(tk):
                    e = exp32(x[j] - row_max)
                    e = e if x[j] != neg_inf else zero
                    x[j] = e
                    total += e
            else:
                for j in range(tk):
                    e = math.exp(x[j] - row_max)
                    x[j] = e
                    total += e
            inv = one / total if total > zero else zero
            for j in range(tk):
                head[row + j] = x[j] * inv
        if short:
            if fast_exp:                                     # one long loop: vectorised
                for idx in range(tq_tk):
                    y = head[idx]
                    head[idx] = exp32(y) if y != neg_inf else zero
            else:
                for idx in range(tq_tk):
                    head[idx] = math.exp(head[idx])
            for i in range(tq):                              # normalise
                total = zero
                for j in range(tk):
                    total += head[i * tk + j]
                inv = one / total if total > zero else zero
                for j in range(tk):
                    head[i * tk + j] *= inv
        if use_dropout:
            for idx in range(tq_tk):
                probs_d[bh, idx] = head[idx] * drop_scale if keep[bh, idx] else zero


@kernel
def _softmax_rows_backward(dp, probs, keep, drop_scale, use_dropout, scale):
    """In place: dp (R, Tk) = dL/d(dropped probs) -> dL/d(raw scores):
    dropout backward, softmax backward ds = p (dp - sum(dp p)), times the score scale."""
    n_rows, tk = dp.shape
    zero = scale - scale
    for r in range(n_rows):
        if use_dropout:
            for j in range(tk):
                dp[r, j] = dp[r, j] * drop_scale if keep[r, j] else zero
        dot = zero
        for j in range(tk):
            dot += dp[r, j] * probs[r, j]
        for j in range(tk):
            dp[r, j] = probs[r, j] * (dp[r, j] - dot) * scale


_TRUE = np.ones((1, 1, 1, 1), dtype=bool)              # no mask: every key may be attended
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


def _parts(shape, itemsize):
    """How the heads are divided: (parts, parallel). parts lists (axis, lo, hi), axis 0 = B or
    1 = H (when B = 1); each part's scores take about CHUNK_BYTES, so they stay in the core's L2
    cache from the product that writes them to the one that reads them, and there are at least
    two parts when there are two batch elements (or heads). Below SPLIT_MIN scores everything
    runs on this thread (parallel is False). The parts depend on the shape alone."""
    n_b, n_h, tq, tk = shape
    axis, n = (0, n_b) if n_b > 1 else (1, n_h)
    step = max(1, CHUNK_BYTES // max(1, tq * tk * itemsize * (n_h if axis == 0 else 1)))
    parallel = n >= 2 and n_b * n_h * tq * tk >= SPLIT_MIN
    if parallel:
        step = min(step, -(-n // 2))
    return [(axis, lo, min(lo + step, n)) for lo in range(0, n, step)], parallel


def _part(x, part):
    """x restricted to one part: x[lo:hi] along the part's axis (a size-1, broadcast axis stays)."""
    axis, lo, hi = part
    if x.shape[axis] == 1:
        return x
    return x[lo:hi] if axis == 0 else x[:, lo:hi]


def _run(parts, parallel, fn):
    """fn(part) for every part: on the runtime's worker threads when ``parallel`` (each takes the
    next part nobody has taken, so a thread the machine slows down simply does fewer), else on
    this thread. Parts write disjoint outputs, so who computes which changes no bit."""
    runtime.run_parts(fn, parts, max_workers=None if parallel else 1)


def _flat(x, shape):
    """A reshaped view of x (never a copy: the kernels write into it)."""
    view = x.view()
    view.shape = shape
    return view


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
    dtype = q.dtype.type
    bias = np.where(_mask4(mask, full), dtype(0.0), dtype(-np.inf))   # (B|1, H|1, Tq|1, Tk)
    scale = 1.0 / math.sqrt(d_k)
    use_dropout = bool(training and dropout_p > 0.0)
    probs = np.empty(full, dtype=q.dtype)                            # (B, H, Tq, Tk)
    if use_dropout:
        keep = keep_mask(full, dropout_p, rng)                 # same draws as the reference
        drop_scale = q.dtype.type(1.0 / (1.0 - dropout_p))
        probs_d = np.empty_like(probs)
        drop_cache = (keep, drop_scale)
    else:
        keep, drop_scale, probs_d, drop_cache = None, q.dtype.type(1.0), probs, None
    out = empty_aligned((n_b, tq, n_h, d_v), q.dtype)                 # (B, Tq, H, dv)
    out_bhtd = out.transpose(0, 2, 1, 3)                             # (B, H, Tq, dv) view
    kt = k.swapaxes(-1, -2)                                          # (B, H, dk, Tk) view

    def forward_part(part):
        p, p_d = _part(probs, part), _part(probs_d, part)
        matmul(_part(q, part), _part(kt, part), out=p, candidates=THREAD_SAFE)   # (B,H,Tq,Tk)
        heads = (p.shape[0] * p.shape[1], tq * tk)                   # (B*H, Tq*Tk) views
        _softmax_rows(_flat(p, heads), _part(bias, part), p.shape[1], dtype(scale),
                      dtype(-np.inf), q.dtype == np.float32,
                      _flat(_part(keep, part), heads) if use_dropout else _TRUE_2D,
                      drop_scale, use_dropout, _flat(p_d, heads))    # probs (B, H, Tq, Tk)
        matmul(p_d, _part(v, part), out=_part(out_bhtd, part), candidates=THREAD_SAFE)  # (B,H,Tq,dv)
    _run(*_parts(full, q.itemsize), forward_part)
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
        keep, drop_scale, use_dropout = None, q.dtype.type(1.0), False
    else:
        (keep, drop_scale), use_dropout = drop_cache, True
    dout = dout.astype(q.dtype, copy=False)
    vt = v.swapaxes(-1, -2)                                          # (B, H, dv, Tk) view

    def backward_part(part):
        p, p_d, g = _part(probs, part), _part(probs_d, part), _part(dout, part)
        matmul(p_d.swapaxes(-1, -2), g, out=_part(dv, part),
               candidates=THREAD_SAFE)                               # dv = P'^T dout (B,H,Tk,dv)
        ds = matmul(g, _part(vt, part), candidates=THREAD_SAFE)     # dP' = dout v^T (B,H,Tq,Tk)
        rows = (ds.size // tk, tk)
        _softmax_rows_backward(_flat(ds, rows), _flat(p, rows),
                               _flat(_part(keep, part), rows) if use_dropout else _TRUE_2D,
                               drop_scale, use_dropout, q.dtype.type(scale))   # dS, in place
        matmul(ds, _part(k, part), out=_part(dq, part),
               candidates=THREAD_SAFE)                               # dq = dS k      (B,H,Tq,dk)
        matmul(ds.swapaxes(-1, -2), _part(q, part), out=_part(dk, part),
               candidates=THREAD_SAFE)                               # dk = dS^T q    (B,H,Tk,dk)
    _run(*_parts(probs.shape, q.itemsize), backward_part)
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
