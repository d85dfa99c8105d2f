"""Fused SwiGLU: silu(gate) * up in one pass over the fused projection's output, and its backward
in one more (docs/backprop.md#swiglu). Same names, shapes and results as
:mod:`npformer.functional.swiglu` (``silu_*`` are the reference's own), its cache its own.
"""
import numpy as np
from numba import prange

from npformer.aligned import empty_aligned

from npformer.functional.swiglu import silu_backward, silu_forward  # noqa: F401  (same names)

from ._fastexp import exp32
from ._jit import kernel


@kernel(parallel=True)
def _swiglu_fwd(h, out, sig, fast_exp, one):
    """h (N, 2F) = [gate | up] -> out (N, F) = silu(gate) * up and sig (N, F) = sigmoid(gate).

    sigmoid from e = exp(-|g|) alone (never overflows): 1 / (1 + e) for g >= 0, e / (1 + e)
    below; written as a select, so the loop vectorises. float32 takes the vectorisable
    ``exp32`` (``fast_exp``), float64 ``np.exp``, as the attention kernels do: the choice is
    made per row, outside the loop over its columns, and ``one`` has the dtype of h, so a
    float32 row is computed in float32 vector code throughout."""
    n, f = out.shape
    for r in prange(n):
        if fast_exp:
            for c in range(f):
                g = h[r, c]
                e = exp32(-abs(g))
                s_pos = one / (one + e)
                s = s_pos if g >= 0 else e * s_pos
                sig[r, c] = s
                out[r, c] = g * s * h[r, f + c]
        else:
            for c in range(f):
                g = h[r, c]
                e = np.exp(-abs(g))
                s_pos = one / (one + e)
                s = s_pos if g >= 0 else e * s_pos
                sig[r, c] = s
                out[r, c] = g * s * h[r, f + c]


@kernel(parallel=True)
def _swiglu_bwd(dout, h, sig, dh, one):
    """dh (N, 2F) = [d gate | d up] of dout (N, F) (``one`` in the dtype of h)."""
    n, f = dout.shape
    for r in prange(n):
        for c in range(f):
            g, s, d = h[r, c], sig[r, c], dout[r, c]
            dh[r, c] = d * h[r, f + c] * (s * (one + g * (one - s)))
            dh[r, f + c] = d * g * s


def swiglu_forward(h):
    """h (..., 2F) = [gate | up] -> out (..., F) = silu(gate) * up."""
    two_f = h.shape[-1]
    h2 = np.ascontiguousarray(h.reshape(-1, two_f))              # (N, 2F)
    out = empty_aligned((h2.shape[0], two_f // 2), h2.dtype)     # pooled: no fresh pages
    sig = empty_aligned(out.shape, h2.dtype)
    _swiglu_fwd(h2, out, sig, h2.dtype == np.float32, h2.dtype.type(1))
    return out.reshape(*h.shape[:-1], two_f // 2), (h2, sig, h.shape)


def swiglu_backward(dout, cache):
    """dh (..., 2F) of the forward above (maths in the reference)."""
    h2, sig, shape = cache
    if dout.shape != (*shape[:-1], shape[-1] // 2):
        raise ValueError(f"dout: expected shape {(*shape[:-1], shape[-1] // 2)}, got {dout.shape}")
    dh = empty_aligned(h2.shape, h2.dtype)
    _swiglu_bwd(np.ascontiguousarray(dout.reshape(sig.shape), dtype=h2.dtype), h2, sig, dh,
                h2.dtype.type(1))
    return dh.reshape(shape)
