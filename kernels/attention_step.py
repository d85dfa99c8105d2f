"""Attention of a decoding step: a few queries per row against the cached keys and values, in
one Numba pass per row, with no score array in memory.

Same maths as :func:`npformer.functional.attention_forward` in evaluation (no dropout, no
cache for a backward): out = softmax(q k^T / sqrt(dk) + mask) v. Where a cached step calls it,
the query is tiny: self-attention has one new query per row against the t cached positions
(q (R, H, 1, dk), k, v (R, Hkv, t, d)); cross-attention has a source's beams as Tq query
positions against its memory (q (n, H, beams, dk), k, v (n, Hkv, S, d), a padding mask). A
product per head would be (1 x 32) @ (32 x t): the matrix-product path
(:mod:`npformer.kernels.attention`) then spends its time on the calls and on its score and
probability arrays, not on the arithmetic.

Here one pass computes, for each row b, head h and query i:

1. Scores, 16 keys at a time. The keys k[b, h // G, j] are rows of dk numbers (dk a multiple of
   16): q_i times key j, lane by lane, is a vector of 16 partial products (``vfma`` over the
   16-number chunks of the row). Its 16 lanes must still be added up, for each key; doing that
   one key at a time is a chain of shuffles per key. Instead the 16 keys' vectors are folded
   together (``vfold8`` .. ``vfold1`` of :mod:`npformer.kernels._simd`): four rounds of
   "add the two halves of each block, and pack two vectors into one" leave a single vector
   whose lane l holds key l's score. Then score * scale + bias, the bias 0 where a key may be
   attended and -inf where it is masked (and past the last key: the block's unused lanes).
2. The softmax over the row's keys: its maximum (:func:`npformer.kernels._rows.row_max`),
   subtracted; exp; its total. The exp runs once per row b over all its heads' and queries'
   scores, one long loop that LLVM vectorises (``exp32`` for float32, as
   :mod:`npformer.kernels.attention` does; ``math.exp`` for float64). A query whose keys are
   all masked gets an output of zeros, never NaN.
3. out = (sum_j e_j v_j) * (1 / total): each value row added into 16-lane accumulators, four
   of them (keys j, j+1, j+2, j+3), so that consecutive additions do not wait for each other.

A step reads its whole cache: at a thousand rows that is megabytes per layer, from main memory,
while the arithmetic per key is small. So the pass asks for the next row's keys and values of
each head (``prefetch``, a hint that never faults) while it computes this row's: the memory
is read while the core computes instead of after it.

The keys and values are read in place: the cache's views (b, Hkv, t, d) of a (b, Hkv,
capacity, d) buffer, any strides with unit last stride; query head h reads key/value head
h // G (grouped heads, G = H / Hkv), never repeated. Each row's scores live in a small scratch
array, reused for the next row, that stays in the core's L1 cache. The output is written in
(B, Tq, H, dv) order and returned as a (B, H, Tq, dv) view, so ``merge_heads`` is free.

Rows are cut into parts by the shape alone and run on the runtime's workers
(``npformer.runtime.run_parts``); every output element is computed by one part, always in the
same order, so the bits do not depend on the number of threads. They differ in the last bits
from the matrix-product path's (sums in another order). Shapes this pass does not take (head
sizes that are not multiples of 16, more than ``MAX_QUERIES`` queries: a prompt run in one go)
go to :func:`npformer.kernels.attention.attention_forward`.
"""
import math

import numpy as np
from numba import njit

from npformer import runtime
from npformer.aligned import empty_aligned

from ._jit import FASTMATH, kernel
from ._rows import exp_in_place, row_max
from ._simd import (LANES, prefetch, vadd, vfma, vfold1, vfold2, vfold4, vfold8, vload, vsplat,
                    vstore)
from .attention import _check_qkv, _mask4, attention_forward

MAX_QUERIES = 16                 # more queries per row (a prompt): the matrix-product path
PART_WORK = 1 << 20              # multiply-adds per part (q k^T and P v), about
SPLIT_MIN = 1 << 17              # multiply-adds from which the rows are split over the workers


