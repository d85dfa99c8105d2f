"""Exercise, staged: RMSNorm's backward one named intermediate at a time, before the fused
formula of the next exercise.

Derivation: docs/backprop.md#rmsnorm (section "RMSNorm").

The forward is a chain, each line one value (the cache holds them all, by name):
    sq = x * x            (..., D)
    ms = mean(sq)         (..., 1)     the mean over the last axis
    rstd = 1 / sqrt(ms + eps)   (..., 1)
    xhat = x * rstd       (..., D)
    y = xhat * gamma      (..., D); gamma (D,)
Write ``rmsnorm_staged_backward``: given dout = dL/dy, the gradient of every value, one line
each, in the order given (from y back to x): each is dL/d(that value), the shape of the value.
x is used twice (by sq and by xhat): its gradient sums both. Leave a line None to have the ones
before it checked; the check names the first wrong line and those that use it.
"""
import numpy as np


def rmsnorm_staged_forward(x, gamma, eps=1e-6):
    """Returns (y, cache); the cache is {name: value} of the chain."""
    sq = x * x
    ms = sq.mean(axis=-1, keepdims=True)
    rstd = (ms + eps) ** -0.5
    xhat = x * rstd
    y = xhat * gamma
    return y, dict(x=x, sq=sq, ms=ms, rstd=rstd, xhat=xhat, gamma=gamma, eps=eps)


def rmsnorm_staged_backward(dout, cache):
    """dout (..., D) -> {name: gradient} of gamma, xhat, rstd, ms, sq and x."""
    c = cache
    D = c["x"].shape[-1]
    # --- your code ---
    dgamma = (dout * c["xhat"]).reshape(-1, D).sum(axis=0)    # (D,)
    dxhat = dout * c["gamma"]                                 # (..., D)
    drstd = (dxhat * c["x"]).sum(axis=-1, keepdims=True)      # (..., 1)
    dms = drstd * -0.5 * (c["ms"] + c["eps"]) ** -1.5         # (..., 1)
    dsq = np.repeat(dms / D, D, axis=-1)                      # (..., D): 1/D of dms each
    dx = dxhat * c["rstd"] + dsq * 2 * c["x"]                 # (..., D): from xhat and sq
    # --- end of your code ---
    return dict(gamma=dgamma, xhat=dxhat, rstd=drstd, ms=dms, sq=dsq, x=dx)
