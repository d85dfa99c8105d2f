"""Rotary position embedding (RoPE; Su et al., "RoFormer", 2021), in the layout of GPT-NeoX and
Llama: a head's vector of size d is split in halves, and dimension i pairs with i + d/2.

Queries and keys are rotated, pair by pair, by an angle proportional to their position; the
score q . k of two rotated vectors then depends on the positions only through their difference.
Nothing is learned: the angles come from the position and the pair alone.

Derivation: docs/backprop.md#rotary-positions.
"""
import numpy as np

from .embedding import position_rows

ROTARY_BASE = 10000.0            # theta: pair i turns by t * theta ** (-2i / d) at position t
_CHUNK = 1 << 20                 # angles computed per float64 chunk (8 MiB) when building tables


def rotary_frequencies(head_dim, base=ROTARY_BASE, scaling=None):
    """The angle per position of each pair i, base ** (-2i / head_dim) (head_dim / 2,), float64.

    ``scaling``: Llama 3's rescaling for contexts longer than it was trained on, a dict
    ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}`` (Hugging Face's ``rope_scaling``): pairs whose
    wavelength 2 pi / freq exceeds original / low_freq_factor turn ``factor`` times slower,
    pairs shorter than original / high_freq_factor keep their speed, and those between are
    interpolated smoothly between the two. None: no rescaling."""
    freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)       # (d/2,)
    if scaling is None:
        return freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * np.pi / freq
    slow = np.where(wavelength > original / low, freq / factor, freq)
    smooth = (original / wavelength - low) / (high - low)
    between = (wavelength >= original / high) & (wavelength <= original / low)
    return np.where(between, (1 - smooth) * slow / factor + smooth * slow, slow)


def rotary_tables(max_len, head_dim, dtype, base=ROTARY_BASE, scaling=None):
    """cos, sin (max_len, head_dim / 2) of the angles t * freq_i of position t and pair i
    (:func:`rotary_frequencies`), computed in float64 and then cast to ``dtype``."""
    if head_dim % 2:
        raise ValueError(f"head_dim: rotary positions turn pairs of dimensions, so expected an "
                         f"even size, got {head_dim}")
    inv_freq = rotary_frequencies(head_dim, base, scaling)                         # (d/2,)
    cos = np.empty((max_len, head_dim // 2), dtype=dtype)
    sin = np.empty((max_len, head_dim // 2), dtype=dtype)
    step = max(1, _CHUNK // max(1, head_dim // 2))       # rows a float64 chunk of angles holds
    for start in range(0, max_len, step):                # a long context's tables: no float64
        rows = np.arange(start, min(start + step, max_len), dtype=np.float64)   # copy of them
        angles = rows[:, None] * inv_freq                                       # (rows, d/2)
        cos[start:start + len(rows)] = np.cos(angles)
        sin[start:start + len(rows)] = np.sin(angles)
    return cos, sin


def rotary_rows(cos, sin, start, t):
    """The tables' rows of positions start .. start + t - 1: c, s (t, d/2), views (an incremental
    decoder's new positions start after the cached ones)."""
    return position_rows(cos, start, t), position_rows(sin, start, t)


def rotary_forward(x, cos, sin, start=0, out=None):
    """Turn each pair (x1, x2) = (x[..., i], x[..., i + d/2]) of the vector at position
    start + t by that position's angle for pair i:

        out1 = x1 cos - x2 sin,     out2 = x2 cos + x1 sin

    Shape: x (B, H, T, d), cos and sin (max_len, d/2) from :func:`rotary_tables` -> out
    (B, H, T, d). ``out`` may be x itself (in place); None: a new array.
    """
    half = x.shape[-1] // 2
    c, s = rotary_rows(cos, sin, start, x.shape[-2])           # broadcast over B and H
    x1, x2 = x[..., :half], x[..., half:]
    y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s                  # both read before any write
    out = np.empty_like(x) if out is None else out
    out[..., :half], out[..., half:] = y1, y2
    return out, (c, s)


def rotary_backward(dout, cache, out=None):
    """out = R x, where R turns every pair by its angle: R is orthogonal, so dx = R^T dout, the
    same pairs turned back by minus the angle (cos even, sin odd):

        dx1 = dout1 cos + dout2 sin,     dx2 = dout2 cos - dout1 sin

    Returns dx (B, H, T, d), in ``out`` if given (which may be dout itself).
    """
    c, s = cache
    half = dout.shape[-1] // 2
    g1, g2 = dout[..., :half], dout[..., half:]
    dx1, dx2 = g1 * c + g2 * s, g2 * c - g1 * s
    out = np.empty_like(dout) if out is None else out
    out[..., :half], out[..., half:] = dx1, dx2
    return out
