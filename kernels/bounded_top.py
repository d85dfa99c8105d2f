"""The n best next tokens of every row without a float64 ``exp`` over the whole vocabulary: the
fast path of :func:`npformer.kernels.top_log_softmax`, with a proven bound on how far its
log-probabilities may be from the reference's, and a flag per row that says whether its ids and
their order are certainly the reference's (docs/backprop.md#top-log-softmax-without-float64-exp).

The reference's log-normaliser ``lse = log sum_c exp(x_c - max x)`` is a float64 ``exp`` of every
entry. Here the entries within ``HEAD_NATS`` of the row's maximum (the few that carry the mass of
a trained model's row) still take float64's ``math.exp``; every other entry takes the float32
``exp32`` (a vector loop), corrected to first order for the float32 rounding of its argument,
and its relative error (at most ``EXP32_REL_ERROR``) only counts in proportion to that tail's
share of the sum. The selection ranks the entries by their logits (ties by the lower id), which
is the reference's order unless its float64 keys round two different logits to one key: a row is
``sure`` when every neighbour in its n + 1 best is either the same logit or apart by more than
such a rounding.
"""
import math
import warnings

import numpy as np
from numba import njit

from npformer import runtime

from ._fastexp import exp32
from ._jit import FASTMATH, kernel
from .loss import TOP_PART_ROWS
from ._rows import row_max as _row_max
from ._simd import LANES, lowest_bit, vload, vmask_ge, vmax, vmax_lanes

EXP32_REL_ERROR = 2.0 ** -20     # |exp32(x) / exp(x) - 1| on [-87, 0], with a margin of 2 over
                                 # the largest found by trying every float32 there through
                                 # _tail_sum's own loop (4.5e-7, near -87; 2.3e-7 compiled
                                 # without reassociation)
HEAD_NATS = 6.0                  # entries within this of the row's max take float64 exp
EXP32_FLOOR = 1.7e-38            # exp32 of anything below -87 (clamped): its error, at most
ROUNDING = 2.0 ** -50            # a generous multiple of float64's unit roundoff (2**-53)
_F32 = np.float32


@njit(fastmath=FASTMATH, cache=True, nogil=True)
def _tail_sum(row, m, thr):
    """sum of exp(x - m) over the entries x of ``row`` below ``thr``: exp32 of float32(d),
    d = x - m clamped at -87 as exp32 clamps it, times (1 + the part of d that float32 rounded
    away); and how many entries are NaN. A vector loop: the tail of a row is most of it."""
    total = 0.0
    nans = 0
    for j in range(row.shape[0]):
        x = np.float64(row[j])
        d = max(x - m, -87.0)
        f = _F32(d)
        e = np.float64(exp32(f)) * (1.0 + (d - np.float64(f)))
        total += e if x < thr else 0.0
        nans += x != x
    return total, nans


BLOCK = LANES                    # entries _head_and_top passes over on one vector comparison


@njit(cache=True, nogil=True)
def _vector_max(row):
    """The largest entry of ``row``: sixteen running maxima in one vector (one comparison and
    select per 16 entries), reduced once at the end; the last ``len(row) % 16`` entries scalar.
    A maximum is exact, so it is the one of any order (a NaN entry aside: it is passed over here,
    and ``_tail_sum`` counts it, which makes the row not sure)."""
    vocab = row.shape[0]
    full = vocab // LANES * LANES
    m = _row_max(row[full:], vocab - full, -np.inf)
    if full:
        acc = vload(row, 0)
        for j in range(LANES, full, LANES):
            acc = vmax(vload(row, j), acc)
        m = max(m, vmax_lanes(acc))
    return m


