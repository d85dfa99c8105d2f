"""Inverted dropout with the mask applied in one fused pass (docs/backprop.md#dropout).

``keep_mask`` is the reference's mask, compiled: the same key drawn from the caller's ``rng``,
the same SplitMix64 word for each index, so the NumPy and Numba paths see identical masks for
the same seed. The words are independent of each other, so the loop vectorises.
"""
import math

import numpy as np
from numba import njit, prange

from npformer.aligned import empty_aligned
from npformer.functional.dropout import (GAMMA, MIX, SHIFTS, check_terms, mask_key,
                                         mask_threshold)

from ._jit import kernel


@njit(inline="always")
def _word(key, w):
    """Word w of the mask: mix(key + (w + 1) GAMMA), as ``functional.dropout.mask_words``."""
    z = key + np.uint64(w + 1) * GAMMA
    z = (z ^ (z >> SHIFTS[0])) * MIX[0]
    z = (z ^ (z >> SHIFTS[1])) * MIX[1]
    return z ^ (z >> SHIFTS[2])


@kernel
def _fill_mask(key, threshold, keep):
    """keep (n,) bool: unit u kept when bits 16 (u % 4).. of word u // 4 reach ``threshold``.
    Serial: LLVM computes several independent words per vector instruction, and a parallel
    version of this loop (blocks of words over the cores) measured slower on 2 cores."""
    n = keep.shape[0]
    full = n // 4                                   # words whose four units all lie in keep
    m = np.uint64(0xFFFF)
    for w in range(full):
        z = _word(key, w)
        keep[4 * w] = (z & m) >= threshold
        keep[4 * w + 1] = ((z >> np.uint64(16)) & m) >= threshold
        keep[4 * w + 2] = ((z >> np.uint64(32)) & m) >= threshold
        keep[4 * w + 3] = (z >> np.uint64(48)) >= threshold
    if n > 4 * full:                                # the last, partial word
        z = _word(key, full)
        for j in range(n - 4 * full):
            keep[4 * full + j] = ((z >> np.uint64(16 * j)) & m) >= threshold


def keep_mask(shape, p, rng):
    """The reference's ``keep_mask``, bit for bit: a bool array of ``shape``, True = kept."""
    keep = empty_aligned(math.prod(shape), bool)     # pooled: no fresh pages to fault in
    _fill_mask(np.uint64(mask_key(rng)), np.uint64(mask_threshold(p)), keep)
    return keep.reshape(shape)


@kernel(parallel=True)
def _apply_mask(x, keep, scale, out):
    """out = x * keep * scale over flat arrays."""
    for i in prange(x.shape[0]):
        out[i] = x[i] * scale if keep[i] else 0.0


def dropout_forward(x, p, rng, training=True):
    """Shape: x (...) -> out (...), same shape. Identity when not training or p == 0."""
    if not training or p == 0.0:
        return x, None
    keep = keep_mask(x.shape, p, rng)                     # (...) bool, True = kept
    scale = x.dtype.type(1.0 / (1.0 - p))
    out = empty_aligned(x.shape, x.dtype)          # often a linear layer's input
    _apply_mask(np.ascontiguousarray(x).reshape(-1), keep.reshape(-1), scale, out.reshape(-1))
    return out, (keep, scale)


def dropout_backward(dout, cache):
    """dx = dout * keep / (1 - p)."""
    if cache is None:
        return dout
    keep, scale = cache
    if dout.shape != keep.shape:
        raise ValueError(f"dout: expected shape {keep.shape}, got {dout.shape}")
    dx = empty_aligned(dout.shape, dout.dtype)
    _apply_mask(np.ascontiguousarray(dout).reshape(-1), keep.reshape(-1), dout.dtype.type(scale),
                dx.reshape(-1))
    return dx


@kernel(parallel=True, fastmath=False)
def _add_masked(x, y, keep, scale, out):
    """out = x + y * keep * scale over flat arrays: the residual sum and its dropout, one pass.
    Without fastmath: a fused multiply-add would round once where the reference rounds twice."""
    for i in prange(x.shape[0]):
        out[i] = x[i] + y[i] * scale if keep[i] else x[i]


@kernel(parallel=True)
def _add(x, y, out):
    """out = x + y over flat arrays (the residual sum where dropout is off)."""
    for i in prange(x.shape[0]):
        out[i] = x[i] + y[i]


def dropout_add_forward(x, y, p, rng, training=True):
    """out = x + dropout(y) in one pass, into a pooled buffer. Shape: x, y (...) -> out (...);
    the cache is :func:`dropout_forward`'s, so :func:`dropout_add_backward` is the reference's."""
    check_terms(x, y)
    dtype = np.result_type(x, y)
    out = empty_aligned(x.shape, dtype)
    flat = [np.ascontiguousarray(a, dtype).reshape(-1) for a in (x, y)]
    if not training or p == 0.0:
        _add(*flat, out.reshape(-1))
        return out, None
    keep = keep_mask(y.shape, p, rng)                     # (...) bool, True = kept
    scale = dtype.type(1.0 / (1.0 - p))
    _add_masked(*flat, keep.reshape(-1), scale, out.reshape(-1))
    return out, (keep, scale)


def dropout_add_backward(dout, cache):
    """dx = dout, dy = dout * keep / (1 - p). Returns (dx, dy); dx is dout itself."""
    return dout, dropout_backward(dout, cache)
