"""Fused SwiGLU: silu(gate) * up in one pass over the fused projection's output, and its backward
in one more (docs/backprop.md#swiglu). Same names, shapes and results as
:mod:`npformer.functional.swiglu` (``silu_*`` are the reference's own), its cache its own.

The forward writes ``out`` alone: its cache is the projection's output h itself, and the
backward, which reads h anyway, computes sigmoid(gate) again by the very same operations, so
its bits are the forward's. A sigmoid array would cost a write of N x F floats in the forward
and a read of them in the backward, more than the exponential it saves.
"""
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from npformer.aligned import empty_aligned

from npformer.functional.swiglu import silu_backward, silu_forward  # noqa: F401  (same names)

from ._fastexp import exp32
from ._jit import FASTMATH, kernel


def _exp(x):
    """exp(x) in x's own precision, chosen when a kernel compiles (inside kernels only)."""
    raise NotImplementedError("_exp runs inside Numba kernels only")


@overload(_exp, inline="always")
def _exp_of(x):
    """float32: the vectorisable ``exp32``, float64: ``np.exp``, as the attention kernels do;
    the choice is the type's, so a loop holds no branch on it and vectorises."""
    if x == types.float32:
        return lambda x: exp32(x)
    return lambda x: np.exp(x)


@njit(inline="always", fastmath=FASTMATH, error_model="numpy", cache=True)
def _sigmoid(g, one):
    """sigmoid(g) from e = exp(-|g|) alone (never overflows): 1 / (1 + e) for g >= 0,
    e / (1 + e) below, written as a select so that the loop around it vectorises; ``one`` has
    g's dtype, so float32 stays float32 throughout."""
    e = _exp(-abs(g))
    s_pos = one / (one + e)
    return s_pos if g >= 0 else e * s_pos


@kernel(parallel=True)
def _swiglu_fwd(h, out, one):
    """h (N, 2F) = [gate | up] -> out (N, F) = silu(gate) * up, in place."""
    n, f = out.shape
    for r in prange(n):
        for c in range(f):
            g = h[r, c]
            out[r, c] = g * _sigmoid(g, one) * h[r, f + c]


@kernel(parallel=True)
def _swiglu_bwd(dout, h, dh, one):
    """dh (N, 2F) = [d gate | d up] of dout (N, F), sigmoid(gate) computed again from h."""
    n, f = dout.shape
    for r in prange(n):
        for c in range(f):
            g, d = h[r, c], dout[r, c]
            s = _sigmoid(g, one)
            dh[r, c] = d * h[r, f + c] * (s * (one + g * (one - s)))
            dh[r, f + c] = d * g * s


def swiglu_forward(h):
    """h (..., 2F) = [gate | up] -> out (..., F) = silu(gate) * up; the cache holds h's rows
    (N, 2F) and h's shape, nothing the forward computed."""
    two_f = h.shape[-1]
    h2 = np.ascontiguousarray(h.reshape(-1, two_f))              # (N, 2F)
    out = empty_aligned((h2.shape[0], two_f // 2), h2.dtype)     # pooled: no fresh pages
    _swiglu_fwd(h2, out, h2.dtype.type(1))
    return out.reshape(*h.shape[:-1], two_f // 2), (h2, h.shape)


def swiglu_backward(dout, cache):
    """dh (..., 2F) of the forward above (maths in the reference)."""
    h2, shape = cache
    if dout.shape != (*shape[:-1], shape[-1] // 2):
        raise ValueError(f"dout: expected shape {(*shape[:-1], shape[-1] // 2)}, got {dout.shape}")
    dh = empty_aligned(h2.shape, h2.dtype)
    _swiglu_bwd(np.ascontiguousarray(dout.reshape(-1, shape[-1] // 2), dtype=h2.dtype), h2, dh,
                h2.dtype.type(1))
    return dh.reshape(shape)
