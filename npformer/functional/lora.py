"""LoRA (Hu et al. 2021): a frozen affine map plus a trained low-rank update on a dropped-out
copy of its input, as Hugging Face PEFT's ``lora.Linear``::

    y = x W^T + b + s * dropout(x) A^T B^T,      s = alpha / r

``W`` (D_out, D_in) and ``b`` are frozen: the backward gives dx (through W and through the
adapter), dA and dB, and no dW. ``A`` is (r, D_in), ``B`` (D_out, r).

The adapter path alone (``adapter_forward`` / ``adapter_backward``) is what a module adds to the
rows of a fused projection (the query rows of ``in_proj_weight``); ``linear_input_backward`` is
the frozen product's backward, dx alone.

Derivation: docs/backprop.md#lora.
"""
from .dropout import dropout_backward, dropout_forward
from .linear import linear_forward


def linear_input_backward(dout, cache):
    """The input gradient of y = x W^T + b alone, for a frozen W: dX = dY W (no dW, no db).
    ``cache``: :func:`~npformer.functional.linear.linear_forward`'s (either backend's: both
    keep ``(x2, x.shape, w)``). Returns dx (..., D_in)."""
    _, x_shape, w = cache
    dout2 = dout.reshape(-1, dout.shape[-1])         # (N, D_out)
    return (dout2 @ w).reshape(x_shape)


def adapter_forward(x, a, b, scaling, p=0.0, rng=None, training=True):
    """The update alone: delta = s * dropout(x) A^T B^T.

    Shape: x (..., D_in), a (r, D_in), b (D_out, r) -> delta (..., D_out). Dropout (rate ``p``,
    drawn from ``rng``) acts in training only, on the adapter's copy of x: the frozen product
    sees x itself (PEFT's ``lora_dropout``). s is applied to the (N, r) product, the narrow one.
    """
    x2 = x.reshape(-1, x.shape[-1])                            # (N, D_in)
    xd, drop_cache = dropout_forward(x2, p, rng, training)     # (N, D_in)
    hs = (xd @ a.T) * x.dtype.type(scaling)                    # (N, r)
    delta = hs @ b.T                                           # (N, D_out)
    return delta.reshape(*x.shape[:-1], b.shape[0]), (xd, hs, a, b, scaling, drop_cache, x.shape)


def adapter_backward(dout, cache):
    """Gradients of delta = s * X_d A^T B^T with H_s = s X_d A^T (N, r), X_d the dropped input,
    given dout = dDelta (..., D_out):

      dB = dDelta^T H_s            (D_out, r)
      dH = s * dDelta B            (N, r)
      dA = dH^T X_d                (r, D_in)
      dX = dropout_backward(dH A)  (the kept units, scaled by 1 / (1 - p))

    Returns dx (..., D_in), da (r, D_in), db (D_out, r)."""
    xd, hs, a, b, scaling, drop_cache, x_shape = cache
    g = dout.reshape(-1, dout.shape[-1])                       # (N, D_out)
    db = g.T @ hs                                              # (D_out, r)
    dh = (g @ b) * g.dtype.type(scaling)                       # (N, r)
    da = dh.T @ xd                                             # (r, D_in)
    dx = dropout_backward(dh @ a, drop_cache)                  # (N, D_in)
    return dx.reshape(x_shape), da, db


def lora_forward(x, w, bias, a, b, scaling, p=0.0, rng=None, training=True):
    """y = x W^T + bias + s * dropout(x) A^T B^T, W and bias frozen.

    Shape: x (..., D_in), w (D_out, D_in), bias (D_out,) or None, a (r, D_in), b (D_out, r)
    -> y (..., D_out)."""
    y, linear_cache = linear_forward(x, w, bias)
    delta, adapter_cache = adapter_forward(x, a, b, scaling, p, rng, training)
    y += delta
    return y, (linear_cache, adapter_cache)


def lora_backward(dout, cache):
    """dx = dY W + dropout_backward(s (dY B) A), dA, dB (see :func:`adapter_backward`); the
    frozen W and bias get nothing, so the (D_out, D_in) product dY^T X is never formed.
    Returns dx (..., D_in), da (r, D_in), db (D_out, r)."""
    linear_cache, adapter_cache = cache
    dx = linear_input_backward(dout, linear_cache)
    dx_adapter, da, db = adapter_backward(dout, adapter_cache)
    dx += dx_adapter
    return dx, da, db
