"""Blocked attention for long contexts: memory O(B*H*T*d), never O(B*H*T^2).

The fused kernel of :mod:`npformer.kernels.attention` keeps the probabilities P (and P' with
dropout) and the dropout keep-mask for the backward: B*H*Tq*Tk entries each. At T = 2,048, 6
heads and 4 rows that is 400 MB per layer per copy. This path (FlashAttention's algorithm, on
the CPU) keeps, per query row, only the row's maximum score m and the inverse 1/l of its sum of
exponentials, and recomputes the scores block by block in the backward:

- forward, per query block and for each key block it may attend: S = q k^T (one product over
  the block's heads), then one Numba pass: scale, mask, the new running maximum m' = max(m,
  rowmax(S)), alpha = exp(m - m'), p = exp(S - m'), l = alpha l + rowsum(p), the dropout bits
  (below), and the output so far rescaled, acc = alpha (acc + the previous block's P' v); then
  P' v for this block. At the end out = acc / l. Nothing of size Tq x Tk outlives the block.
- backward: D = rowsum(dout * out) (= rowsum(dP * P), dropout included), and for each query
  block and key block: S = q k^T and dP' = dout v^T again, P = exp(S - m) / l, P' = P keep /
  (1 - p), dS = P (dP' keep / (1 - p) - D) scale (entries below the dtype's smallest normal
  number set to 0, as the reference does); dv += P'^T dout, dk += dS^T q, dq += dS k.
- dropout: the reference's mask is counter-based (:mod:`npformer.kernels.dropout`): unit u of
  the (B, H, Tq, Tk) scores keeps the 16 bits at 16 (u % 4) of SplitMix64 word u // 4 of a key
  drawn from ``rng``. A block regenerates exactly its units' bits from the key, in the forward
  and again in the backward: the same mask as the reference's for the same ``rng``, never stored.

Masks: a bool mask broadcastable to (B, H, Tq, Tk), True = may attend, read entry by entry in the
Numba pass. A key block that no row of a query block may attend (in any batch element or head:
above the diagonal of a causal mask) is skipped, and the last block a query block attends ends at
the last key it may attend. A row with every key masked gives zeros, never NaN.

Grouped key/value heads: k, v may have Hkv heads dividing H; query head i reads key/value head
i // (H / Hkv). The queries of a group are stacked on their shared head's rows, so one product
serves the whole group, and dk, dv come out per key/value head, the group's sum.

Threads and bits: the work is cut into parts of whole (batch element, key/value heads), fixed by
the shape alone. Each part writes disjoint outputs (its rows of out, m and 1/l; its heads' dq,
dk, dv), and within a part the blocks are visited in a fixed order, so dk and dv accumulate over
query blocks in that order on one thread: the same bits on any number of threads. Products use
the dispatcher's thread-safe variants, on the calling thread.
"""
import math

import numpy as np
from numba import njit

from npformer import runtime
from npformer.aligned import empty_aligned
from npformer.functional.dropout import mask_key, mask_threshold

from ._fastexp import exp32
from ._jit import kernel
from ._rows import flush_subnormal
from ._rows import row_max as _row_max
from .dropout import _word
from .matmul import THREAD_SAFE, matmul

BLOCK_Q = 256                    # query rows per block (of each query head)
BLOCK_K = 1024                   # keys per block
PART_BYTES = 1 << 20             # a part's score block (heads x rows x keys) at most this ...
MIN_PARTS = 8                    # ... and at least this many parts where the heads allow it
SPLIT_MIN = 1 << 15              # score entries (B*H*Tq*Tk) from which the parts run in parallel


@njit(inline="always", cache=True)
def _fill_bits(key, unit0, n, bits):
    """The dropout fields of units unit0 .. unit0 + n - 1: bits[off + j] for unit unit0 + j
    (bits 16 (u % 4) .. of SplitMix64 word u // 4, as ``keep_mask``). Returns off = unit0 % 4.
    Whole words are written (their four fields), so the loop has no branch and vectorises."""
    w0 = unit0 >> 2
    off = unit0 & 3
    mask = np.uint64(0xFFFF)
    for w in range((off + n + 3) >> 2):
        z = _word(key, w0 + w)
        bits[4 * w] = np.uint16(z & mask)
        bits[4 * w + 1] = np.uint16((z >> np.uint64(16)) & mask)
        bits[4 * w + 2] = np.uint16((z >> np.uint64(32)) & mask)
        bits[4 * w + 3] = np.uint16(z >> np.uint64(48))
    return off


