"""Rotary position embedding as one pass over the pairs, in place where asked (the queries and
keys inside the fused projection's output, their gradients inside its gradient).

Same names, shapes and cache as :mod:`npformer.functional.rotary`.
"""
import numpy as np
from numba import prange

from npformer.functional.rotary import rotary_rows, rotary_tables  # noqa: F401  (same names)

from ._jit import kernel


@kernel(parallel=True, work=0)
def _turn(x, c, s, sign, out):
    """out1 = x1 c - sign x2 s, out2 = x2 c + sign x1 s for every pair (x1, x2) = (x[b, h, t, i],
    x[b, h, t, i + d/2]); x and out (B, H, T, d), c and s (T, d/2). Each pair is read before
    it is written, so out may be x. Threads own whole (b, h) slices."""
    n_b, n_h, n_t, d = x.shape
    half = d // 2
    for bh in prange(n_b * n_h):
        b, h = bh // n_h, bh % n_h
        for t in range(n_t):
            for i in range(half):
                x1, x2 = x[b, h, t, i], x[b, h, t, i + half]
                ci, si = c[t, i], sign * s[t, i]
                out[b, h, t, i] = x1 * ci - x2 * si
                out[b, h, t, i + half] = x2 * ci + x1 * si


def rotary_forward(x, cos, sin, start=0, out=None):
    """out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin at positions start .. start + T - 1.
    x (B, H, T, d) -> out (B, H, T, d); ``out`` may be x itself."""
    c, s = rotary_rows(cos, sin, start, x.shape[-2])
    out = np.empty_like(x) if out is None else out
    _turn(x, c, s, x.dtype.type(1), out)
    return out, (c, s)


def rotary_backward(dout, cache, out=None):
    """dx1 = dout1 cos + dout2 sin, dx2 = dout2 cos - dout1 sin (the turn back). Returns dx,
    in ``out`` if given (which may be dout itself)."""
    c, s = cache
    out = np.empty_like(dout) if out is None else out
    _turn(dout, c, s, dout.dtype.type(-1), out)
    return out
