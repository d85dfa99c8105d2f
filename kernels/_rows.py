"""Helpers the softmax passes share (attention, blocked attention, cross-entropy)."""
import math

from numba import njit

from ._fastexp import exp32
from ._jit import FASTMATH, kernel


@njit(inline="always", fastmath=FASTMATH, cache=True)
def exp_in_place(s, n, fast_exp, neg_inf, zero):
    """s[:n] = exp(s[:n]), one long loop LLVM vectorises: float32's ``exp32`` (which stops at
    exp(-87) > 0, so -inf entries are set to exactly 0), else ``math.exp``."""
    if fast_exp:
        for idx in range(n):
            y = s[idx]
            s[idx] = exp32(y) if y != neg_inf else zero
    else:
        for idx in range(n):
            s[idx] = math.exp(s[idx])


@njit(inline="always", fastmath=FASTMATH, cache=True)
def row_max(x, n, neg_inf):
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
def flush_subnormal(x, tiny):
    """In place: entries of x (B, H, T, d), any strides, below ``tiny`` in magnitude -> 0 (a
    three-axis array goes in as ``x[None]``)."""
    zero = tiny - tiny
    n_b, n_h, n_t, n_d = x.shape
    for b in range(n_b):
        for h in range(n_h):
            for t in range(n_t):
                for j in range(n_d):
                    if abs(x[b, h, t, j]) < tiny:
                        x[b, h, t, j] = zero