@kernel
def _forward_block(s, mask, b, h0, group, n_rows, r0, c0, scale, neg_inf, low, fast_exp,
                   m, l, acc, tmp, first, pending, use_dropout, key, threshold, drop_scale,
                   n_heads, tq, tk, x, bits):
    """One key block of the online softmax, in place.

    s (A, G*R, C): the raw scores of A key/value heads' query rows (each head's G query heads'
    R rows, head-major: row r is query head h0 + a G + r // R, position r0 + r % R) against keys
    c0 .. c0 + C - 1 -> P' of the block, unnormalised: exp(scale s - m') times the dropout's
    keep / (1 - p). m, l (A, G*R): the running maximum and sum, updated (``first``: start from
    -inf and 0). acc (A, G*R, dv): the output so far, rescaled by exp(m - m') after adding
    ``tmp`` (the previous block's P' v) where ``pending``; ``first``: set to 0.
    mask (B|1, H|1, Tq|1, Tk) bool. x (C,), bits (C + 8,) uint16: scratch."""
    n_a, n_r, n_c = s.shape
    zero = scale - scale
    mb = b if mask.shape[0] > 1 else 0
    mq = mask.shape[2] > 1
    d_v = acc.shape[2]
    for a in range(n_a):
        for r in range(n_r):
            h = h0 + a * group + r // n_rows
            i = r0 + r % n_rows
            mh = h if mask.shape[1] > 1 else 0
            mi = i if mq else 0
            mrow = mask[mb, mh, mi]                              # (Tk,)
            for j in range(n_c):                                 # scale, mask
                y = s[a, r, j] * scale
                x[j] = y if mrow[c0 + j] else neg_inf
            m_old = neg_inf if first else m[a, r]
            l_old = zero if first else l[a, r]
            m_new = max(m_old, _row_max(x, n_c, neg_inf))
            if m_new == neg_inf:                                 # nothing attended so far
                for j in range(n_c):
                    s[a, r, j] = zero
                for j in range(d_v):
                    acc[a, r, j] = zero
                m[a, r], l[a, r] = neg_inf, zero
                continue
            if m_old == neg_inf:
                alpha = zero
            elif fast_exp:
                alpha = exp32(m_old - m_new)
            else:
                alpha = math.exp(m_old - m_new)
            total = zero
            if fast_exp:                                         # exp32 stops at exp(-87) > 0
                for j in range(n_c):
                    t = x[j] - m_new
                    e = exp32(t)
                    e = e if t > low else zero
                    x[j] = e
                    total += e
            else:
                for j in range(n_c):
                    t = x[j] - m_new
                    e = math.exp(t)
                    e = e if t > low else zero
                    x[j] = e
                    total += e
            m[a, r], l[a, r] = m_new, l_old * alpha + total
            if use_dropout:
                off = _fill_bits(key, ((b * n_heads + h) * tq + i) * tk + c0, n_c, bits)
                for j in range(n_c):
                    s[a, r, j] = x[j] * drop_scale if bits[off + j] >= threshold else zero
            else:
                for j in range(n_c):
                    s[a, r, j] = x[j]
            if first:
                for j in range(d_v):
                    acc[a, r, j] = zero
            elif pending:
                for j in range(d_v):
                    acc[a, r, j] = (acc[a, r, j] + tmp[a, r, j]) * alpha
            else:
                for j in range(d_v):
                    acc[a, r, j] *= alpha


@kernel
def _forward_finish(acc, tmp, m, l, out, row_max, inv_sum, b, h0, group, n_rows, r0, one):
    """out rows = (acc + tmp) / l (0 where l = 0: every key masked); row_max, inv_sum
    (B, H, Tq) receive m and 1/l (0 and 0 for such rows). out (B, H, Tq, dv), any strides.
    ``one``: 1 in the dtype of the arrays (float32 rows are computed in float32)."""
    n_a, n_r, d_v = acc.shape
    zero = one - one
    for a in range(n_a):
        for r in range(n_r):
            h = h0 + a * group + r // n_rows
            i = r0 + r % n_rows
            total = l[a, r]
            inv = one / total if total > zero else zero
            for j in range(d_v):
                out[b, h, i, j] = (acc[a, r, j] + tmp[a, r, j]) * inv
            row_max[b, h, i] = m[a, r] if total > 0 else zero
            inv_sum[b, h, i] = inv


