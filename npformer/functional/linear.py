"""Affine map ``y = x W^T + b`` (PyTorch layout: ``W`` is ``(out_features, in_features)``).

Derivation: docs/backprop.md#linear.
"""


def linear_forward(x, w, b=None):
    """y = x @ w.T + b.

    Shape: x (..., D_in), w (D_out, D_in), b (D_out,) or None -> y (..., D_out).
    """
    x2 = x.reshape(-1, x.shape[-1])                  # (N, D_in), N = prod(leading dims)
    y = x2 @ w.T                                     # (N, D_out)
    if b is not None:
        y += b
    return y.reshape(*x.shape[:-1], w.shape[0]), (x2, x.shape, w)


def linear_backward(dout, cache):
    """Gradients of y = x W^T + b.

    With N rows stacked in X (N, D_in) and dY = ``dout`` (N, D_out):
      dX = dY W          (each input feeds every output through W)
      dW = dY^T X        (sum over rows of outer products dy_n x_n^T)
      db = sum_n dY_n
    Returns dx (..., D_in), dw (D_out, D_in), db (D_out,).
    """
    x2, x_shape, w = cache
    dout2 = dout.reshape(-1, dout.shape[-1])         # (N, D_out)
    dx = (dout2 @ w).reshape(x_shape)
    dw = dout2.T @ x2
    db = dout2.sum(axis=0)
    return dx, dw, db


def linear_backward_accumulate(dout, cache, dw_acc, db_acc=None):
    """:func:`linear_backward` for modules whose gradients accumulate: adds dw (and db) into
    ``dw_acc`` (and ``db_acc``) in place and returns dx."""
    dx, dw, db = linear_backward(dout, cache)
    dw_acc += dw
    if db_acc is not None:
        db_acc += db
    return dx
