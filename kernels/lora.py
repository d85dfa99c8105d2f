"""LoRA's adapter path (delta = s * dropout(x) A^T B^T) with every product through the matmul
dispatcher (:func:`npformer.kernels.matmul.matmul`), as the linear layer's: the variant the
dispatch table fixes for each shape, a large product in cells on the runtime's workers, BLAS on
npformer's thread count. The narrow (N, r) products no longer run on NumPy's default BLAS pool
beside the Numba workers.

Same names, shapes and cache as :mod:`npformer.functional.lora` (docs/backprop.md#lora); the
dropout is this backend's (the reference's mask for the same ``rng``).
"""
from .dropout import dropout_backward, dropout_forward
from .matmul import matmul


def adapter_forward(x, a, b, scaling, p=0.0, rng=None, training=True):
    """delta = s * dropout(x) A^T B^T, s applied to the (N, r) product. Shape: x (..., D_in),
    a (r, D_in), b (D_out, r) -> delta (..., D_out)."""
    x2 = x.reshape(-1, x.shape[-1])                            # (N, D_in)
    xd, drop_cache = dropout_forward(x2, p, rng, training)     # (N, D_in)
    hs = matmul(xd, a.T)                                       # (N, r)
    hs *= x.dtype.type(scaling)
    delta = matmul(hs, b.T)                                    # (N, D_out)
    return delta.reshape(*x.shape[:-1], b.shape[0]), (xd, hs, a, b, scaling, drop_cache, x.shape)


def adapter_backward(dout, cache):
    """dB = dDelta^T H_s, dH = s dDelta B, dA = dH^T X_d, dX = dropout_backward(dH A).
    Returns dx (..., D_in), da (r, D_in), db (D_out, r)."""
    xd, hs, a, b, scaling, drop_cache, x_shape = cache
    g = dout.reshape(-1, dout.shape[-1])                       # (N, D_out)
    db = matmul(g.T, hs)                                       # (D_out, r)
    dh = matmul(g, b)                                          # (N, r)
    dh *= g.dtype.type(scaling)
    da = matmul(dh.T, xd)                                      # (r, D_in)
    dx = dropout_backward(matmul(dh, a), drop_cache)           # (N, D_in)
    return dx.reshape(x_shape), da, db
