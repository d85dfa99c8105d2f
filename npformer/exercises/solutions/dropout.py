"""Exercise: inverted dropout, out = x * keep / (1 - p), keep[i] = 0 with probability p.

Derivation: docs/backprop.md#dropout (section "Dropout").

Shapes: x (...) -> out (...), the same shape. The mask comes from npformer's own ``keep_mask``,
so your dropout drops the very units the library's does. When not training (or p == 0) the
forward is the identity and its cache is None.
Write ``dropout_backward``: given dout (...), return dx (...).
"""
from npformer.functional.dropout import keep_mask


def dropout_forward(x, p, rng, training=True):
    """Returns (out, cache); cache None when dropout is off."""
    if not training or p == 0.0:
        return x, None
    keep = keep_mask(x.shape, p, rng)                # (...) bool, True = kept
    scale = x.dtype.type(1.0 / (1.0 - p))
    return x * keep * scale, (keep, scale)


def dropout_backward(dout, cache):
    """dout (...) -> dx (...)."""
    # --- your code ---
    if cache is None:
        return dout
    keep, scale = cache
    return dout * keep * scale
    # --- end of your code ---
