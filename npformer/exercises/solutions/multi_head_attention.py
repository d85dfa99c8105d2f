"""Exercise: multi-head self-attention with the fused input projection, as
torch.nn.MultiheadAttention (checked, not trained with: the model's module is npformer's).

Derivation: docs/backprop.md#multi-head-attention (section "Multi-head attention").

[Q | K | V] = x W_in^T + b_in in one product (W_in stacks W_q, W_k, W_v: (3D, D)), each split
into H heads, attention per head, the heads merged, then y = C W_o^T + b_o.
Shapes: x (B, T, D), w_in (3D, D), b_in (3D,), w_out (D, D), b_out (D,), mask broadcastable to
(B, H, T, T) -> y (B, T, D).
Write ``mha_backward``: given dout (B, T, D), return dx, dw_in, db_in, dw_out, db_out. npformer's
linear and attention backward passes are imported for you: the exercise is the plumbing (which
gradient goes where, the heads split and merged back).
"""
import numpy as np

from npformer.functional import (attention_backward, attention_forward, linear_backward,
                                 linear_forward, merge_heads, split_heads)


def mha_forward(x, w_in, b_in, w_out, b_out, n_heads, mask=None):
    """Returns (y, cache)."""
    d = x.shape[-1]
    qkv, in_cache = linear_forward(x, w_in, b_in)             # (B, T, 3D)
    q, k, v = (split_heads(qkv[..., i * d:(i + 1) * d], n_heads) for i in range(3))  # (B, H, T, d)
    ctx, attn_cache = attention_forward(q, k, v, mask)        # (B, H, T, d)
    y, out_cache = linear_forward(merge_heads(ctx), w_out, b_out)
    return y, (in_cache, attn_cache, out_cache, n_heads)


def mha_backward(dout, cache):
    """dout (B, T, D) -> dx (B, T, D), dw_in (3D, D), db_in (3D,), dw_out (D, D), db_out (D,)."""
    in_cache, attn_cache, out_cache, n_heads = cache
    # --- your code ---
    dctx, dw_out, db_out = linear_backward(dout, out_cache)   # (B, T, D)
    dq, dk, dv = attention_backward(split_heads(dctx, n_heads), attn_cache)   # (B, H, T, d)
    dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
    dx, dw_in, db_in = linear_backward(dqkv, in_cache)
    return dx, dw_in, db_in, dw_out, db_out
    # --- end of your code ---