@njit(cache=True, nogil=True)
def _head_and_top(row, m, thr, top):
    """One scalar pass over ``row``: the sum of math.exp(x - m) in float64 over the entries x not
    below ``thr`` (the few near the maximum, NaN aside), and in ``top`` (n + 1,) the ids of the
    n + 1 largest x, largest first, ties by the lower id. Kept apart from the vector loop (a
    libm call keeps a whole function's loops scalar). Once n + 1 ids are held, an entry below
    both ``thr`` and the (n + 1)-th so far adds nothing and takes no place, so of each block of
    ``BLOCK`` entries only those one vector comparison finds not below them (:func:`vmask_ge`)
    are visited, in order: most blocks pass on that one comparison."""
    vocab, n1 = row.shape[0], top.shape[0]
    total = 0.0
    held = 0
    floor = -np.inf                                     # x of the (n + 1)-th, once held
    low = -np.inf                                       # below both thr and floor: skipped
    for j in range(0, vocab, BLOCK):
        end = min(j + BLOCK, vocab)
        if end - j < BLOCK:                             # the row's last, shorter block
            if np.float64(_row_max(row[j:end], end - j, -np.inf)) < low:
                continue
            lanes = (1 << (end - j)) - 1
        elif held < n1:                                 # every entry counts until n + 1 are held
            lanes = (1 << BLOCK) - 1
        else:                                           # only those not below low can count
            lanes = vmask_ge(vload(row, j), low)
        while lanes:
            c = j + lowest_bit(lanes)
            lanes &= lanes - 1
            x = np.float64(row[c])
            if not x < thr and x == x:
                total += math.exp(x - m)
            if held == n1 and not x > floor:
                continue
            i = held if held < n1 else n1 - 1           # insert after any equal logit
            while i > 0 and row[top[i - 1]] < x:
                top[i] = top[i - 1]
                i -= 1
            top[i] = c
            if held < n1:
                held += 1
            if held == n1:
                floor = np.float64(row[top[n1 - 1]])
                low = min(floor, thr)
    return total


@njit(cache=True, nogil=True)
def _lse_bound(total, tail, vocab):
    """A bound on |log(total) - the reference's float64 log-sum-exp| for a row whose sum
    ``total`` (>= 1) holds ``tail`` from exp32 (docs/backprop.md derives it)."""
    rel = (ROUNDING * (vocab + 8)
           + (EXP32_REL_ERROR + 1e-10) * tail / (1.0 - EXP32_REL_ERROR) / total
           + vocab * EXP32_FLOOR)
    return 1.01 * rel + ROUNDING * (abs(math.log(total)) + 1.0)


@kernel(fastmath=False)
def _top_rows_bounded(x, offset, offset_err, top, ids, logp, err, sure):
    """For each row r of x (R, V): the n = ids.shape[1] best entries by logit (ties by the lower
    id), their log-probabilities (x - max x) - lse in the reference's order of operations,
    err >= |logp - the reference's| and ``sure[r]``: whether the reference's n best by
    offset[r] + log p (ties by the lower id) are certainly these, in this order. ``top``
    (n + 1,) is scratch; offset (R,) or (0,): none."""
    n_rows, vocab = x.shape
    n, n1 = ids.shape[1], top.shape[0]
    with_offset = offset.shape[0] > 0
    for r in range(n_rows):
        row = x[r]
        s = offset[r] if with_offset else 0.0
        es = offset_err[r] if with_offset else 0.0
        m = np.float64(_vector_max(row))
        thr = m - HEAD_NATS
        tail, nans = _tail_sum(row, m, thr)
        head = _head_and_top(row, m, thr, top)
        total = head + tail                             # >= 1: the maximum's exp(0)
        good = (nans == 0 and math.isfinite(m) and math.isfinite(total) and total >= 1.0
                and not s != s and s < np.inf)
        l = math.log(total) if good else 0.0
        el = _lse_bound(total, tail, vocab) if good else np.inf
        if s == -np.inf:                        # every key is -inf: the reference ranks by id
            for j in range(n1):
                top[j] = j
        prev_d = prev_mag = 0.0
        for j in range(n1):
            c = top[j]
            d = np.float64(row[c]) - m
            lp = d - l
            mag = abs(lp) + abs(s + lp)
            if j > 0 and s > -np.inf and row[c] != row[top[j - 1]] and row[c] > -np.inf:
                # two logits apart: the reference's keys keep them apart only if the gap
                # outlasts the roundings of (x - max) - lse and s + log p
                if not prev_d - d > 2.0 ** -52 * (prev_mag + mag + 4.0 * (el + es)):
                    good = False
            if j < n:
                ids[r, j], logp[r, j] = c, lp
                err[r, j] = 0.0 if lp == -np.inf else el + ROUNDING * (abs(lp) + el)
            elif row[c] == row[top[n - 1]] and row[c] > -np.inf and s > -np.inf:
                good = False                    # a tie across the cut: smaller logits may join
            prev_d, prev_mag = d, mag
        sure[r] = good


