"""Root-mean-square normalisation over the last axis (Llama, Qwen, Mistral; ``torch.nn.RMSNorm``,
Hugging Face's ``LlamaRMSNorm``): LayerNorm without the mean and without the shift.

Derivation: docs/backprop.md#rmsnorm.
"""
import numpy as np


def rmsnorm_forward(x, gamma, eps=1e-6):
    """y = gamma * x / sqrt(mean(x^2) + eps), the mean over the last axis (eps inside the root).

    Computed in at least float32: a half-precision input is normalised in float32, cast back
    and then scaled by gamma, in Hugging Face's order; float32 and float64 stay as they are.
    Shape: x (..., D), gamma (D,) -> y (..., D).
    """
    work = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    rstd = 1.0 / np.sqrt((work * work).mean(axis=-1, keepdims=True) + eps)   # (..., 1)
    xhat = work * rstd                                                        # (..., D)
    y = xhat.astype(x.dtype, copy=False) * gamma
    return y, (xhat, rstd, gamma, x.dtype)


def rmsnorm_backward(dout, cache):
    """With xhat = x * r, r = 1 / sqrt(mean(x^2) + eps), and g = dout * gamma:

      dx     = r * (g - xhat * mean(g * xhat))
      dgamma = sum over rows of dout * xhat

    The one mean removes the direction the normalisation takes out: a scaling of all inputs
    (there is no mean to remove, unlike LayerNorm's dx).
    """
    xhat, rstd, gamma, dtype = cache
    d = xhat.shape[-1]
    g = dout * gamma                                                          # (..., D)
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    dgamma = (dout * xhat).reshape(-1, d).sum(axis=0)
    return dx.astype(dtype, copy=False), dgamma.astype(gamma.dtype, copy=False)
