"""Inverted dropout: zero each unit with probability p and scale survivors by 1/(1-p), so the
expected activation is unchanged (to within 2**-17 relative: see ``keep_mask``) and evaluation
needs no rescaling.

Derivation: docs/backprop.md#dropout.
"""
import math

import numpy as np

MASK_BITS = 16          # random bits per unit; p is realised to within 2**-17
# SplitMix64 (Steele, Lea & Flood 2014; Java's SplittableRandom): word i of a mask is
# mix(key + (i + 1) * GAMMA), a function of the key and the index alone.
GAMMA = np.uint64(0x9E3779B97F4A7C15)
MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))


def mask_threshold(p):
    """Units whose 16 bits fall below this are dropped: round(p * 65536), at most 65535."""
    return np.uint16(min(round(p * (1 << MASK_BITS)), (1 << MASK_BITS) - 1))


def mask_key(rng):
    """One 64-bit draw of ``rng``: the whole mask follows from it, so the generator advances by
    the same single draw whatever the mask's size (any numpy Generator will do)."""
    return rng.integers(0, 1 << 64, dtype=np.uint64)


def mask_words(key, n_words):
    """(n_words,) uint64: SplitMix64's words key + (i + 1) * GAMMA, each mixed by two
    xor-shift-multiply rounds and a last xor-shift (uint64 arithmetic wraps modulo 2**64)."""
    z = key + np.arange(1, n_words + 1, dtype=np.uint64) * GAMMA
    z = (z ^ (z >> SHIFTS[0])) * MIX[0]
    z = (z ^ (z >> SHIFTS[1])) * MIX[1]
    return z ^ (z >> SHIFTS[2])


def keep_mask(shape, p, rng):
    """A bool array of ``shape``, each entry True (kept) with probability 1 - p.

    Each unit gets 16 random bits: unit u takes bits 16 (u % 4) to 16 (u % 4) + 15 of word
    u // 4 of ``mask_words(mask_key(rng), ...)``, and is dropped when they fall below
    ``mask_threshold(p)``: p is rounded to a multiple of 1/65536 (0.1 -> 0.1000061).
    Every word depends on its index alone, so the Numba twin (``npformer.kernels.dropout``)
    computes many at once in vector registers and draws the very same bits: both backends see
    the same masks for the same seed.
    """
    n = math.prod(shape)
    words = mask_words(mask_key(rng), (n + 3) // 4)                            # (ceil(n / 4),)
    fields = (words[:, None] >> np.arange(0, 64, 16, dtype=np.uint64)) & np.uint64(0xFFFF)
    bits = fields.reshape(-1)[:n].reshape(shape)                          # (...) in [0, 65536)
    return bits >= mask_threshold(p)


def dropout_forward(x, p, rng, training=True):
    """Shape: x (...) -> out (...), same shape. Identity when not training or p == 0."""
    if not training or p == 0.0:
        return x, None
    keep = keep_mask(x.shape, p, rng)                     # (...) bool, True = kept
    scale = x.dtype.type(1.0 / (1.0 - p))
    return x * keep * scale, (keep, scale)


def dropout_backward(dout, cache):
    """out = x * keep / (1-p) is linear in x: dx = dout * keep / (1-p)."""
    if cache is None:
        return dout
    keep, scale = cache
    return dout * keep * scale


def check_terms(x, y):
    """ValueError unless the two terms of a residual sum have one shape (NumPy would broadcast)."""
    if x.shape != y.shape:
        raise ValueError(f"x, y: expected the same shape, got {x.shape} and {y.shape}")


def dropout_add_forward(x, y, p, rng, training=True):
    """out = x + dropout(y): a residual connection's sum with its sub-layer's dropped output,
    one pass in a backend that fuses the two. Shape: x, y (...) -> out (...); the cache is
    :func:`dropout_forward`'s for y."""
    check_terms(x, y)
    dropped, cache = dropout_forward(y, p, rng, training)
    return x + dropped, cache


def dropout_add_backward(dout, cache):
    """The sum hands dout to both terms: dx = dout, dy = dout * keep / (1-p).
    Returns (dx, dy); dx is dout itself."""
    return dout, dropout_backward(dout, cache)