_exp32_checked = []               # [True or False] once exp32_within_bound has run


def exp32_worst_error():
    """The largest relative error of ``exp32`` found through ``_tail_sum``'s vector loop as this
    machine compiled it: rows of arguments in [-87, -86] (where its error is largest) and across
    [-87, 0], each row's sum against NumPy's float64 ``exp`` (a row's relative error is at least
    that of its worst entry's share)."""
    rng = np.random.default_rng(0)
    rows = np.concatenate([-86.0 - rng.random((32, 256)),
                           -87.0 * rng.random((32, 256))]).astype(np.float32)
    worst = 0.0
    for row in rows:
        exact = float(np.exp(row.astype(np.float64)).sum())
        worst = max(worst, abs(_tail_sum(row, 0.0, 1.0)[0] - exact) / exact)
    return worst


def exp32_within_bound():
    """Whether ``exp32`` as compiled here keeps within ``EXP32_REL_ERROR``
    (:func:`exp32_worst_error`), so that a compilation that loosens it (reassociation on a CPU
    without FMA, another LLVM) cannot make the bound a lie. Checked once per process; where it
    fails, one warning, and the fast path ranks no row as sure: every decision is then taken
    from the exact path (the same tokens, slower)."""
    if not _exp32_checked:
        worst = exp32_worst_error()
        _exp32_checked.append(worst <= EXP32_REL_ERROR)
        if not _exp32_checked[0]:
            warnings.warn(f"decoding's fast top log-softmax is off on this machine: exp32 as "
                          f"compiled here errs by {worst:.2e}, above its bound "
                          f"{EXP32_REL_ERROR:.2e}; every step is taken from the exact float64 "
                          f"path (the tokens are the same, only slower)",
                          runtime.NpformerRuntimeWarning, stacklevel=3)
    return _exp32_checked[0]


def top_log_softmax_bounded(logits, n, offset=None, offset_err=None):
    """The fast path of ``top_log_softmax``: the ``n`` best next tokens of every row of logits
    (R, V) with float64 log-probabilities that differ from the reference's by at most a proven
    bound, without a float64 exp over every entry.

    Returns ids (R, n) and logp (R, n) as ``top_log_softmax`` (ranked by ``offset[r] + log p``,
    ties by the lower id), err (R, n) >= |logp - the reference's logp| for each entry, and sure
    (R,) bool: True where the row's ids and their order are certainly the reference's
    (``offset_err`` (R,) bounds the error of ``offset`` itself, which only matters there through
    rounding). A row that is not sure (near-ties a float64 rounding could merge, a tie at the
    n-th place, NaN or infinite logits) must be taken from the exact path."""
    x = np.ascontiguousarray(logits)                                   # (R, V)
    n_rows, vocab = x.shape
    n = min(int(n), vocab)
    ids = np.empty((n_rows, n), dtype=np.int64)
    logp = np.empty((n_rows, n), dtype=np.float64)
    err = np.empty((n_rows, n), dtype=np.float64)
    sure = np.zeros(n_rows, dtype=np.bool_)
    no_offset = np.empty(0)
    if offset is not None:
        offset = np.ascontiguousarray(offset, dtype=np.float64)
        offset_err = (np.zeros(n_rows) if offset_err is None
                      else np.ascontiguousarray(offset_err, dtype=np.float64))

    def part(r0):
        rows = slice(r0, min(r0 + TOP_PART_ROWS, n_rows))
        _top_rows_bounded(x[rows], no_offset if offset is None else offset[rows],
                          no_offset if offset is None else offset_err[rows],
                          np.empty(min(n + 1, vocab), dtype=np.int64),
                          ids[rows], logp[rows], err[rows], sure[rows])
    if n:
        runtime.run_parts(part, range(0, n_rows, TOP_PART_ROWS))
    if not exp32_within_bound():
        sure[:] = False                                 # every row from the exact path
    return ids, logp, err, sure


def lse_error_bound(vocab):
    """The largest ``err`` a log-probability of a row of ``vocab`` entries can get here (the
    whole sum from exp32, a log-normaliser as large as log(vocab), a log-probability of at most
    -log(1e-300)): how far any step's log-probabilities can be from the reference's."""
    el = _lse_bound(float(vocab), float(vocab), vocab)
    return el + ROUNDING * (700.0 + el)
