"""Multi-head attention with a fused input projection, as torch.nn.MultiheadAttention.

Derivation: docs/backprop.md#multi-head-attention.
"""
import numpy as np

from .. import functional as F
from ..backend import ops
from .init import xavier_uniform
from .linear import Linear
from .module import Module, Parameter


class MultiHeadAttention(Module):
    """Self-attention (``memory is None``) or cross-attention (queries from ``x``, keys and
    values from ``memory``).

    ``in_proj_weight`` stacks W_q (qk_dim, D), W_k (qk_dim, D) and W_v (D, D) into one
    (2*qk_dim + D, D) matrix, so self-attention projects Q, K and V in a single matrix product.
    ``qk_dim`` defaults to ``d_model`` (PyTorch's layout); a smaller value makes attention scores
    cheaper without changing the value path.

    Shape: x (B, T, D), memory (B, S, D) or None, mask bool broadcastable to (B, H, T, S),
    True = may attend -> (B, T, D).
    """

    def __init__(self, d_model, n_heads, dropout=0.0, qk_dim=None, *, rng, dtype=np.float32):
        super().__init__()
        qk_dim = d_model if qk_dim is None else qk_dim
        if d_model % n_heads or qk_dim % n_heads:
            raise ValueError(f"n_heads: expected a divisor of d_model={d_model} and qk_dim={qk_dim}, "
                             f"got {n_heads}")
        self.d_model, self.n_heads, self.qk_dim, self.dropout = d_model, n_heads, qk_dim, dropout
        self.rng = rng
        self.in_proj_weight = Parameter(xavier_uniform(rng, (2 * qk_dim + d_model, d_model), dtype))
        self.in_proj_bias = Parameter(np.zeros(2 * qk_dim + d_model, dtype=dtype))
        self.out_proj = Linear(d_model, d_model, rng=rng, dtype=dtype)
        self._cache = None
        self._ops = None                  # the backend that ran forward: only its backward fits the cache
        self.attn_weights = None          # (B, H, T, S) after each forward, for inspection/plots

    def forward(self, x, memory=None, mask=None):
        qk, h = self.qk_dim, self.n_heads
        w, b = self.in_proj_weight.data, self.in_proj_bias.data
        self._ops = f = ops()                 # NumPy reference or Numba kernels (npformer.backend)
        if memory is None:                                        # self-attention
            qkv, proj_cache = f.linear_forward(x, w, b)               # (B, T, 2*qk + D)
            q, k, v = qkv[..., :qk], qkv[..., qk:2 * qk], qkv[..., 2 * qk:]
        else:                                                     # cross-attention
            q, q_cache = f.linear_forward(x, w[:qk], b[:qk])          # (B, T, qk)
            kv, kv_cache = f.linear_forward(memory, w[qk:], b[qk:])       # (B, S, qk + D)
            k, v = kv[..., :qk], kv[..., qk:]
            proj_cache = (q_cache, kv_cache)
        ctx, attn_cache = f.attention_forward(
            F.split_heads(q, h), F.split_heads(k, h), F.split_heads(v, h),   # (B, H, T|S, d)
            mask, self.dropout, self.rng, self.training)
        self.attn_weights = attn_cache[3]
        out = self.out_proj.forward(F.merge_heads(ctx))           # (B, T, D)
        self._cache = (memory is None, proj_cache, attn_cache)
        return out

    def backward(self, dout):
        """Returns dx, or (dx, dmemory) for cross-attention.

        dq, dk, dv are written straight into the gradient of the fused projection
        ((B, T, 2*qk + D) for self-attention, no concatenation), and the projection's weight
        gradients are added into .grad."""
        is_self, proj_cache, attn_cache = self._cache
        f, qk, h = self._ops, self.qk_dim, self.n_heads
        dctx = F.split_heads(self.out_proj.backward(dout), h)     # (B, H, T, d)
        q, k = attn_cache[:2]                                      # (B, H, T|S, d)
        n_b, tq, tk = q.shape[0], q.shape[2], k.shape[2]
        gw, gb = self.in_proj_weight.grad, self.in_proj_bias.grad
        if is_self:
            dqkv = np.empty((n_b, tq, 2 * qk + self.d_model), dtype=q.dtype)   # (B, T, 2*qk + D)
            f.attention_backward_into(dctx, attn_cache, F.split_heads(dqkv[..., :qk], h),
                                      F.split_heads(dqkv[..., qk:2 * qk], h),
                                      F.split_heads(dqkv[..., 2 * qk:], h))
            return f.linear_backward_accumulate(dqkv, proj_cache, gw, gb)
        q_cache, kv_cache = proj_cache
        dq = np.empty((n_b, tq, qk), dtype=q.dtype)                            # (B, T, qk)
        dkv = np.empty((n_b, tk, qk + self.d_model), dtype=q.dtype)            # (B, S, qk + D)
        f.attention_backward_into(dctx, attn_cache, F.split_heads(dq, h),
                                  F.split_heads(dkv[..., :qk], h), F.split_heads(dkv[..., qk:], h))
        dx = f.linear_backward_accumulate(dq, q_cache, gw[:qk], gb[:qk])
        dmem = f.linear_backward_accumulate(dkv, kv_cache, gw[qk:], gb[qk:])
        return dx, dmem
