"""Linear layer forward/backward with every product through the matmul dispatcher
(:func:`npformer.kernels.matmul.matmul`), and a backward that adds the weight gradients into the
caller's accumulators through reused scratch buffers.

Same names, shapes and cache as :mod:`npformer.functional.linear` (docs/backprop.md#linear).
"""
import numpy as np

from .activation_dropout import relu_cache
from .matmul import matmul, matmuls

_scratch = {}                     # (shape, dtype) -> reusable buffer for dW before it is added


def _buffer(shape, dtype):
    """A per-shape scratch array, reused across calls (one thread at a time)."""
    key = (shape, np.dtype(dtype).str)
    buf = _scratch.get(key)
    if buf is None:
        buf = _scratch[key] = np.empty(shape, dtype=dtype)
    return buf


def linear_forward(x, w, b=None):
    """y = x @ w.T + b. Shape: x (..., D_in), w (D_out, D_in), b (D_out,) or None -> (..., D_out)."""
    x2 = x.reshape(-1, x.shape[-1])                  # (N, D_in)
    y = matmul(x2, w.T, bias=b)                      # (N, D_out), b added cell by cell
    return y.reshape(*x.shape[:-1], w.shape[0]), (x2, x.shape, w)


def linear_relu_forward(x, w, b=None):
    """a = relu(x @ w.T + b), the ReLU applied cell by cell where the bias is
    (``matmul(..., relu=True)``): a feed-forward block's first layer and its activation in eval
    mode, with no pass of its own for the activation; the bits of :func:`linear_forward` then
    ``activation_dropout_forward(h, "relu", p, rng, training=False)``.
    Shape: x (..., D_in), w (D_out, D_in), b (D_out,) or None -> a (..., D_out).

    Returns (a, (linear cache, activation cache)): the caches :func:`linear_backward` and
    ``activation_dropout_backward`` take, so a backward after it gives the unfused bits."""
    x2 = x.reshape(-1, x.shape[-1])                  # (N, D_in)
    a = matmul(x2, w.T, bias=b, relu=True).reshape(*x.shape[:-1], w.shape[0])
    return a, ((x2, x.shape, w), relu_cache(a))


def linear_backward(dout, cache):
    """dx = dY W, dw = dY^T X, db = sum_n dY_n (dY = ``dout``); returns dx (..., D_in),
    dw (D_out, D_in), db."""
    x2, x_shape, w = cache
    dout2 = dout.reshape(-1, dout.shape[-1])         # (N, D_out)
    dx = matmul(dout2, w).reshape(x_shape)
    dw = matmul(dout2.T, x2)
    return dx, dw, dout2.sum(axis=0)


def linear_input_backward(dout, cache):
    """dx = dY W alone, for a frozen W (LoRA's base): the product :func:`linear_backward` makes
    dx with, and no dW. Returns dx (..., D_in)."""
    _, x_shape, w = cache
    return matmul(dout.reshape(-1, dout.shape[-1]), w).reshape(x_shape)


def linear_backward_accumulate(dout, cache, dw_acc, db_acc=None):
    """As :func:`linear_backward`, but adds dw into ``dw_acc`` (D_out, D_in) and db into
    ``db_acc`` (D_out,) in place (the parameters' ``.grad``) instead of returning new arrays.
    dw goes through a reused scratch buffer, not a fresh (D_out, D_in) allocation per call.
    Returns dx (..., D_in).

    dX = dY W and dW = dY^T X do not depend on each other: they run as one parallel region
    (:func:`npformer.kernels.matmul.matmuls`), each cell of dW added into ``dw_acc`` by the worker
    that computed it and the bias gradient's column sums as one more part, with the bits of
    computing them one after the other."""
    x2, x_shape, w = cache
    if dw_acc.shape != w.shape or (db_acc is not None and db_acc.shape != w.shape[:1]):
        raise ValueError(f"dw_acc, db_acc: expected shapes {w.shape} and {w.shape[:1]}, got "
                         f"{dw_acc.shape} and {None if db_acc is None else db_acc.shape}")
    dout2 = dout.reshape(-1, dout.shape[-1])         # (N, D_out)
    extra = () if db_acc is None else (lambda: np.add(db_acc, dout2.sum(axis=0), out=db_acc),)
    dx, _ = matmuls([(dout2, w, None, None),                             # (N, D_in)
                     (dout2.T, x2, _buffer(w.shape, w.dtype), dw_acc)], extra)  # (D_out, D_in)
    return dx.reshape(x_shape)
