"""Inverted dropout: zero each unit with probability p and scale survivors by 1/(1-p), so the
expected activation is unchanged (to within 2**-17 relative: see ``keep_mask``) and evaluation
needs no rescaling.

Derivation: docs/backprop.md#dropout.
"""
import math

import numpy as np

MASK_BITS = 16          # random bits per unit; p is realised to within 2**-17


def inner_dropout_rates(dropout, attention_dropout=None, activation_dropout=None):
    """(attention_dropout, activation_dropout) of a Transformer layer: each left out (None) takes
    the layer's ``dropout`` rate, as torch.nn.Transformer's one rate does (fairseq sets them
    apart). The one place this rule lives: configurations, layers and the CLI all call it."""
    return tuple(dropout if p is None else p for p in (attention_dropout, activation_dropout))


def keep_mask(shape, p, rng):
    """A bool array of ``shape``, each entry True (kept) with probability 1 - p.

    Each unit gets 16 random bits, four from every 64-bit word of ``rng``'s bit generator, and is
    dropped when they fall below round(p * 65536): p is rounded to a multiple of 1/65536
    (0.1 -> 0.1000061). Comparing float32 uniforms with p instead takes ~3x as long (1.8 vs
    0.6 ms for 983,040 units), and a base-config training step draws ~16 million units.
    Both backends call this function, so they see the same masks for the same seed.
    """
    if isinstance(rng.bit_generator, np.random.MT19937):
        raise ValueError("rng: expected a numpy random Generator with 64 random bits per raw draw (PCG64, "
                         "as np.random.default_rng gives, Philox, SFC64), got MT19937 (32)")
    n = math.prod(shape)
    words = rng.bit_generator.random_raw((n + 3) // 4)      # (ceil(n / 4),) uint64
    bits = words.view(np.uint16)[:n].reshape(shape)         # (...) uint16, uniform in [0, 65536)
    return bits >= np.uint16(min(round(p * (1 << MASK_BITS)), (1 << MASK_BITS) - 1))


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
