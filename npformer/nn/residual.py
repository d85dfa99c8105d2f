"""The residual connection around every sub-layer, in either order.

post-norm (the paper, PyTorch's default):  y = LN(x + dropout(f(x)))
pre-norm  (norm_first=True):               y = x + dropout(f(LN(x)))

Derivation: docs/backprop.md#residual-and-layer-order.
"""


def residual_forward(x, sublayer, norm, dropout, norm_first):
    """``sublayer`` maps (B, T, D) -> (B, T, D); ``norm``/``dropout`` are modules."""
    if norm_first:
        return x + dropout.forward(sublayer(norm.forward(x)))
    return norm.forward(x + dropout.forward(sublayer(x)))


def residual_backward(dy, sublayer_backward, norm, dropout, norm_first):
    """The identity path passes dy straight through; the sub-layer path adds its gradient.

    post-norm: dz = LN'(dy);  dx = dz + f'(dropout'(dz))
    pre-norm:  dx = dy + LN'(f'(dropout'(dy)))
    """
    if norm_first:
        return dy + norm.backward(sublayer_backward(dropout.backward(dy)))
    dz = norm.backward(dy)
    return dz + sublayer_backward(dropout.backward(dz))
