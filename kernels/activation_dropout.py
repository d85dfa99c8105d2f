"""dropout(activation(h)) in one element-wise pass each way, on every core.

Same names, shapes and maths as :mod:`npformer.functional.activation_dropout` (ReLU, exact
GELU or its tanh approximation, then inverted dropout with the reference's keep-mask); the
reference makes two passes forward and two backward, each allocating a new array. The cache
keeps h (the pre-activation) and the keep-mask; the backward recomputes act'(h) from h.

The tanh form of GELU in float32 uses the identity (1 + tanh u) / 2 = sigmoid(2u) =
1 / (1 + exp(-2u)) with the vectorisable ``_fastexp.exp32``: ``math.tanh`` is one scalar libm
call per element, which made this pass the slowest of a GPT's feed-forward block. In terms of
s = sigmoid(2u):

    y  = x s
    y' = s + x * 2 s (1 - s) * du/dx          ((1 - tanh^2 u) / 2 = 2 s (1 - s))

float64 keeps ``math.tanh`` (the gradient checks' precision); float32 agrees with the reference
to a few float32 ulps.
"""
import math

import numpy as np
from numba import njit, prange

from npformer.aligned import empty_aligned
from npformer.functional.activation_dropout import check_activation

from ._fastexp import exp32
from ._jit import FASTMATH, kernel
from .dropout import keep_mask

_CODES = {"relu": 0, "gelu": 1, "gelu_tanh": 2}   # the activation, as the kernels receive it
# Elements per parallel task, fixed: Numba would otherwise give each thread one range of its own,
# and where a range ends decides which elements LLVM computes in its vector loop and which in
# the scalar one after it; with a vector library (SVML) their erf and exp round differently.
# Fixed blocks make every element's arithmetic depend on its index alone, not on the threads.
BLOCK = 4096
_GELU, _GELU_TANH = _CODES["gelu"], _CODES["gelu_tanh"]
_NO_MASK = np.ones(1, dtype=bool)
_EXP_MAX = np.float32(88.0)        # exp32's argument stays below float32's overflow


@njit(inline="always", fastmath=FASTMATH, cache=True)
def relu(x):
    """ReLU as every kernel here computes it: x where x > 0, else x - x (a zero of x's dtype:
    +0.0 for -0.0, NaN stays NaN, -inf gives NaN)."""
    return x if x > 0 else x - x


@kernel(fastmath=False)
def bias_relu(x, bias, add):
    """In place: x = relu(x + bias) where ``add``, else x = relu(x); x (M, N) any strides, bias
    (N,) (read only where ``add``). Serial: it runs on a cell of a product
    (kernels/matmul.py), on the worker that computed the cell, while the cell is in cache. The
    sum is the one ``x += bias`` computes, so the result is the bits of the bias added by NumPy
    and then :func:`activation_dropout_forward`'s ReLU without dropout. Without fastmath: with
    reassociation allowed, LLVM folds (x + b) - (x + b) to 0, where a NaN sum must stay NaN."""
    m, n = x.shape
    for r in range(m):
        if add:
            for c in range(n):
                x[r, c] = relu(x[r, c] + bias[c])
        else:
            for c in range(n):
                x[r, c] = relu(x[r, c])


def relu_cache(a):
    """The cache :func:`activation_dropout_forward` gives for ReLU without dropout, made from
    the activation's output ``a`` instead of its input h: the backward asks only whether
    h > 0, and a > 0 exactly where h > 0 (a = h there, a zero or NaN elsewhere), so
    :func:`activation_dropout_backward` gives the same bits from it."""
    return _CODES["relu"], a, None, a.dtype.type(1.0)


@njit(inline="always", fastmath=FASTMATH, cache=True)
def _sigmoid32(z):
    """1 / (1 + exp(-z)) for a float32 z, vectorisable (exp(-z) -> inf gives 0, as it should)."""
    one = np.float32(1.0)
    return one / (one + exp32(min(-z, _EXP_MAX)))


