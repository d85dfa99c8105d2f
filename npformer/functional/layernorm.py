"""Layer normalisation over the last axis, as ``torch.nn.LayerNorm`` (biased variance, eps
inside the square root).

Derivation: docs/backprop.md#layernorm.
"""
import numpy as np


def layernorm_forward(x, gamma, beta, eps=1e-5):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta, statistics over the last axis.

    Shape: x (..., D), gamma (D,), beta (D,) -> y (..., D).
    """
    mean = x.mean(axis=-1, keepdims=True)                 # (..., 1)
    xc = x - mean
    var = (xc * xc).mean(axis=-1, keepdims=True)          # (..., 1)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd                                      # (..., D)
    y = xhat * gamma + beta
    return y, (xhat, rstd, gamma)


def layernorm_backward(dout, cache):
    """With xhat = (x - mu) * rstd and g = dout * gamma:

      dx     = rstd * (g - mean(g) - xhat * mean(g * xhat))
      dgamma = sum over rows of dout * xhat
      dbeta  = sum over rows of dout

    The two means remove the directions that the normalisation itself takes out:
    a shift of all inputs (mean) and a scaling of all inputs (variance).
    """
    xhat, rstd, gamma = cache
    d = xhat.shape[-1]
    g = dout * gamma                                      # (..., D)
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    dgamma = (dout * xhat).reshape(-1, d).sum(axis=0)
    dbeta = dout.reshape(-1, d).sum(axis=0)
    return dx, dgamma, dbeta
