"""Exercise, staged: LayerNorm's backward one named intermediate at a time, before the fused
formula of the next exercise (the first of CS231n's two batch-norm derivations, Karpathy's
"becoming a backprop ninja").

Derivation: docs/backprop.md#layernorm (section "LayerNorm").

The forward is a chain, each line one value (the cache holds them all, by name):
    mu = mean(x)          (..., 1)     the mean over the last axis
    xc = x - mu           (..., D)
    var = mean(xc * xc)   (..., 1)     biased, as torch.nn.LayerNorm
    rstd = 1 / sqrt(var + eps)  (..., 1)
    xhat = xc * rstd      (..., D)
    y = xhat * gamma + beta     (..., D); gamma, beta (D,)
Write ``layernorm_staged_backward``: given dout = dL/dy, the gradient of every value, one line
each, in the order given (from y back to x): each is dL/d(that value), the shape of the value.
A value used by two later lines (x, xc, ...) sums the gradient from both. Leave a line None to
have the ones before it checked; the check names the first wrong line and those that use it.
"""
import numpy as np                                        # yours to use in the steps


def layernorm_staged_forward(x, gamma, beta, eps=1e-5):
    """Returns (y, cache); the cache is {name: value} of the chain."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc ** 2).mean(axis=-1, keepdims=True)
    rstd = (var + eps) ** -0.5
    xhat = xc * rstd
    y = xhat * gamma + beta
    return y, dict(x=x, mu=mu, xc=xc, var=var, rstd=rstd, xhat=xhat, gamma=gamma, eps=eps)


def layernorm_staged_backward(dout, cache):
    """dout (..., D) -> {name: gradient} of beta, gamma, xhat, rstd, var, xc, mu and x."""
    c = cache
    D = c["x"].shape[-1]
    rows = dout.reshape(-1, D)                                # (N, D): every row of the batch
    # --- your code ---
    dbeta = rows.sum(axis=0)                                  # (D,)
    dgamma = (rows * c["xhat"].reshape(-1, D)).sum(axis=0)    # (D,)
    dxhat = dout * c["gamma"]                                 # (..., D)
    drstd = (dxhat * c["xc"]).sum(axis=-1, keepdims=True)     # (..., 1)
    dvar = drstd * -0.5 * (c["var"] + c["eps"]) ** -1.5       # (..., 1)
    dxc = dxhat * c["rstd"] + dvar * 2 * c["xc"] / D          # (..., D): from xhat and var
    dmu = -dxc.sum(axis=-1, keepdims=True)                    # (..., 1)
    dx = dxc + dmu / D                                        # (..., D): from xc and mu
    # --- end of your code ---
    return dict(beta=dbeta, gamma=dgamma, xhat=dxhat, rstd=drstd, var=dvar, xc=dxc, mu=dmu, x=dx)
