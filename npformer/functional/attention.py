"""Scaled dot-product attention (one call covers all heads) and the head split/merge reshapes.

Derivation: docs/backprop.md#attention.
"""
import math

import numpy as np

from .dropout import dropout_backward, dropout_forward
from .softcap import softcap_backward, softcap_forward
from .softmax import softmax_backward, softmax_forward


def split_heads(x, n_heads):
    """(B, T, H*d) -> (B, H, T, d), a view."""
    b, t, hd = x.shape
    return x.reshape(b, t, n_heads, hd // n_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, T, d) -> (B, T, H*d), a copy in row-major order."""
    b, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)


def attention_forward(q, k, v, mask=None, dropout_p=0.0, rng=None, training=False, scale=None,
                      softcap=None):
    """out = dropout(softmax(q k^T / sqrt(d_k), mask)) v.

    ``scale``: the factor of the scores (None: 1 / sqrt(d_k); Gemma 2's is
    query_pre_attn_scalar ** -0.5); ``softcap``: the scores are soft-capped,
    softcap * tanh(scores / softcap), before the mask and the softmax (Gemma 2's
    attn_logit_softcapping; None: not capped).

    Shape: q (B, H, Tq, dk), k (B, H, Tk, dk), v (B, H, Tk, dv),
           mask bool broadcastable to (B, H, Tq, Tk), True = may attend
           -> out (B, H, Tq, dv). ``cache`` also holds the attention weights ``probs``, and,
           with ``softcap``, an eighth entry: the capped scores' tanh.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.swapaxes(-1, -2)) * scale                # (B, H, Tq, Tk)
    capped = ()
    if softcap is not None:
        scores, t = softcap_forward(scores, softcap)
        capped = (t,)
    probs, _ = softmax_forward(scores, mask)                  # (B, H, Tq, Tk); its cache is probs
    probs_d, drop_cache = dropout_forward(probs, dropout_p, rng, training)
    out = probs_d @ v                                         # (B, H, Tq, dv)
    return out, (q, k, v, probs, probs_d, drop_cache, scale, *capped)


def attention_backward(dout, cache):
    """Backward of out = P' v, P' = dropout(P), P = softmax(S), S = q k^T * scale:

      dv = P'^T dout                 dP' = dout v^T
      dP = dropout_backward(dP')     dS  = P * (dP - rowsum(dP * P))
      dq = scale * dS k              dk  = scale * dS^T q

    Masked scores have P = 0, hence dS = 0: no gradient reaches masked keys. Soft-capped
    scores (an eighth cache entry) have dS multiplied by the cap's derivative before the scale.

    dS, dq, dk and dv have their subnormal entries set to 0 (:func:`flush_subnormal`). A head
    that has learnt to attend one key gives every other key a probability near 1e-38, so dS,
    and dq and dk of whole rows, land below float32's smallest normal number. Such values are
    some 30 orders of magnitude below the gradients next to them, and changing them to 0 changes
    no normal entry beyond rounding. Left in, they would make the products that read them many
    times slower: on x86 every arithmetic operation on a subnormal operand takes a microcode
    assist.
    Returns dq, dk, dv with the shapes of q, k, v.
    """
    q, k, v, probs, probs_d, drop_cache, scale = cache[:7]
    dv = flush_subnormal(probs_d.swapaxes(-1, -2) @ dout)    # (B, H, Tk, dv)
    dprobs = dropout_backward(dout @ v.swapaxes(-1, -2), drop_cache)   # (B, H, Tq, Tk)
    dscores = softmax_backward(dprobs, probs)
    if len(cache) > 7:                                        # soft-capped scores
        dscores = softcap_backward(dscores, cache[7])
    dscores *= scale
    flush_subnormal(dscores)
    dq = flush_subnormal(dscores @ k)                         # (B, H, Tq, dk)
    dk = flush_subnormal(dscores.swapaxes(-1, -2) @ q)        # (B, H, Tk, dk)
    return dq, dk, dv


def flush_subnormal(x):
    """x with every subnormal entry (0 < |x| < the dtype's smallest normal number: 1.2e-38 in
    float32, 2.2e-308 in float64) set to 0, in place. Returns x."""
    x[np.abs(x) < np.finfo(x.dtype).tiny] = 0
    return x


def attention_backward_into(dout, cache, dq, dk, dv):
    """:func:`attention_backward` writing dq, dk, dv into the given arrays (e.g. three head-split
    slices of one fused-projection gradient), so no concatenation is needed afterwards.
    Returns (dq, dk, dv)."""
    dq[...], dk[...], dv[...] = attention_backward(dout, cache)
    return dq, dk, dv