@njit(inline="always", cache=True)
def _element_strides(x):
    """The strides of x's first three axes, in elements."""
    return x.strides[0] // x.itemsize, x.strides[1] // x.itemsize, x.strides[2] // x.itemsize


@njit(inline="always", fastmath=FASTMATH, cache=True)
def _scores16(q, q0, k, k_row, ksj, j, last, n_chunks, zero_v):
    """The raw scores of query q (its row from element q0) against keys j .. j+15 of one head
    (key r's row from element k_row + r * ksj), as one vector, lane l = key j + l. Keys past
    ``last`` read key ``last`` again (their lanes are masked by the bias: nothing past the end
    is read, no branch). Each key's 16 lane-wise partial products (over the 16-number chunks of
    its row) are folded together with the others' (:mod:`npformer.kernels._simd`), the keys fed
    in bit-reversed order so that the lanes come out in the keys' order."""
    r0, r1 = min(j, last) * ksj + k_row, min(j + 8, last) * ksj + k_row
    r2, r3 = min(j + 4, last) * ksj + k_row, min(j + 12, last) * ksj + k_row
    r4, r5 = min(j + 2, last) * ksj + k_row, min(j + 10, last) * ksj + k_row
    r6, r7 = min(j + 6, last) * ksj + k_row, min(j + 14, last) * ksj + k_row
    r8, r9 = min(j + 1, last) * ksj + k_row, min(j + 9, last) * ksj + k_row
    r10, r11 = min(j + 5, last) * ksj + k_row, min(j + 13, last) * ksj + k_row
    r12, r13 = min(j + 3, last) * ksj + k_row, min(j + 11, last) * ksj + k_row
    r14, r15 = min(j + 7, last) * ksj + k_row, min(j + 15, last) * ksj + k_row
    x0 = x1 = x2 = x3 = x4 = x5 = x6 = x7 = zero_v
    x8 = x9 = x10 = x11 = x12 = x13 = x14 = x15 = zero_v
    for c in range(0, n_chunks * LANES, LANES):
        qc = vload(q, q0 + c)
        x0, x1 = vfma(qc, vload(k, r0 + c), x0), vfma(qc, vload(k, r1 + c), x1)
        x2, x3 = vfma(qc, vload(k, r2 + c), x2), vfma(qc, vload(k, r3 + c), x3)
        x4, x5 = vfma(qc, vload(k, r4 + c), x4), vfma(qc, vload(k, r5 + c), x5)
        x6, x7 = vfma(qc, vload(k, r6 + c), x6), vfma(qc, vload(k, r7 + c), x7)
        x8, x9 = vfma(qc, vload(k, r8 + c), x8), vfma(qc, vload(k, r9 + c), x9)
        x10, x11 = vfma(qc, vload(k, r10 + c), x10), vfma(qc, vload(k, r11 + c), x11)
        x12, x13 = vfma(qc, vload(k, r12 + c), x12), vfma(qc, vload(k, r13 + c), x13)
        x14, x15 = vfma(qc, vload(k, r14 + c), x14), vfma(qc, vload(k, r15 + c), x15)
    y0, y1, y2, y3 = vfold8(x0, x1), vfold8(x2, x3), vfold8(x4, x5), vfold8(x6, x7)
    y4, y5, y6, y7 = vfold8(x8, x9), vfold8(x10, x11), vfold8(x12, x13), vfold8(x14, x15)
    z0, z1, z2, z3 = vfold4(y0, y1), vfold4(y2, y3), vfold4(y4, y5), vfold4(y6, y7)
    return vfold1(vfold2(z0, z1), vfold2(z2, z3))


