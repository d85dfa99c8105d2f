"""Exercise, staged: masked softmax and attention, one named intermediate at a time, before the
fused softmax and attention exercises.

Derivation: docs/backprop.md#attention (section "Attention"). The softmax's own is the section
"Softmax" of the same file.

The forward is a chain, each line one value (the cache holds them all, by name); mask is
boolean, broadcastable to (B, H, Tq, Tk), True = may attend, here with no row all masked:
    scores = q k^T / sqrt(dk)   (B, H, Tq, Tk)
    e = exp(scores - m) where mask, else 0   (B, H, Tq, Tk); m, the row's largest allowed
                                score, only keeps exp finite: it cancels in p, so treat it as
                                a constant (in total no gradient flows through it)
    z = sum(e)            (B, H, Tq, 1)    over the keys
    p = e / z             (B, H, Tq, Tk)   the attention weights
    out = p v             (B, H, Tq, dv)
Write ``attention_staged_backward``: given dout = dL/dout, the gradient of every value, one line
each, in the order given (from out back to q): each is dL/d(that value), the shape of the value.
e is used twice (by z and by p): its gradient sums both. Leave a line None to have the ones
before it checked; the check names the first wrong line and those that use it.
"""
import math

import numpy as np


def attention_staged_forward(q, k, v, mask):
    """Returns (out, cache); the cache is {name: value} of the chain."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.swapaxes(-1, -2) * scale
    m = np.where(mask, scores, -np.inf).max(axis=-1, keepdims=True)
    e = np.where(mask, np.exp(scores - m), 0.0)
    z = e.sum(axis=-1, keepdims=True)
    p = e / z
    out = p @ v
    return out, dict(q=q, k=k, v=v, scale=scale, scores=scores, e=e, z=z, p=p)


def attention_staged_backward(dout, cache):
    """dout (B, H, Tq, dv) -> {name: gradient} of v, p, z, e, scores, k and q."""
    c = cache
    # --- your code ---
    dv = c["p"].swapaxes(-1, -2) @ dout                       # (B, H, Tk, dv)
    dp = dout @ c["v"].swapaxes(-1, -2)                       # (B, H, Tq, Tk)
    dz = -(dp * c["e"]).sum(axis=-1, keepdims=True) / c["z"] ** 2   # (B, H, Tq, 1)
    de = dp / c["z"] + dz                                     # (B, H, Tq, Tk): from p and z
    dscores = de * c["e"]                                     # (B, H, Tq, Tk)
    dk = dscores.swapaxes(-1, -2) @ c["q"] * c["scale"]       # (B, H, Tk, dk)
    dq = dscores @ c["k"] * c["scale"]                        # (B, H, Tq, dk)
    # --- end of your code ---
    return dict(v=dv, p=dp, z=dz, e=de, scores=dscores, k=dk, q=dq)
