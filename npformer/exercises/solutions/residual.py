"""Exercise: the residual block in both orders (checked, not trained with: the model's is
npformer's). Here the sub-layer f is a linear layer and dropout is off.

Derivation: docs/backprop.md#residual-and-layer-order (section "Residual and layer order").

post-norm (norm_first=False, the paper's):  y = LN(x + f(x))
pre-norm  (norm_first=True):                y = x + f(LN(x))
Shapes: x (B, T, D), w (D, D), b (D,), gamma (D,), beta (D,) -> y (B, T, D).
Write ``residual_backward``: given dout (B, T, D), return dx, dw, db, dgamma, dbeta, for both
orders. npformer's linear and LayerNorm backward passes are imported for you.
"""
from npformer.functional import (layernorm_backward, layernorm_forward, linear_backward,
                                 linear_forward)


def residual_forward(x, w, b, gamma, beta, norm_first):
    """Returns (y, cache)."""
    if norm_first:
        h, norm_cache = layernorm_forward(x, gamma, beta)
        fx, f_cache = linear_forward(h, w, b)
        return x + fx, (norm_first, norm_cache, f_cache)
    fx, f_cache = linear_forward(x, w, b)
    y, norm_cache = layernorm_forward(x + fx, gamma, beta)
    return y, (norm_first, norm_cache, f_cache)


def residual_backward(dout, cache):
    """dout (B, T, D) -> dx (B, T, D), dw (D, D), db (D,), dgamma (D,), dbeta (D,)."""
    norm_first, norm_cache, f_cache = cache
    # --- your code ---
    if norm_first:
        dh, dw, db = linear_backward(dout, f_cache)
        dx, dgamma, dbeta = layernorm_backward(dh, norm_cache)
        return dx + dout, dw, db, dgamma, dbeta
    dz, dgamma, dbeta = layernorm_backward(dout, norm_cache)
    dx, dw, db = linear_backward(dz, f_cache)
    return dx + dz, dw, db, dgamma, dbeta
    # --- end of your code ---
