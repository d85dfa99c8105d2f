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
  the Numba pass, to the product that reads them. The parts depend on the shape alone (and,
  when masked keys are skipped, on the mask's blocks: see below).
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

Masked keys are skipped where a mask makes whole blocks of the scores useless. Under a causal
mask (GPT's training: query i attends keys 0 .. i) about half of each Tq x Tk score matrix is
masked, and a masked entry is exactly 0 in P, P' and dS whatever q, k, v hold. So
:func:`_row_blocks` reads the mask (over every batch element and head) and cuts the query rows
into at most ``ROW_BLOCKS`` blocks of at least ``MIN_BLOCK_ROWS`` rows, each with the number c1
of leading keys any of its rows may attend (c1 = r1 for the causal mask, ``start + r1`` for
``causal_mask(t, start)``). Where that leaves out at least ``SKIP_MIN`` of the products' work:

- forward, per row block [r0, r1): S = q k^T over keys [0, c1) only; the softmax over those c1
  columns, the block's columns from c1 on written as exact zeros in P and P' (the cache holds
  what the reference's holds); out = P' v over keys [0, c1);
- backward: dP' = dout v^T, dS and dq = dS k per row block over keys [0, c1); dv = P'^T dout and
  dk = dS^T q per *key* block [k0, k1), over query rows from the first that attends one of
  them (every earlier row has P' = dS = 0 there). Each entry of dq, dk, dv comes from one
  product, so nothing is added up across calls.

What is left out is products with exact zeros and sums of exact zeros, so the results are the
reference's up to rounding (a shorter product may group its sums differently). The blocks
depend on the mask and the shape alone, so the bits are still the same in every run and on any
number of threads. At T = 128 (4 blocks of 32 rows) the products do 10/16 of the full work; the
element-wise passes gain less, since they still write every entry of P and P', and each row
costs about the same whatever its length (its loops run over c1 rounded up to a multiple of
``VECTOR_RUN``, so that they vectorise). A causal mask of fewer than 96 queries (2 blocks at
most, too little saved to pay for the extra calls) and a mask without such blocks (none, a
padding mask unless every sequence is padded at its end) take the full path, unchanged.

Outputs are written in (B, T, H, d) order and returned as (B, H, T, d) views, so ``merge_heads``
afterwards is a free reshape; :func:`attention_backward_into` writes dq, dk, dv straight into the
caller's buffers (the self-attention module passes three slices of one (B, T, 3D) array). P, P'
and those outputs come from :mod:`npformer.aligned`'s pool (arrays of 4 MiB and more), so the
next step reuses their memory instead of having it mapped afresh (a page fault per page).

Grouped key/value heads (k, v with Hkv heads, H / Hkv = G query heads each) are read in place,
never repeated: each product runs over the batch axes (b*Hkv, G), the queries of a key/value
head's group side by side (:func:`_by_group`) and its keys or values read through a stride of 0
(:func:`_shared`), so every product reads the numbers it would read on repeated heads. The
backward writes each query head's dk, dv into a part's scratch and sums a group's into its
key/value head inside the same part, in the heads' order (:func:`_sum_groups`); parts over
heads hold whole groups. The bits are those of repeated heads, on any number of threads.

Long contexts take :mod:`npformer.kernels.blocked_attention` instead (FlashAttention's online
softmax over key blocks; the backward recomputes the scores block by block): it keeps no
B*H*Tq*Tk array at all, only the output and two numbers per query row. The rule reads the shape
alone (:func:`use_blocked`): at least ``BLOCKED_MIN_KEYS`` keys and ``BLOCKED_MIN_QUERIES``
queries, or scores of ``BLOCKED_MIN_BYTES`` and more (grouped key/value heads as their
query heads' shapes would go). Its cache has None where this one holds
P and P' (``cache[3]``, the attention weights a module exposes for plots), and the backward
below recognises it. Shorter sequences (every recipe's, T <= 128) take the path above, unchanged.
"""
import math

import numpy as np
from numba import njit

from npformer import runtime
from npformer.aligned import empty_aligned

from . import blocked_attention
from ._fastexp import exp32
from ._jit import kernel
from ._rows import exp_in_place as _exp_in_place
from ._rows import flush_subnormal as _flush_subnormal
from ._rows import row_max as _row_max
from .dropout import keep_mask
from .matmul import THREAD_SAFE, matmul

SPLIT_MIN = 1 << 15              # score entries (B*H*Tq*Tk) from which both cores work
CHUNK_BYTES = 1 << 19            # scores per part, sized to stay in L2 between the products
ROW_BLOCKS = 4                   # skipping masked keys: the query rows in at most 4 blocks ...
MIN_BLOCK_ROWS = 32              # ... of at least 32 rows ...
SKIP_MIN = 0.3                   # ... when that skips at least this share of the products' work
BLOCK_CHUNK_BYTES = 1 << 20      # scores computed per part when skipping (each block's in L2)
VECTOR_RUN = 64                  # LLVM vectorises a loop this many elements at a time
BLOCKED_MIN_KEYS = 512           # the blocked path from this many keys ...
BLOCKED_MIN_QUERIES = 64         # ... and queries (a decoding step's one query keeps the above),
BLOCKED_MIN_BYTES = 1 << 28      # or from scores (B*H*Tq*Tk) of this many bytes


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
            _exp_in_place(head, tq_tk, fast_exp, neg_inf, zero)   # one long loop: vectorised
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
def _softmax_rows_backward(dp, probs, keep, drop_scale, use_dropout, scale, tiny):
    """In place: dp (R, Tk) = dL/d(dropped probs) -> dL/d(raw scores):
    dropout backward, softmax backward ds = p (dp - sum(dp p)), times the score scale;
    entries below ``tiny`` (the dtype's smallest normal number) in magnitude become 0."""
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
            g = probs[r, j] * (dp[r, j] - dot) * scale
            dp[r, j] = g if abs(g) >= tiny else zero


@njit(inline="always", cache=True)
def _padded(c1, tk):
    """c1 rounded up to a multiple of VECTOR_RUN (at most tk): a loop over the first c1 columns
    would run its last c1 % 64 iterations scalar (all of them for c1 = 32); over this many, with
    the columns from c1 on made neutral, it is vectorised throughout."""
    return min(tk, (c1 + VECTOR_RUN - 1) // VECTOR_RUN * VECTOR_RUN)


@kernel
def _softmax_block(s, bias, n_h, r0, r1, c1, scale, neg_inf, fast_exp, keep, drop_scale,
                   use_dropout, probs_d):
    """In place, rows r0 .. r1-1 of each head of s (B*H, Tq, Tk): the raw scores in the first c1
    columns -> softmax(scale * s + bias) over those c1 keys; columns c1 .. Tk-1 (keys no row of
    the block may attend, never computed, possibly garbage) become exactly 0, in s and probs_d.

    As :func:`_softmax_rows` otherwise (bias (B|1, H|1, Tq|1, Tk), a fully masked row gives 0,
    probs_d = probs * keep * drop_scale with dropout), one row at a time. The loops run over the
    padded length (:func:`_padded`) with columns c1 .. n-1 taken as masked (-inf, so exp gives 0):
    what a row sums is its c1 values plus exact zeros."""
    n_bh, tq, tk = s.shape
    zero, one = scale - scale, scale / scale                 # 0 and 1 in the dtype of s
    n = _padded(c1, tk)
    x = np.zeros(tk, dtype=s.dtype)                          # one row; stays 0 from n on
    for bh in range(n_bh):                                   # (3-D indexing, no row views:
        mb = bh // n_h if bias.shape[0] > 1 else 0           #  a view per row costs more than
        mh = bh % n_h if bias.shape[1] > 1 else 0            #  a short row's arithmetic)
        mq = bias.shape[2] > 1
        for i in range(r0, r1):
            mi = i if mq else 0
            for j in range(n):                               # scale, mask (garbage from c1 on:
                y = s[bh, i, j] * scale + bias[mb, mh, mi, j]    # selected away, never used)
                x[j] = y if j < c1 else neg_inf
            row_max = _row_max(x, n, neg_inf)
            if row_max == neg_inf:                           # all masked: the row becomes 0
                row_max = zero
            total = zero
            if fast_exp:                                     # exp32 stops at exp(-87) > 0
                for j in range(n):
                    e = exp32(x[j] - row_max)
                    e = e if x[j] != neg_inf else zero
                    x[j] = e
                    total += e
            else:
                for j in range(n):
                    e = math.exp(x[j] - row_max)
                    x[j] = e
                    total += e
            inv = one / total if total > zero else zero
            if use_dropout:                                  # normalise, dropout; x is 0
                for j in range(tk):                          # from n on: so are the rows
                    y = x[j] * inv
                    s[bh, i, j] = y
                    probs_d[bh, i, j] = y * drop_scale if keep[bh, i, j] else zero
            else:
                for j in range(tk):
                    s[bh, i, j] = x[j] * inv


@kernel
def _softmax_block_backward(dp, probs, keep, r0, r1, c1, drop_scale, use_dropout, scale, tiny):
    """In place, rows r0 .. r1-1 of each head of dp (B*H, Tq, Tk), first c1 columns:
    dL/d(dropped probs) -> dL/d(raw scores), as :func:`_softmax_rows_backward` (probs, keep
    shaped as dp). Columns from c1 on hold garbage, before and after: nothing reads them (the
    loops run over the padded length, :func:`_padded`, and leave them out of the row's sum)."""
    n_bh, tq, tk = dp.shape
    zero = scale - scale
    n = _padded(c1, tk)
    for bh in range(n_bh):
        for i in range(r0, r1):
            if use_dropout:
                for j in range(n):
                    dp[bh, i, j] = dp[bh, i, j] * drop_scale if keep[bh, i, j] else zero
            dot = zero
            for j in range(n):
                y = dp[bh, i, j] * probs[bh, i, j]
                dot += y if j < c1 else zero
            for j in range(n):
                g = probs[bh, i, j] * (dp[bh, i, j] - dot) * scale
                dp[bh, i, j] = g if abs(g) >= tiny else zero


_TRUE = np.ones((1, 1, 1, 1), dtype=bool)              # no mask: every key may be attended
_TRUE_2D = np.ones((1, 1), dtype=bool)        # stands in for the keep-mask without dropout
_TRUE_3D = np.ones((1, 1, 1), dtype=bool)     # the same, for the row-block kernels


def _check_qkv(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention_forward: expected q, k, v of shape (B, H, T, d), got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if (q.shape[0] != k.shape[0] or k.shape[1] < 1 or q.shape[1] % k.shape[1]
            or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]):
        raise ValueError(f"attention_forward: q (B, H, Tq, dk), k (B, Hkv, Tk, dk), "
                         f"v (B, Hkv, Tk, dv) with Hkv dividing H do not agree, got {q.shape}, "
                         f"{k.shape}, {v.shape}")
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


def _parts(shape, itemsize, blocks=None, group=1):
    """How the heads are divided: (parts, parallel). parts lists (axis, lo, hi), axis 0 = B or
    1 = H (when B = 1); each part's scores take about CHUNK_BYTES, so they stay in the core's L2
    cache from the product that writes them to the one that reads them, and there are at least
    two parts when there are two batch elements (or heads). Below SPLIT_MIN scores everything
    runs on this thread (parallel is False). The parts depend on the shape alone.

    With row ``blocks`` (:func:`_row_blocks`) a part's scores are computed block by block: its
    parts hold about BLOCK_CHUNK_BYTES of computed scores (fewer, larger parts: each now makes
    several calls per product, and what must stay in L2 is one block's scores).

    Grouped key/value heads (``group`` query heads each): a part over heads holds whole groups,
    so that one part computes all of a key/value head's gradient; lo, hi then count key/value
    heads (:func:`_part`)."""
    n_b, n_h, tq, tk = shape
    axis, n = (0, n_b) if n_b > 1 else (1, n_h // group)
    if blocks is None:
        chunk, per_head = CHUNK_BYTES, tq * tk
    else:
        chunk, per_head = BLOCK_CHUNK_BYTES, sum((r1 - r0) * c1 for r0, r1, c1 in blocks)
    step = max(1, chunk // max(1, per_head * itemsize * (n_h if axis == 0 else group)))
    parallel = n >= 2 and n_b * n_h * tq * tk >= SPLIT_MIN
    if parallel:
        step = min(step, -(-n // 2))
    return [(axis, lo, min(lo + step, n)) for lo in range(0, n, step)], parallel


def _row_blocks(mask4, tq, tk):
    """The query rows in blocks, each with the keys its rows may attend: a list of (r0, r1, c1),
    rows r0 .. r1-1 attend no key from c1 on in any batch element or head (c1 never decreases
    from one block to the next), or None where that skips less than SKIP_MIN of the products'
    work (no mask, a padding mask: the full path is taken).

    Causal masks: T = 128 gives blocks of 32 rows and c1 = 32, 64, 96, 128, i.e. 10/16 of the
    work; ``causal_mask(t, start)`` (decoding's prefill) gives c1 = start + r1."""
    n_blocks = min(ROW_BLOCKS, tq // MIN_BLOCK_ROWS)
    if n_blocks < 2 or tk == 0:
        return None
    rows = -(-tq // n_blocks)
    seen = mask4.any(axis=(0, 1))                            # (Tq|1, Tk) any batch element, head
    needs = np.where(seen.any(axis=1), tk - np.argmax(seen[:, ::-1], axis=1), 0)  # last True + 1
    needs = np.broadcast_to(needs, (tq,))                    # keys each query row needs
    blocks, c1 = [], 0
    for r0 in range(0, tq, rows):
        r1 = min(r0 + rows, tq)
        c1 = max(c1, int(needs[r0:r1].max()))
        blocks.append((r0, r1, c1))
    work = sum((r1 - r0) * c1 for r0, r1, c1 in blocks)
    return blocks if work <= (1.0 - SKIP_MIN) * tq * tk else None


def _key_blocks(blocks):
    """The keys in blocks, from row ``blocks``: (c0, c1, r0), keys c0 .. c1-1 are attended by
    query rows r0 .. Tq-1 only (every earlier row block stops before c0)."""
    keys, c0 = [], 0
    for r0, _, c1 in blocks:
        if c1 > c0:
            keys.append((c0, c1, r0))
            c0 = c1
    return keys


def _part(x, part, group=1):
    """x restricted to one part: x[lo:hi] along the part's axis (a size-1, broadcast axis stays).
    A part over heads counts key/value heads: an array of query heads (``group`` per key/value
    head) gives its heads lo * group .. hi * group - 1."""
    axis, lo, hi = part
    if x.shape[axis] == 1:
        return x
    return x[lo:hi] if axis == 0 else x[:, lo * group:hi * group]


def _merges(x):
    """Whether x's (batch, head) axes merge into one axis without a copy."""
    return x.shape[0] == 1 or x.strides[0] == x.strides[1] * x.shape[1]


def _by_group(x, group):
    """Query heads (b, H, m, n) in the batch axes of a grouped product: (b*Hkv, G, m, n), the G
    query heads of each key/value head side by side (query head h = G*a + g is entry (a, g)). A
    view where x's heads follow one another in memory, else a contiguous copy of x (a part's
    output gradient, a strided view of the output projection's gradient). Group 1: x."""
    if group == 1:
        return x
    b, h, m, n = x.shape
    return (x if _merges(x) else np.ascontiguousarray(x)).reshape(b * h // group, group, m, n)


def _written_by_group(x, group):
    """An output of query heads (b, H, m, n) in the batch axes of a grouped product: the view of
    :func:`_by_group` where there is one, else a scratch array that :func:`_put_back` copies
    into x afterwards. Group 1: x."""
    if group == 1 or _merges(x):
        return _by_group(x, group)
    b, h, m, n = x.shape
    return empty_aligned((b * h // group, group, m, n), x.dtype)


def _put_back(written, x):
    """x = what :func:`_written_by_group` gave for it, where that was not a view of x."""
    if not np.may_share_memory(written, x):
        x[...] = written.reshape(x.shape)


def _shared(x, group):
    """Key or value heads (b, Hkv, m, n) read in place by their groups of query heads:
    (b*Hkv, G, m, n) whose G axis has stride 0, so that each head serves its G query heads in the
    products without being repeated (no (b, H, m, n) copy; where a product's variant copies its
    operand, it copies the Hkv heads once: kernels/matmul.py's ``_copied``). Heads that do not
    merge with the batch axis are first copied, at Hkv heads, in their own orientation (k^T stays
    a transposed view: BLAS's one-row products sum in an order that follows it). Group 1: x."""
    if group == 1:
        return x
    b, hkv, m, n = x.shape
    if not _merges(x):
        transposed = x.strides[-1] != x.itemsize
        x = (np.ascontiguousarray(x.swapaxes(-1, -2)).swapaxes(-1, -2) if transposed
             else np.ascontiguousarray(x))
    heads = x.reshape(b * hkv, m, n)                                 # a view
    return np.lib.stride_tricks.as_strided(                          # (never written through)
        heads, (b * hkv, group, m, n), (heads.strides[0], 0) + heads.strides[1:])


def _per_query_head(x, group):
    """Where a part's products write dk or dv of each query head before the group sums: x itself
    (group 1: one query head per key/value head), else a (b*Hkv, G, Tk, d) scratch array."""
    if group == 1:
        return x
    b, hkv, m, n = x.shape
    return empty_aligned((b * hkv, group, m, n), x.dtype)


@kernel(fastmath=False)                 # no reassociation: the order of the sum is the point
def _sum_flushed(per_head, x, tiny):
    """x[i, a] = the sum over g of per_head[i * Hkv + a, g], each term's subnormal entries
    (below ``tiny`` in magnitude) first set to 0, added in the order g = 0, 1, ... Shapes: x
    (b, Hkv, m, n), any strides; per_head (b*Hkv, G, m, n)."""
    n_b, n_kv, n_m, n_n = x.shape
    zero = tiny - tiny
    for i in range(n_b):
        for a in range(n_kv):
            r = i * n_kv + a
            for t in range(n_m):
                for j in range(n_n):
                    y = per_head[r, 0, t, j]
                    x[i, a, t, j] = zero if abs(y) < tiny else y
                for g in range(1, per_head.shape[1]):
                    for j in range(n_n):
                        y = per_head[r, g, t, j]
                        x[i, a, t, j] += zero if abs(y) < tiny else y


def _sum_groups(per_head, x, group, tiny):
    """x (b, Hkv, Tk, d) = each group's per-query-head gradients (b*Hkv, G, Tk, d), subnormals
    set to 0 (as each head's own gradient), summed in the heads' order ((h_0 + h_1) + h_2) + ...,
    in one pass inside one part, so that no sum depends on the parts or the threads (the order
    of NumPy's sum over the heads of repeated keys). Group 1: per_head is x, only flushed."""
    if group == 1:
        _flush_subnormal(x, tiny)
    else:
        _sum_flushed(per_head, x, tiny)


def _run(parts, parallel, fn):
    """fn(part) for every part: on the runtime's worker threads when ``parallel`` (each takes the
    next part nobody has taken, so a thread the machine slows down simply does fewer), else on
    this thread. Parts write disjoint outputs, so who computes which changes no bit."""
    runtime.run_parts(fn, parts, max_workers=None if parallel else 1)


def _flat(x, shape):
    """A reshaped view of x (never a copy: the kernels write into it)."""
    view = x.reshape(shape)
    if not np.may_share_memory(view, x):      # reshape copies where no view exists
        raise ValueError(f"an array of shape {x.shape} and strides {x.strides} has no "
                         f"view of shape {shape}")
    return view


def use_blocked(q_shape, k_shape, itemsize):
    """Whether attention of these shapes takes the blocked path (shapes alone decide; grouped
    key/value heads take the path their query heads' shapes would)."""
    n_b, n_h, tq, _ = q_shape
    tk = k_shape[2]
    return ((tk >= BLOCKED_MIN_KEYS and tq >= BLOCKED_MIN_QUERIES)
            or n_b * n_h * tq * tk * itemsize >= BLOCKED_MIN_BYTES)


def reads_grouped_kv(q_shape, kv_shape, itemsize):
    """Whether a module with grouped key/value heads should hand ``attention_forward`` its kv
    heads as they are (k, v (B, Hkv, Tk, d)) instead of repeated to the query heads: always.
    Both paths read a group's shared head in place for all its query heads and return dk, dv
    per kv head (the fused path: :func:`_shared`, :func:`_sum_groups`; the blocked one:
    :mod:`npformer.kernels.blocked_attention`)."""
    return True


def attention_forward(q, k, v, mask=None, dropout_p=0.0, rng=None, training=False):
    """out = dropout(softmax(q k^T / sqrt(d_k), mask)) v, as the NumPy reference.

    Shape: q (B, H, Tq, dk), k (B, Hkv, Tk, dk), v (B, Hkv, Tk, dv), mask bool broadcastable to
    (B, H, Tq, Tk), True = may attend -> out (B, H, Tq, dv). Hkv = H, or a divisor of H (grouped
    key/value heads: query head i reads key/value head i // (H / Hkv), in place: no head is
    repeated, each product reads its key/value head with a zero stride, :func:`_shared`; the
    cache then holds a contiguous copy of q, whose heads the products read group by group). The
    dropout mask is drawn from ``rng`` exactly as the reference draws it, so both backends see
    the same masks. Long sequences (:func:`use_blocked`) keep no probabilities: ``cache[3]`` is
    None there.
    """
    _check_qkv(q, k, v)
    n_b, n_h, tq, d_k = q.shape
    tk, d_v = k.shape[2], v.shape[3]
    full = (n_b, n_h, tq, tk)
    group = n_h // k.shape[1]                                        # query heads per kv head
    dtype = q.dtype.type
    mask4 = _mask4(mask, full)                                       # (B|1, H|1, Tq|1, Tk)
    if use_blocked(q.shape, k.shape, q.itemsize):
        return blocked_attention.attention_forward(q, k, v, mask4, dropout_p, rng, training)
    if group > 1 and not _merges(q):          # the products read a group's queries side by
        q = np.ascontiguousarray(q)           # side: copied once, kept for the backward's too
    bias = np.where(mask4, dtype(0.0), dtype(-np.inf))
    blocks = _row_blocks(mask4, tq, tk)                              # None: every key computed
    scale = 1.0 / math.sqrt(d_k)
    use_dropout = bool(training and dropout_p > 0.0)
    probs = empty_aligned(full, q.dtype)                             # (B, H, Tq, Tk)
    if use_dropout:
        keep = keep_mask(full, dropout_p, rng)                 # same draws as the reference
        drop_scale = q.dtype.type(1.0 / (1.0 - dropout_p))
        probs_d = empty_aligned(full, q.dtype)
        drop_cache = (keep, drop_scale)
    else:
        keep, drop_scale, probs_d, drop_cache = None, q.dtype.type(1.0), probs, None
    out = empty_aligned((n_b, tq, n_h, d_v), q.dtype)                 # (B, Tq, H, dv)
    out_bhtd = out.transpose(0, 2, 1, 3)                             # (B, H, Tq, dv) view
    kt = k.swapaxes(-1, -2)                                          # (B, H, dk, Tk) view

    # Grouped heads: each product's batch axes are (b*Hkv, G), query-head operands through
    # _by_group (views of P, P' and of q's copy), key/value ones through _shared (stride 0).
    def forward_part(part):
        p, p_d = _part(probs, part, group), _part(probs_d, part, group)
        o = _part(out_bhtd, part, group)
        o_g = _written_by_group(o, group)
        matmul(_by_group(_part(q, part, group), group), _shared(_part(kt, part), group),
               out=_by_group(p, group), candidates=THREAD_SAFE)     # (B,H,Tq,Tk)
        heads = (p.shape[0] * p.shape[1], tq * tk)                   # (B*H, Tq*Tk) views
        _softmax_rows(_flat(p, heads), _part(bias, part, group), p.shape[1], dtype(scale),
                      dtype(-np.inf), q.dtype == np.float32,
                      _flat(_part(keep, part, group), heads) if use_dropout else _TRUE_2D,
                      drop_scale, use_dropout, _flat(p_d, heads))    # probs (B, H, Tq, Tk)
        matmul(_by_group(p_d, group), _shared(_part(v, part), group), out=o_g,
               candidates=THREAD_SAFE)                               # (B,H,Tq,dv)
        _put_back(o_g, o)

    def forward_blocks(part):                  # row block by row block, keys [0, c1) only
        p, p_d = _part(probs, part, group), _part(probs_d, part, group)
        o = _part(out_bhtd, part, group)
        o_g, p_g, pd_g = _written_by_group(o, group), _by_group(p, group), _by_group(p_d, group)
        q_p, v_p = _by_group(_part(q, part, group), group), _shared(_part(v, part), group)
        kt_p = _shared(np.ascontiguousarray(_part(kt, part)), group)   # (b, Hkv, dk, Tk), once
        heads = (p.shape[0] * p.shape[1], tq, tk)                    # (b*H, Tq, Tk) views
        keep_p = _flat(_part(keep, part, group), heads) if use_dropout else _TRUE_3D
        for r0, r1, c1 in blocks:
            matmul(q_p[:, :, r0:r1], kt_p[..., :c1], out=p_g[:, :, r0:r1, :c1],
                   candidates=THREAD_SAFE)                           # S block  (b,H,R,c1)
            _softmax_block(_flat(p, heads), _part(bias, part, group), p.shape[1], r0, r1, c1,
                           dtype(scale), dtype(-np.inf), q.dtype == np.float32, keep_p,
                           drop_scale, use_dropout, _flat(p_d, heads))  # P, P' rows (0 from c1)
            matmul(pd_g[:, :, r0:r1, :c1], v_p[:, :, :c1], out=o_g[:, :, r0:r1],
                   candidates=THREAD_SAFE)                           # out rows (b,H,R,dv)
        _put_back(o_g, o)
    if blocks is None:
        _run(*_parts(full, q.itemsize, group=group), forward_part)
    else:
        _run(*_parts(full, q.itemsize, blocks, group), forward_blocks)
    return out_bhtd, (q, k, v, probs, probs_d, drop_cache, scale, blocks)


def attention_backward_into(dout, cache, dq, dk, dv):
    """attention_backward writing into given arrays dq (B, H, Tq, dk), dk (B, Hkv, Tk, dk),
    dv (B, Hkv, Tk, dv) (views of a larger buffer are fine). Returns (dq, dk, dv)."""
    q, k, v, probs, probs_d, drop_cache, scale = cache[:7]
    blocks = cache[7] if len(cache) > 7 else None          # (the reference's cache has none)
    n_b, n_h, tq, d_k = q.shape
    tk, d_v = k.shape[2], v.shape[3]
    if dout.shape != (n_b, n_h, tq, d_v):
        raise ValueError(f"dout: expected shape {(n_b, n_h, tq, d_v)}, got {dout.shape}")
    for name, arr, shape in (("dq", dq, q.shape), ("dk", dk, k.shape), ("dv", dv, v.shape)):
        if arr.shape != shape or arr.dtype != q.dtype:
            raise ValueError(f"{name}: expected a {q.dtype} array of shape {shape}, got "
                             f"{arr.dtype} {arr.shape}")
    if isinstance(blocks, blocked_attention.Saved):        # the blocked path's cache
        return blocked_attention.attention_backward_into(dout, cache, dq, dk, dv)
    if drop_cache is None:
        keep, drop_scale, use_dropout = None, q.dtype.type(1.0), False
    else:
        (keep, drop_scale), use_dropout = drop_cache, True
    dout = dout.astype(q.dtype, copy=False)
    vt = v.swapaxes(-1, -2)                                          # (B, Hkv, dv, Tk) view
    tiny = np.finfo(q.dtype).tiny             # dS, dq, dk, dv: subnormals -> 0, as the reference
    group = n_h // k.shape[1]                                        # query heads per kv head

    def targets(part):
        """A part's dq in the products' batch axes, and where they write dk, dv of each query
        head (grouped heads: scratch that :func:`finish` sums into dk, dv)."""
        return (_written_by_group(_part(dq, part, group), group),
                _per_query_head(_part(dk, part), group), _per_query_head(_part(dv, part), group))

    def finish(part, dq_g, dk_h, dv_h):
        """Subnormals -> 0 (of each query head's dk, dv: the reference's order), dq into place,
        each group's dk and dv summed into its key/value head's."""
        _flush_subnormal(dq_g, tiny)
        _put_back(dq_g, _part(dq, part, group))
        _sum_groups(dk_h, _part(dk, part), group, tiny)
        _sum_groups(dv_h, _part(dv, part), group, tiny)

    def backward_part(part):
        p, p_d = _part(probs, part, group), _part(probs_d, part, group)
        g = _by_group(_part(dout, part, group), group)
        dq_g, dk_h, dv_h = targets(part)
        matmul(_by_group(p_d, group).swapaxes(-1, -2), g, out=dv_h,
               candidates=THREAD_SAFE)                               # dv = P'^T dout (B,H,Tk,dv)
        ds = matmul(g, _shared(_part(vt, part), group),
                    candidates=THREAD_SAFE)                          # dP' = dout v^T (B,H,Tq,Tk)
        rows = (ds.size // tk, tk)
        _softmax_rows_backward(_flat(ds, rows), _flat(p, rows),
                               _flat(_part(keep, part, group), rows) if use_dropout else _TRUE_2D,
                               drop_scale, use_dropout, q.dtype.type(scale), tiny)   # dS
        matmul(ds, _shared(_part(k, part), group), out=dq_g,
               candidates=THREAD_SAFE)                               # dq = dS k      (B,H,Tq,dk)
        matmul(ds.swapaxes(-1, -2), _by_group(_part(q, part, group), group), out=dk_h,
               candidates=THREAD_SAFE)                               # dk = dS^T q    (B,H,Tk,dk)
        finish(part, dq_g, dk_h, dv_h)

    def backward_blocks(part):
        """dv per key block [k0, k1) over the rows r0 .. Tq-1 that may attend it; dP', dS and dq
        per row block [r0, r1) over keys [0, c1); then dk per key block (it reads the dS of
        rows from r0 on, all done by then). Every entry of dq, and of each query head's dk and
        dv, is one product's, computed once: nothing is accumulated across calls."""
        p, p_d = _part(probs, part, group), _part(probs_d, part, group)
        g = _by_group(_part(dout, part, group), group)
        q_p, k_p = _by_group(_part(q, part, group), group), _shared(_part(k, part), group)
        dq_g, dk_h, dv_h = targets(part)
        vt_p = _shared(np.ascontiguousarray(_part(vt, part)), group)   # (b, Hkv, dv, Tk), once
        ds = empty_aligned(p.shape, q.dtype)                 # dP', then dS: written where read
        ds_g, pd_g = _by_group(ds, group), _by_group(p_d, group)
        heads = (p.shape[0] * p.shape[1], tq, tk)                    # (b*H, Tq, Tk) views
        keep_p = _flat(_part(keep, part, group), heads) if use_dropout else _TRUE_3D
        for k0, k1, r0 in key_blocks:                               # keys [k0, k1): rows r0..
            matmul(pd_g[:, :, r0:, k0:k1].swapaxes(-1, -2), g[:, :, r0:], out=dv_h[:, :, k0:k1],
                   candidates=THREAD_SAFE)                           # dv = P'^T dout (b,H,C,dv)
        for r0, r1, c1 in blocks:                                    # query rows [r0, r1)
            matmul(g[:, :, r0:r1], vt_p[..., :c1], out=ds_g[:, :, r0:r1, :c1],
                   candidates=THREAD_SAFE)                           # dP' = dout v^T (b,H,R,c1)
            _softmax_block_backward(_flat(ds, heads), _flat(p, heads), keep_p, r0, r1, c1,
                                    drop_scale, use_dropout, q.dtype.type(scale), tiny)
            matmul(ds_g[:, :, r0:r1, :c1], k_p[:, :, :c1], out=dq_g[:, :, r0:r1],
                   candidates=THREAD_SAFE)                           # dq = dS k      (b,H,R,dk)
        for k0, k1, r0 in key_blocks:
            matmul(ds_g[:, :, r0:, k0:k1].swapaxes(-1, -2), q_p[:, :, r0:], out=dk_h[:, :, k0:k1],
                   candidates=THREAD_SAFE)                           # dk = dS^T q    (b,H,C,dk)
        dk_h[:, :, end:] = 0                                         # keys no query attends
        dv_h[:, :, end:] = 0
        finish(part, dq_g, dk_h, dv_h)
    if blocks is None:
        _run(*_parts(probs.shape, q.itemsize, group=group), backward_part)
    else:
        key_blocks = _key_blocks(blocks)
        end = key_blocks[-1][1] if key_blocks else 0
        _run(*_parts(probs.shape, q.itemsize, blocks, group), backward_blocks)
    return dq, dk, dv


def attention_backward(dout, cache):
    """Gradients dq, dk, dv (shapes of q, k, v) of the forward; see the reference for the maths.

    They are (B, H, T, d) views of (B, T, H, d) arrays, so ``merge_heads`` of each is free."""
    q, k, v = cache[:3]
    n_b, n_h, tq, d_k = q.shape
    tk, d_v = k.shape[2], v.shape[3]
    dq = empty_aligned((n_b, tq, n_h, d_k), q.dtype).transpose(0, 2, 1, 3)
    n_kv = k.shape[1]                                                # H, or grouped: Hkv
    dk = empty_aligned((n_b, tk, n_kv, d_k), q.dtype).transpose(0, 2, 1, 3)
    dv = empty_aligned((n_b, tk, n_kv, d_v), q.dtype).transpose(0, 2, 1, 3)
    return attention_backward_into(dout, cache, dq, dk, dv)
