"""Exercise: scaled dot-product attention, all heads at once.

Derivation: docs/backprop.md#attention (section "Attention").

out = P' v with P' = dropout(P), P = softmax(S, mask), S = q k^T * scale, scale = 1 / sqrt(d_k).
Shapes: q (B, H, Tq, dk), k (B, H, Tk, dk), v (B, H, Tk, dv), mask bool broadcastable to
(B, H, Tq, Tk) (True = may attend) -> out (B, H, Tq, dv).
Write ``attention_backward``: given dout (B, H, Tq, dv), return dq, dk, dv with the shapes of q,
k and v. ``softmax_backward`` and ``dropout_backward`` are imported for you (npformer's; use
your own if you like). ``flush_subnormal`` (optional) sets entries below the dtype's smallest
normal number to 0, which keeps float32 training fast; the reference calls it on dS, dq, dk, dv.

Simplify (after 6a, attention_staged, the same chain without dropout, one intermediate at a
time): the softmax's steps become one call, and dropout adds one step between P and P'.
"""
import math

from npformer.functional import (dropout_backward, dropout_forward, flush_subnormal,
                                 softmax_backward, softmax_forward)


from npformer.functional.attention import attention_forward  # given, its docstring:
# "Returns (out, cache); the cache's fourth entry is the attention weights P."


from npformer.functional.attention import attention_backward  # yours, its docstring:
# "dout (B, H, Tq, dv) -> dq (B, H, Tq, dk), dk (B, H, Tk, dk), dv (B, H, Tk, dv)."
