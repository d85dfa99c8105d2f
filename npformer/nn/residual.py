"""The residual connection around every sub-layer, in either order.

post-norm (the paper, PyTorch's default):  y = LN(x + dropout(f(x)))
pre-norm  (norm_first=True):               y = x + dropout(f(LN(x)))

Derivation: docs/backprop.md#residual-and-layer-order.
"""


def residual_forward(x, sublayer, norm, dropout, norm_first):
    """``sublayer`` maps (B, T, D) -> (B, T, D); ``norm``/``dropout`` are modules.
    ``dropout.add_forward(x, y)`` is x + dropout(y); ``dropout.add_norm_forward(x, y, norm)``
    is norm(x + dropout(y)), one pass in eval mode where the backend offers it."""
    if norm_first:
        return dropout.add_forward(x, sublayer(norm.forward(x)))
    return dropout.add_norm_forward(x, sublayer(x), norm)      # one pass in eval (kernels)


def residual_backward(dy, sublayer_backward, norm, dropout, norm_first):
    """The identity path passes dy straight through; the sub-layer path adds its gradient.

    post-norm: dz = LN'(dy);  dx = dz + f'(dropout'(dz))
    pre-norm:  dx = dy + LN'(f'(dropout'(dy)))
    """
    if norm_first:
        d_identity, d_sub = dropout.add_backward(dy)
        dx = norm.backward(sublayer_backward(d_sub))
    else:
        d_identity, d_sub = dropout.add_backward(norm.backward(dy))
        dx = sublayer_backward(d_sub)
    dx += d_identity        # in place: dx is a fresh array of this backward's own
    return dx