@njit(inline="always", fastmath=FASTMATH, cache=True)
def _weighted_sum(e, u, n, v, v0, vsj, last, c):
    """sum over keys j < n (a multiple of 4) of e[u + j] * v's key j row, its 16 numbers from
    element c: four accumulators (keys j, j+1, j+2, j+3), added pairwise at the end. Keys past
    ``last`` have e = 0 and read key ``last`` again (adding exact zeros)."""
    zero_v = vsplat(e[u] - e[u])
    a0 = a1 = a2 = a3 = zero_v
    for j in range(0, n, 4):
        a0 = vfma(vsplat(e[u + j]), vload(v, v0 + min(j, last) * vsj + c), a0)
        a1 = vfma(vsplat(e[u + j + 1]), vload(v, v0 + min(j + 1, last) * vsj + c), a1)
        a2 = vfma(vsplat(e[u + j + 2]), vload(v, v0 + min(j + 2, last) * vsj + c), a2)
        a3 = vfma(vsplat(e[u + j + 3]), vload(v, v0 + min(j + 3, last) * vsj + c), a3)
    return vadd(vadd(a0, a1), vadd(a2, a3))


@njit(inline="always", cache=True)
def _prefetch_head(x, x0, x_pos, n_pos, d):
    """Prefetch one head of one row of the cache x (B, Hkv, t, d), from element x0: every cache
    line of its t positions' d numbers."""
    step = 64 // x.itemsize                                  # elements per 64-byte line
    for j in range(n_pos):
        first = x0 + j * x_pos
        for c in range(0, d, step):
            prefetch(x, first + c)
        prefetch(x, first + d - 1)                           # (a row may straddle a line)