@kernel
def _row_dots(g, out, b, r0, h0, dd, zero):
    """D = rowsum(dout * out) of a query block's rows: dd[h, i] = sum_j g[h, i, j]
    out[b, r0 + i, h0 + h, j], g (H', R, d) dout's rows (the copy the products read), out
    (B, Tq, H, d) the forward's output read where it is (C-contiguous, so a row's terms load as
    contiguous vectors, as from a copy); ``zero`` in their dtype."""
    n_h, n_r, n_d = g.shape
    for h in range(n_h):
        for i in range(n_r):
            total = zero
            for j in range(n_d):
                total += g[h, i, j] * out[b, r0 + i, h0 + h, j]
            dd[h, i] = total


@kernel
def _backward_block(s, dp, mask, b, h0, group, n_rows, r0, c0, scale, neg_inf, low, fast_exp,
                    m, inv_l, dd, use_dropout, key, threshold, drop_scale, n_heads, tq, tk,
                    tiny, x, bits):
    """One block of the backward, in place: s (A, G*R, C) raw scores -> P' (P keep / (1 - p));
    dp (A, G*R, C) dP' = dout v^T -> dS = P (dP' keep / (1 - p) - D) scale, entries below
    ``tiny`` in magnitude set to 0. P = exp(scale s - m) / l, from the forward's m and 1/l
    (A, G*R); dd (A, G*R): D = rowsum(dout * out). Rows and mask as :func:`_forward_block`;
    x (C,), bits (C + 8,): scratch. Each case is its own loop, without branches, so that it
    vectorises."""
    n_a, n_r, n_c = s.shape
    zero = scale - scale
    mb = b if mask.shape[0] > 1 else 0
    mq = mask.shape[2] > 1
    for a in range(n_a):
        for r in range(n_r):
            h = h0 + a * group + r // n_rows
            i = r0 + r % n_rows
            mrow = mask[mb, h if mask.shape[1] > 1 else 0, i if mq else 0]      # (Tk,)
            row_max, inv, d_row = m[a, r], inv_l[a, r], dd[a, r]
            if inv == zero:                                      # every key masked: P = 0
                for j in range(n_c):
                    s[a, r, j] = zero
                    dp[a, r, j] = zero
                continue
            if fast_exp:                                         # P
                for j in range(n_c):
                    t = s[a, r, j] * scale - row_max
                    e = exp32(t) * inv
                    x[j] = e if (t > low) & mrow[c0 + j] else zero
            else:
                for j in range(n_c):
                    t = s[a, r, j] * scale - row_max
                    e = math.exp(t) * inv
                    x[j] = e if (t > low) & mrow[c0 + j] else zero
            if use_dropout:
                off = _fill_bits(key, ((b * n_heads + h) * tq + i) * tk + c0, n_c, bits)
                for j in range(n_c):
                    kept = bits[off + j] >= threshold
                    g = dp[a, r, j] * drop_scale if kept else zero
                    s[a, r, j] = x[j] * drop_scale if kept else zero
                    ds = x[j] * (g - d_row) * scale
                    dp[a, r, j] = ds if abs(ds) >= tiny else zero
            else:
                for j in range(n_c):
                    s[a, r, j] = x[j]
                    ds = x[j] * (dp[a, r, j] - d_row) * scale
                    dp[a, r, j] = ds if abs(ds) >= tiny else zero


@kernel
def _accumulate(dv, tv, dk, tk, c0, dq, tq, first):
    """dv[:, c0:c0+C] += tv, dk[:, c0:c0+C] += tk (dv, dk (A, Tk, d) the part's sums; tv, tk
    (A, C, d) one key block's); dq = tq where ``first`` (the query block's first key block),
    else dq += tq. All C-contiguous, so the loops vectorise."""
    n_a, n_c, d_v = tv.shape
    d_k = tk.shape[2]
    for a in range(n_a):
        for c in range(n_c):
            for j in range(d_v):
                dv[a, c0 + c, j] += tv[a, c, j]
            for j in range(d_k):
                dk[a, c0 + c, j] += tk[a, c, j]
    dq_f, tq_f = dq.reshape(-1), tq.reshape(-1)
    if first:
        for j in range(tq_f.shape[0]):
            dq_f[j] = tq_f[j]
    else:
        for j in range(tq_f.shape[0]):
            dq_f[j] += tq_f[j]


class Saved:
    """What the blocked backward needs besides q, k, v and the dropout's key and threshold (the
    cache's ``drop``: the mask itself is regenerated): the output (B, H, Tq, dv), each query
    row's maximum scaled score and 1/sum of its exponentials (B, H, Tq), the mask, the blocks."""
    __slots__ = ("out", "row_max", "inv_sum", "mask4", "plan")

    def __init__(self, **fields):
        for name, value in fields.items():
            setattr(self, name, value)