@kernel(parallel=True)
def _gelu_tanh32_forward(h, keep, scale, use_dropout, s2pi, c, out):
    """out = gelu_tanh(h) * keep * scale over flat float32 arrays, by the sigmoid of 2u: a kernel
    of its own, since LLVM vectorises this loop only where no libm call (the other activations'
    erf and tanh) shares the function with it."""
    n = h.shape[0]
    for blk in prange((n + BLOCK - 1) // BLOCK):
        lo = blk * BLOCK
        hb, kb, ob = h[lo:lo + BLOCK], keep[lo:lo + BLOCK], out[lo:lo + BLOCK]
        for i in range(hb.shape[0]):
            x = hb[i]
            y = x * _sigmoid32(np.float32(2.0) * np.float32(s2pi * (x + c * x * x * x)))
            if use_dropout:
                y = y * scale if kb[i] else y - y
            ob[i] = y


@kernel(parallel=True)
def _forward(h, code, keep, scale, use_dropout, consts, out):
    """out = act(h) * keep * scale over flat arrays (without dropout: out = act(h)).
    consts = (1/2, 1/sqrt(2), 1/sqrt(2 pi), sqrt(2/pi), 0.044715, 3 * 0.044715) in h's dtype,
    so float32 stays float32 (float32's gelu_tanh runs in :func:`_gelu_tanh32_forward`)."""
    one = scale / scale
    half, inv_sqrt2, s2pi, c = consts[0], consts[1], consts[3], consts[4]
    n = h.shape[0]
    for blk in prange((n + BLOCK - 1) // BLOCK):
        lo = blk * BLOCK
        hb, kb, ob = h[lo:lo + BLOCK], keep[lo:lo + BLOCK], out[lo:lo + BLOCK]
        for i in range(hb.shape[0]):                  # (block views indexed from 0: LLVM can
            x = hb[i]                                 #  see no index is negative, and vectorises)
            if code == _GELU:
                y = x * (half * (one + math.erf(x * inv_sqrt2)))
            elif code == _GELU_TANH:
                y = half * x * (one + math.tanh(s2pi * (x + c * x * x * x)))
            else:
                y = relu(x)
            if use_dropout:
                y = y * scale if kb[i] else y - y
            ob[i] = y


@njit(inline="always", fastmath=FASTMATH, cache=True)
def _gelu_tanh32_slope(x, s2pi, c, c3):
    """gelu_tanh'(x) for a float32 x, by s = sigmoid(2u): s + x * 2 s (1 - s) * du/dx."""
    one = np.float32(1.0)
    sg = _sigmoid32(np.float32(2.0) * np.float32(s2pi * (x + c * x * x * x)))
    du = s2pi * (one + c3 * x * x)
    return sg + x * (sg + sg) * (one - sg) * du


@kernel(parallel=True)
def _gelu_tanh32_backward(dout, h, keep, scale, use_dropout, s2pi, c, c3, dh):
    """dh = gelu_tanh'(h) * dout * keep * scale over flat float32 arrays. As the forward, a
    kernel of its own, and the dropout's test outside the loops: LLVM vectorises neither loop
    with a per-element select on the keep-mask ahead of the slope's arithmetic otherwise."""
    n = h.shape[0]
    for blk in prange((n + BLOCK - 1) // BLOCK):
        lo = blk * BLOCK
        gb, hb, kb, db = dout[lo:lo + BLOCK], h[lo:lo + BLOCK], keep[lo:lo + BLOCK], dh[lo:lo + BLOCK]
        if use_dropout:
            for i in range(hb.shape[0]):
                g = gb[i]
                g = g * scale if kb[i] else g - g
                db[i] = g * _gelu_tanh32_slope(hb[i], s2pi, c, c3)
        else:
            for i in range(hb.shape[0]):
                db[i] = gb[i] * _gelu_tanh32_slope(hb[i], s2pi, c, c3)


@kernel(parallel=True)
def _backward(dout, h, code, keep, scale, use_dropout, consts, dh):
    """dh = act'(h) * dout * keep * scale over flat arrays (consts as in _forward)."""
    one = scale / scale
    half, inv_sqrt2, inv_sqrt2pi, s2pi, c, c3 = (consts[0], consts[1], consts[2], consts[3],
                                                 consts[4], consts[5])
    n = h.shape[0]
    for blk in prange((n + BLOCK - 1) // BLOCK):
        lo = blk * BLOCK
        gb, hb, kb, db = dout[lo:lo + BLOCK], h[lo:lo + BLOCK], keep[lo:lo + BLOCK], dh[lo:lo + BLOCK]
        for i in range(hb.shape[0]):
            g = gb[i]
            if use_dropout:
                g = g * scale if kb[i] else g - g
            x = hb[i]
            if code == _GELU:
                cdf = half * (one + math.erf(x * inv_sqrt2))
                g = g * (cdf + x * math.exp(-half * x * x) * inv_sqrt2pi)
            elif code == _GELU_TANH:
                t = math.tanh(s2pi * (x + c * x * x * x))
                du = s2pi * (one + c3 * x * x)
                g = g * (half * (one + t) + half * x * (one - t * t) * du)
            elif not x > 0:
                g = g - g
            db[i] = g


def _consts(dtype):
    return np.array([0.5, 1.0 / math.sqrt(2.0), 1.0 / math.sqrt(2.0 * math.pi),
                     math.sqrt(2.0 / math.pi), 0.044715, 3.0 * 0.044715], dtype=dtype)


def activation_dropout_forward(h, activation, p, rng, training=True):
    """Shape: h (...) -> out (...), same shape; as the reference."""
    check_activation(activation)
    use_dropout = bool(training and p > 0.0)
    keep = keep_mask(h.shape, p, rng) if use_dropout else None   # the reference's draws
    scale = h.dtype.type(1.0 / (1.0 - p)) if use_dropout else h.dtype.type(1.0)
    h = np.ascontiguousarray(h)
    out = empty_aligned(h.shape, h.dtype)          # the next linear's input
    code, mask = _CODES[activation], _NO_MASK if keep is None else keep.reshape(-1)
    consts = _consts(h.dtype)
    if code == _GELU_TANH and h.dtype == np.float32:
        _gelu_tanh32_forward(h.reshape(-1), mask, scale, use_dropout, consts[3], consts[4],
                             out.reshape(-1))
    else:
        _forward(h.reshape(-1), code, mask, scale, use_dropout, consts, out.reshape(-1))
    return out, (code, h, keep, scale)


def activation_dropout_backward(dout, cache):
    """dh (shape of h) = act'(h) * dout * keep * scale."""
    code, h, keep, scale = cache
    if dout.shape != h.shape:
        raise ValueError(f"dout: expected shape {h.shape}, got {dout.shape}")
    dout = np.ascontiguousarray(dout, dtype=h.dtype)
    dh = empty_aligned(h.shape, h.dtype)            # pooled: no fresh pages to fault in
    mask, consts = _NO_MASK if keep is None else keep.reshape(-1), _consts(h.dtype)
    if code == _GELU_TANH and h.dtype == np.float32:
        _gelu_tanh32_backward(dout.reshape(-1), h.reshape(-1), mask, scale, keep is not None,
                              consts[3], consts[4], consts[5], dh.reshape(-1))
    else:
        _backward(dout.reshape(-1), h.reshape(-1), code, mask, scale, keep is not None, consts,
                  dh.reshape(-1))
    return dh