@kernel
def _attend_rows(q, k, v, bias, scale, neg_inf, fast_exp, out, b0, b1):
    """out[b, i, h] for rows b0 .. b1-1: the three steps of the module docstring.

    q (B, H, Tq, dk), k (B, Hkv, Tk, dk), v (B, Hkv, Tk, dv): any strides, unit last stride,
    dk and dv multiples of 16; bias (B|1, H|1, Tq|1, Tkp) contiguous, Tkp = Tk rounded up to a
    multiple of 16, -inf in columns Tk .. Tkp-1; out (B, Tq, H, dv) contiguous."""
    n_h, tq, dk = q.shape[1], q.shape[2], q.shape[3]
    tk, dv = k.shape[2], v.shape[3]
    group = n_h // k.shape[1]
    tkp = bias.shape[3]
    qsb, qsh, qsi = _element_strides(q)
    ksb, ksh, ksj = _element_strides(k)
    vsb, vsh, vsj = _element_strides(v)
    zero, one = scale - scale, scale / scale
    zero_v, scale_v = vsplat(zero), vsplat(scale)
    n_dk, n4 = dk // LANES, -(-tk // 4) * 4                # n4: Tk rounded up to 4
    s = np.empty(n_h * tq * tkp, dtype=q.dtype)             # one row's scores, head by head
    for b in range(b0, b1):
        mb = b if bias.shape[0] > 1 else 0
        for h in range(n_h):                                 # 1. scores, 16 keys at a time
            k_row = b * ksb + (h // group) * ksh
            if b + 1 < q.shape[0] and h % group == 0:        # the next row's keys and values
                _prefetch_head(k, k_row + ksb, ksj, tk, dk)  # of this head on their way
                _prefetch_head(v, b * vsb + (h // group) * vsh + vsb, vsj, tk, dv)
            mh = h if bias.shape[1] > 1 else 0
            for i in range(tq):
                q0 = b * qsb + h * qsh + i * qsi
                u = (h * tq + i) * tkp
                m0 = ((mb * bias.shape[1] + mh) * bias.shape[2]
                      + (i if bias.shape[2] > 1 else 0)) * tkp
                for j in range(0, tkp, LANES):
                    scores = _scores16(q, q0, k, k_row, ksj, j, tk - 1, n_dk, zero_v)
                    vstore(s, u + j, vfma(scores, scale_v, vload(bias, m0 + j)))
                top = row_max(s[u:u + tkp], tkp, neg_inf)    # 2. the softmax: max subtracted
                minus_top = vsplat(zero - top if top != neg_inf else zero)   # all masked: 0
                for j in range(0, tkp, LANES):
                    vstore(s, u + j, vadd(vload(s, u + j), minus_top))
        n = n_h * tq * tkp                                   # exp, over the whole row at once
        exp_in_place(s, n, fast_exp, neg_inf, zero)
        for h in range(n_h):                                 # 3. out = P v
            v_row = b * vsb + (h // group) * vsh
            for i in range(tq):
                u = (h * tq + i) * tkp
                t0 = t1 = t2 = t3 = zero
                for j in range(0, n4, 4):                    # (zeros from Tk on)
                    t0, t1, t2, t3 = t0 + s[u + j], t1 + s[u + j + 1], t2 + s[u + j + 2], \
                        t3 + s[u + j + 3]
                total = (t0 + t1) + (t2 + t3)
                inv = vsplat(one / total if total > zero else zero)
                o0 = ((b * tq + i) * n_h + h) * dv
                for c in range(0, dv, LANES):
                    acc = _weighted_sum(s, u, n4, v, v_row, vsj, tk - 1, c)
                    vstore(out, o0 + c, vfma(acc, inv, zero_v))


def _takes(q, k, v):
    """Whether this pass takes these shapes (the shapes alone decide)."""
    return (q.shape[2] <= MAX_QUERIES and q.shape[3] % LANES == 0 and v.shape[3] % LANES == 0
            and all(x.strides[3] == x.itemsize for x in (q, k, v))
            and all(s % q.itemsize == 0 and s >= 0 for x in (q, k, v) for s in x.strides))


def _padded_bias(mask4, tk, dtype):
    """The mask (B|1, H|1, Tq|1, Tk) as a contiguous bias (.., Tkp): 0 where a key may be
    attended, -inf where masked and in the columns Tk .. Tkp-1 (Tkp: Tk rounded up to 16)."""
    tkp = -(-tk // LANES) * LANES
    bias = np.full(mask4.shape[:3] + (tkp,), -np.inf, dtype=dtype)
    bias[..., :tk] = np.where(mask4, dtype.type(0.0), dtype.type(-np.inf))
    return bias


def attention_step(q, k, v, mask=None):
    """out = softmax(q k^T / sqrt(dk), mask) v in evaluation (no dropout, nothing kept for a
    backward), as ``attention_forward(q, k, v, mask)[0]``.

    Shape: q (B, H, Tq, dk), k (B, Hkv, Tk, dk), v (B, Hkv, Tk, dv), Hkv dividing H (query head
    h reads key/value head h // (H / Hkv), in place), mask bool broadcastable to (B, H, Tq, Tk),
    True = may attend -> out (B, H, Tq, dv), a view of a (B, Tq, H, dv) array."""
    _check_qkv(q, k, v)
    n_b, n_h, tq, d_k = q.shape
    tk, d_v = k.shape[2], v.shape[3]
    mask4 = _mask4(mask, (n_b, n_h, tq, tk))
    if not _takes(q, k, v) or tk == 0:
        return attention_forward(q, k, v, mask4)[0]
    dtype = q.dtype.type
    bias = _padded_bias(mask4, tk, q.dtype)
    out = empty_aligned((n_b, tq, n_h, d_v), q.dtype)                # (B, Tq, H, dv)
    per_row = n_h * tq * tk * (d_k + d_v)                            # multiply-adds
    rows = max(1, PART_WORK // per_row)
    parts = [(lo, min(lo + rows, n_b)) for lo in range(0, n_b, rows)]
    args = (dtype(1.0 / math.sqrt(d_k)), dtype(-np.inf), q.dtype == np.float32, out)
    runtime.run_parts(lambda part: _attend_rows(q, k, v, bias, *args, *part), parts,
                      max_workers=None if n_b * per_row >= SPLIT_MIN else 1)
    return out.transpose(0, 2, 1, 3)