def plan(mask4, tq, tk):
    """The blocks: a list of (r0, r1, keys) per query block of ``BLOCK_Q`` rows, keys a list of
    (c0, c1), the key blocks some row r0 .. r1-1 may attend in some batch element or head, each
    at most ``BLOCK_K`` keys, the last ending at the last key any row of the block may attend.
    Depends on the mask and the shape alone."""
    seen = mask4[0, 0] if mask4.shape[:2] == (1, 1) else mask4.any(axis=(0, 1))  # (Tq|1, Tk)
    shared = None
    blocks = []
    for r0 in range(0, tq, BLOCK_Q):
        r1 = min(r0 + BLOCK_Q, tq)
        if seen.shape[0] > 1 or shared is None:
            cols = seen[r0:r1].any(axis=0) if seen.shape[0] > 1 else seen[0]
            keys = []
            if cols.any():
                end = tk - int(np.argmax(cols[::-1]))
                keys = [(c0, min(c0 + BLOCK_K, end)) for c0 in range(0, end, BLOCK_K)
                        if cols[c0:c0 + BLOCK_K].any()]
            shared = keys
        blocks.append((r0, r1, shared))
    return blocks


def parts(n_b, n_kv, group, itemsize):
    """(parts, parallel): parts (b, a0, a1), batch element b's key/value heads a0 .. a1-1 with
    their query heads; as many heads as keep a score block within ``PART_BYTES``, and fewer
    where that leaves under ``MIN_PARTS`` parts. Fixed by the shape alone."""
    per_head = group * BLOCK_Q * BLOCK_K * itemsize
    heads = max(1, min(n_kv, PART_BYTES // per_head))
    while heads > 1 and n_b * -(-n_kv // heads) < MIN_PARTS:
        heads -= 1
    return [(b, a0, min(a0 + heads, n_kv)) for b in range(n_b) for a0 in range(0, n_kv, heads)]


def _view(flat, shape):
    """The first prod(shape) entries of a flat scratch buffer as a C-contiguous array."""
    return flat[:math.prod(shape)].reshape(shape)


def _low(dtype):
    """exp arguments below this give 0 (float32: exp32's floor, exp(-87) ~ 1.6e-38, just above
    the smallest normal number; float64: exp(-708) ~ 3.3e-308, likewise)."""
    return dtype.type(-87.0) if dtype == np.float32 else dtype.type(-708.0)


def attention_forward(q, k, v, mask4, dropout_p=0.0, rng=None, training=False):
    """out = dropout(softmax(q k^T / sqrt(d_k), mask)) v by blocks, as the reference.

    Shape: q (B, H, Tq, dk), k (B, Hkv, Tk, dk), v (B, Hkv, Tk, dv) with Hkv dividing H, mask4
    bool (B|1, H|1, Tq|1, Tk) C-contiguous -> out (B, H, Tq, dv) (a view of a (B, Tq, H, dv)
    array), cache (q, k, v, None, None, drop, scale, Saved): no probabilities (None where the
    fused kernel's cache holds P and P'); drop is (key, threshold, 1 / (1 - p)) or None."""
    n_b, n_h, tq, d_k = q.shape
    n_kv, tk, d_v = k.shape[1], k.shape[2], v.shape[3]
    group = n_h // n_kv
    dtype = q.dtype
    dt = dtype.type
    scale = 1.0 / math.sqrt(d_k)
    use_dropout = bool(training and dropout_p > 0.0)
    if use_dropout:
        key, threshold = np.uint64(mask_key(rng)), np.uint16(mask_threshold(dropout_p))
        drop_scale = dt(1.0 / (1.0 - dropout_p))
    else:
        key, threshold, drop_scale = np.uint64(0), np.uint16(0), dt(1.0)
    out = empty_aligned((n_b, tq, n_h, d_v), dtype)
    out_bhtd = out.transpose(0, 2, 1, 3)                                 # (B, H, Tq, dv) view
    row_max = np.empty((n_b, n_h, tq), dtype)
    inv_sum = np.empty((n_b, n_h, tq), dtype)
    blocks = plan(mask4, tq, tk)
    neg_inf, low, fast = dt(-np.inf), _low(dtype), dtype == np.float32

    def forward_part(part):
        b, a0, a1 = part
        n_a, h0, h1 = a1 - a0, a0 * group, a1 * group
        kt_p = np.ascontiguousarray(k[b, a0:a1].swapaxes(-1, -2))        # (A, dk, Tk)
        v_p = np.ascontiguousarray(v[b, a0:a1])                          # (A, Tk, dv)
        rows = group * BLOCK_Q
        s_flat = empty_aligned(n_a * rows * BLOCK_K, dtype)
        q_flat = empty_aligned(n_a * rows * d_k, dtype)
        acc_flat, tmp_flat = np.empty(n_a * rows * d_v, dtype), np.empty(n_a * rows * d_v, dtype)
        m_flat, l_flat = np.empty(n_a * rows, dtype), np.empty(n_a * rows, dtype)
        x, bits = np.empty(BLOCK_K, dtype), np.empty(BLOCK_K + 8, np.uint16)
        for r0, r1, keys in blocks:
            n_r = r1 - r0
            if not keys:                                                  # every key masked
                out_bhtd[b, h0:h1, r0:r1] = 0
                row_max[b, h0:h1, r0:r1] = 0
                inv_sum[b, h0:h1, r0:r1] = 0
                continue
            _view(q_flat, (h1 - h0, n_r, d_k))[...] = q[b, h0:h1, r0:r1]
            qg = _view(q_flat, (n_a, group * n_r, d_k))                  # a group's rows stacked
            m, l = _view(m_flat, (n_a, group * n_r)), _view(l_flat, (n_a, group * n_r))
            acc = _view(acc_flat, (n_a, group * n_r, d_v))
            tmp = _view(tmp_flat, (n_a, group * n_r, d_v))
            for idx, (c0, c1) in enumerate(keys):
                s = _view(s_flat, (n_a, group * n_r, c1 - c0))
                matmul(qg, kt_p[:, :, c0:c1], out=s, candidates=THREAD_SAFE)     # S
                _forward_block(s, mask4, b, h0, group, n_r, r0, c0, dt(scale), neg_inf, low,
                               fast, m, l, acc, tmp, idx == 0, idx > 0, use_dropout, key,
                               threshold, drop_scale, n_h, tq, tk, x, bits)       # S -> P'
                matmul(s, v_p[:, c0:c1], out=tmp, candidates=THREAD_SAFE)        # P' v
            _forward_finish(acc, tmp, m, l, out_bhtd, row_max, inv_sum, b, h0, group, n_r, r0,
                            dt(1.0))

    _run(parts(n_b, n_kv, group, q.itemsize), n_b * n_h * tq * tk, forward_part)
    saved = Saved(out=out_bhtd, row_max=row_max, inv_sum=inv_sum, mask4=mask4, plan=blocks)
    drop = (key, threshold, drop_scale) if use_dropout else None
    return out_bhtd, (q, k, v, None, None, drop, scale, saved)


def attention_backward_into(dout, cache, dq, dk, dv):
    """Gradients of :func:`attention_forward` written into dq (B, H, Tq, dk), dk (B, Hkv, Tk, dk),
    dv (B, Hkv, Tk, dv) (views of larger buffers are fine). Returns (dq, dk, dv)."""
    q, k, v, _, _, drop, scale, saved = cache
    n_b, n_h, tq, d_k = q.shape
    n_kv, tk, d_v = k.shape[1], k.shape[2], v.shape[3]
    group = n_h // n_kv
    dtype = q.dtype
    dt = dtype.type
    dout = dout.astype(dtype, copy=False)
    tiny = np.finfo(dtype).tiny
    neg_inf, low, fast = dt(-np.inf), _low(dtype), dtype == np.float32
    out = np.ascontiguousarray(saved.out.transpose(0, 2, 1, 3))   # (B, Tq, H, dv): no copy
    mask4 = saved.mask4
    use_dropout = drop is not None           # the key and threshold regenerate its bits
    key, threshold, drop_scale = drop if use_dropout else (np.uint64(0), np.uint16(0), dt(1.0))

    def backward_part(part):
        b, a0, a1 = part
        n_a, h0, h1 = a1 - a0, a0 * group, a1 * group
        kt_p = np.ascontiguousarray(k[b, a0:a1].swapaxes(-1, -2))        # (A, dk, Tk)
        k_p = np.ascontiguousarray(k[b, a0:a1])                          # (A, Tk, dk)
        vt_p = np.ascontiguousarray(v[b, a0:a1].swapaxes(-1, -2))        # (A, dv, Tk)
        dq_p = dq[b, h0:h1]
        dk_p, dv_p = np.zeros((n_a, tk, d_k), dtype), np.zeros((n_a, tk, d_v), dtype)  # sums
        rows = group * BLOCK_Q
        s_flat = empty_aligned(n_a * rows * BLOCK_K, dtype)
        dp_flat = empty_aligned(n_a * rows * BLOCK_K, dtype)
        q_flat = empty_aligned(n_a * rows * d_k, dtype)
        g_flat = empty_aligned(n_a * rows * d_v, dtype)
        dq_flat, tq_flat = np.empty(n_a * rows * d_k, dtype), np.empty(n_a * rows * d_k, dtype)
        tk_flat = np.empty(n_a * BLOCK_K * d_k, dtype)
        tv_flat = np.empty(n_a * BLOCK_K * d_v, dtype)
        m_flat, il_flat = np.empty(n_a * rows, dtype), np.empty(n_a * rows, dtype)
        d_flat, bits = np.empty(n_a * rows, dtype), np.empty(BLOCK_K + 8, np.uint16)
        x = np.empty(BLOCK_K, dtype)
        for r0, r1, keys in saved.plan:
            n_r = r1 - r0
            if not keys:
                dq_p[:, r0:r1] = 0
                continue
            gr = group * n_r
            _view(q_flat, (h1 - h0, n_r, d_k))[...] = q[b, h0:h1, r0:r1]
            _view(g_flat, (h1 - h0, n_r, d_v))[...] = dout[b, h0:h1, r0:r1]
            _view(m_flat, (h1 - h0, n_r))[...] = saved.row_max[b, h0:h1, r0:r1]
            _view(il_flat, (h1 - h0, n_r))[...] = saved.inv_sum[b, h0:h1, r0:r1]
            qg, gg = _view(q_flat, (n_a, gr, d_k)), _view(g_flat, (n_a, gr, d_v))
            m, il, dd = _view(m_flat, (n_a, gr)), _view(il_flat, (n_a, gr)), _view(d_flat, (n_a, gr))
            _row_dots(_view(g_flat, (h1 - h0, n_r, d_v)), out, b, r0, h0,
                      _view(d_flat, (h1 - h0, n_r)), dt(0.0))             # D = rowsum(dout out)
            dq_acc, tq_ = _view(dq_flat, (n_a, gr, d_k)), _view(tq_flat, (n_a, gr, d_k))
            for idx, (c0, c1) in enumerate(keys):
                n_c = c1 - c0
                s = _view(s_flat, (n_a, gr, n_c))
                dp = _view(dp_flat, (n_a, gr, n_c))
                matmul(qg, kt_p[:, :, c0:c1], out=s, candidates=THREAD_SAFE)     # S
                matmul(gg, vt_p[:, :, c0:c1], out=dp, candidates=THREAD_SAFE)    # dP'
                _backward_block(s, dp, mask4, b, h0, group, n_r, r0, c0, dt(scale), neg_inf,
                                low, fast, m, il, dd, use_dropout, key, threshold,
                                drop_scale, n_h, tq, tk, tiny, x, bits)
                tv, tk_ = _view(tv_flat, (n_a, n_c, d_v)), _view(tk_flat, (n_a, n_c, d_k))
                matmul(s.swapaxes(-1, -2), gg, out=tv, candidates=THREAD_SAFE)   # P'^T dout
                matmul(dp.swapaxes(-1, -2), qg, out=tk_, candidates=THREAD_SAFE)  # dS^T q
                matmul(dp, k_p[:, c0:c1], out=tq_, candidates=THREAD_SAFE)       # dS k
                _accumulate(dv_p, tv, dk_p, tk_, c0, dq_acc, tq_, idx == 0)
            dq_p[:, r0:r1] = _view(dq_flat, (h1 - h0, n_r, d_k))
        dk[b, a0:a1], dv[b, a0:a1] = dk_p, dv_p
        for grad in (dq_p, dk[b, a0:a1], dv[b, a0:a1]):
            flush_subnormal(grad[None], tiny)

    _run(parts(n_b, n_kv, group, q.itemsize), n_b * n_h * tq * tk, backward_part)
    return dq, dk, dv


def _run(part_list, n_scores, fn):
    """fn(part) for every part, on the runtime's worker threads from ``SPLIT_MIN`` scores on
    (parts write disjoint outputs: who computes which changes no bit), else on this thread."""
    parallel = len(part_list) >= 2 and n_scores >= SPLIT_MIN
    runtime.run_parts(fn, part_list, max_workers=None if parallel else 1)
