"""Multi-head attention with a fused input projection, as torch.nn.MultiheadAttention.

Derivation: docs/backprop.md#multi-head-attention.
"""
import numpy as np

from .. import functional as F
from ..backend import ops
from .init import xavier_uniform, zeros
from .kv_cache import KVCache
from .linear import Linear
from .lora import add_adapters, projection_backward
from .module import Module, Parameter
from .rmsnorm import RMSNorm


class MultiHeadAttention(Module):
    """Self-attention (``memory is None``) or cross-attention (queries from ``x``, keys and
    values from ``memory``).

    ``in_proj_weight`` stacks W_q (qk_dim, D), W_k (qk_dim, D) and W_v (v_dim, D) into one
    (2*qk_dim + v_dim, D) matrix, so self-attention projects Q, K and V in a single matrix
    product; ``out_proj`` maps the heads' v_dim back to D. ``qk_dim`` and ``v_dim`` default to
    ``d_model`` (PyTorch's layout); a smaller ``qk_dim`` makes attention scores cheaper without
    changing the value path, and a decoder whose heads have a size of their own (Qwen3: 16 heads
    of 128 in a width of 1024) sets both to n_heads x head size. ``bias``: the projection of Q, K
    and V adds ``in_proj_bias``; ``out_bias``: ``out_proj`` adds one (GPT-2 has both, Llama
    neither). ``rotary``: the (cos, sin) tables of ``F.rotary_tables`` (max_len, d_k / 2):
    self-attention then turns its queries and keys by their positions (rotary positions,
    GPT-NeoX's layout) before the scores.

    Grouped-query attention: ``n_kv_heads`` key and value heads (None: ``n_heads``), each shared
    by ``n_heads / n_kv_heads`` consecutive query heads (Llama 2 70B, Llama 3, Qwen; one is
    multi-query attention). The projection then makes that many key and value heads, a decoding
    cache holds only those, and the backward sums each group's gradients into its shared head.
    ``qk_norm``: an RMSNorm over each query and key head before the rotary turn (Qwen3), with
    ``norm_eps``. ``scale``: the factor of the scores (None: 1 / sqrt(head size)); ``softcap``:
    the scores soft-capped to (-softcap, softcap) before the softmax (Gemma 2); either runs the
    attention itself on the reference (``npformer.functional``) whatever the backend.

    ``window``: sliding-window self-attention (Mistral): the query at position p sees only keys
    p - window + 1 .. p (``F.causal_mask``'s window), in the forward (combined with the ``mask``
    given) and in cached steps, whose cache keeps every position and masks the older ones.
    None: every key the mask allows.

    Shape: x (B, T, D), memory (B, S, D) or None, mask bool broadcastable to (B, H, T, S),
    True = may attend -> (B, T, D).
    """

    def __init__(self, d_model, n_heads, dropout=0.0, qk_dim=None, rotary=None, *, rng,
                 dtype=np.float32, v_dim=None, bias=True, out_bias=True, n_kv_heads=None,
                 qk_norm=False, norm_eps=1e-6, scale=None, softcap=None, window=None):
        super().__init__()
        qk_dim = d_model if qk_dim is None else qk_dim
        v_dim = d_model if v_dim is None else v_dim
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if v_dim % n_heads or qk_dim % n_heads:
            raise ValueError(f"n_heads: expected a divisor of the value width {v_dim} and "
                             f"qk_dim={qk_dim}, got {n_heads}")
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads: expected a divisor of n_heads={n_heads}, got "
                             f"{n_kv_heads}")
        if rotary is not None and 2 * rotary[0].shape[1] != qk_dim // n_heads:
            raise ValueError(f"rotary: expected tables of {qk_dim // n_heads // 2} pairs (half the "
                             f"head size), got {rotary[0].shape[1]}")
        self.d_model, self.n_heads, self.qk_dim, self.dropout = d_model, n_heads, qk_dim, dropout
        self.v_dim, self.n_kv_heads, self.group = v_dim, n_kv_heads, n_heads // n_kv_heads
        self.k_width = n_kv_heads * (qk_dim // n_heads)        # the key rows (qk_dim without GQA)
        self.v_width = n_kv_heads * (v_dim // n_heads)         # the value rows
        self.rotary, self.window = rotary, window
        self.rng = rng
        # the attention's own options (Gemma 2's): only the reference's attention takes them
        self.score_options = {name: value for name, value in (("scale", scale),
                                                              ("softcap", softcap))
                              if value is not None}
        rows = qk_dim + self.k_width + self.v_width
        self.in_proj_weight = Parameter(xavier_uniform(rng, (rows, d_model), dtype))
        self.in_proj_bias = Parameter(zeros(rows, dtype)) if bias else None
        self.out_proj = Linear(v_dim, d_model, bias=out_bias, rng=rng, dtype=dtype)
        self.q_norm = self.k_norm = None
        if qk_norm:                       # one gain per dimension of a head, shared by the heads
            self.q_norm = RMSNorm(qk_dim // n_heads, norm_eps, dtype=dtype)
            self.k_norm = RMSNorm(qk_dim // n_heads, norm_eps, dtype=dtype)
        self.adapters = []                # LoRA updates of in_proj_weight's rows (npformer.lora)
        self._cache = None
        self._ops = None                  # the backend that ran forward: only its backward fits the cache
        self._attention_ops = None        # the one that ran the attention (the reference with options)
        self.attn_weights = None          # (B, H, T, S) after each forward, for inspection/plots

    # -- the pieces forward and step share ------------------------------------------------------
    def _bias(self, rows, grad=False):
        """The rows of ``in_proj_bias`` (or of its gradient), or None without a bias."""
        if self.in_proj_bias is None:
            return None
        bias = self.in_proj_bias.grad if grad else self.in_proj_bias.data   # grad None: frozen
        return bias if rows is None or bias is None else bias[rows]

    def _project_self(self, x, start):
        """x (B, T, D) at positions start .. start + T - 1 -> q (B, H, T, dk), k (B, Hkv, T, dk),
        v (B, Hkv, T, dv): one product, then the per-head norms of q and k where the attention
        has them, then the rotary turn (:meth:`_turn`). Returns q, k, v, the projection's cache
        and the turn's."""
        qk, kw, h, hkv = self.qk_dim, self.k_width, self.n_heads, self.n_kv_heads
        qkv, cache = self._ops.linear_forward(x, self.in_proj_weight.data, self._bias(None))
        add_adapters(qkv, x, self.adapters)                              # (B, T, qk + kw + vw)
        q, k = F.split_heads(qkv[..., :qk], h), F.split_heads(qkv[..., qk:qk + kw], hkv)
        if self.q_norm is not None:
            q, k = self.q_norm.forward(q), self.k_norm.forward(k)
            turn_cache = self._turn((q, k), start)
        else:                                  # q and k side by side in qkv: turned in one pass
            turn_cache = self._turn((F.split_heads(qkv[..., :qk + kw], h + hkv),), start)
        return q, k, F.split_heads(qkv[..., qk + kw:], hkv), cache, turn_cache

    def _project_query(self, x):
        """x (B, T, D) -> q (B, H, T, dk), the query third of the projection."""
        qk = self.qk_dim
        q, cache = self._ops.linear_forward(x, self.in_proj_weight.data[:qk],
                                            self._bias(slice(None, qk)))       # (B, T, qk)
        add_adapters(q, x, self._adapters(query=True))
        return F.split_heads(q, self.n_heads), cache

    def _project_memory(self, memory):
        """memory (B, S, D) -> k (B, Hkv, S, dk), v (B, Hkv, S, dv), the key and value rows."""
        qk, kw, hkv = self.qk_dim, self.k_width, self.n_kv_heads
        kv, cache = self._ops.linear_forward(memory, self.in_proj_weight.data[qk:],
                                             self._bias(slice(qk, None)))      # (B, S, kw + vw)
        add_adapters(kv, memory, self._adapters(query=False), offset=qk)
        return F.split_heads(kv[..., :kw], hkv), F.split_heads(kv[..., kw:], hkv), cache

    def _adapters(self, query):
        """The adapters of the query rows (``query``) or of the key and value rows: a
        cross-attention projects them from different inputs (``npformer.lora`` gives it one
        adapter for each side)."""
        return [a for a in self.adapters if (a.stop <= self.qk_dim) == query]

    def _share(self, kv):
        """Key or value heads (B, Hkv, T, d) -> (B, H, T, d): each repeated for its group of
        query heads (query head i reads key/value head i // group, as Hugging Face's
        ``repeat_kv``), for a backend whose attention takes as many key/value heads as query
        heads (the NumPy reference: the readable formulation). Without grouping, kv itself."""
        return kv if self.group == 1 else np.repeat(kv, self.group, axis=1)

    def _gather(self, d_shared):
        """The backward of ``_share``: (B, H, T, d) -> (B, Hkv, T, d), each group's gradients
        summed into its shared head (already per kv head where the attention read them
        unshared: returned as it is)."""
        b, h, t, d = d_shared.shape
        if h == self.n_kv_heads:
            return d_shared
        return d_shared.reshape(b, self.n_kv_heads, self.group, t, d).sum(axis=2)

    def _turn(self, heads, start):
        """Rotary positions: each of ``heads`` (B, n, T, dk), at positions start .. start + T - 1,
        turned in place. The queries' and keys' heads, or, where they are still views of the
        projection's output (which nothing else keeps), both as one (B, H + Hkv, T, dk) view of
        its q and k columns: one pass over the projection's rows. Returns the cache of the turn
        (None without rotary positions)."""
        if self.rotary is None:
            return None
        cos, sin = self.rotary
        for x in heads:
            _, cache = self._ops.rotary_forward(x, cos, sin, start, out=x)
        return cache

    def _turn_back(self, dheads, turn_cache):
        """The turn's backward, in place on each of ``dheads`` (as :meth:`_turn`'s ``heads``)."""
        if turn_cache is not None:
            for dx in dheads:
                self._ops.rotary_backward(dx, turn_cache, out=dx)

    def _attend(self, q, k, v, mask):
        """Heads-split q (B, H, T, dk), k and v (B, Hkv, S, d) -> out (B, T, D) through the
        output projection. Grouped heads are repeated to the query heads (``_share``) unless
        the backend reads them as they are (``reads_grouped_kv``: the Numba kernels, in
        training and in cached steps alike, with no copy, and sum dk, dv over each group)."""
        f = self._attention_ops = F if self.score_options else self._ops
        reads = getattr(f, "reads_grouped_kv", None)
        if self.group > 1 and reads is not None and reads(q.shape, k.shape, q.itemsize):
            shared_k, shared_v = k, v                                 # (B, Hkv, S, d)
        else:
            shared_k, shared_v = self._share(k), self._share(v)      # (B, H, S, d)
        ctx, attn_cache = f.attention_forward(q, shared_k, shared_v, mask, self.dropout,
                                              self.rng, self.training,
                                              **self.score_options)   # (B, H, T, dv)
        return self.out_proj.forward(F.merge_heads(ctx)), attn_cache

    def _attend_step(self, q, k, v, mask):
        """A cached step's attention, as :meth:`_attend` (-> (B, T, D)): the backend's fused
        ``attention_step`` where it has one (the Numba kernels: one pass per row, keys and
        values read in place, no probabilities kept) and nothing needs more (in evaluation,
        without the attention's own options); else :meth:`_attend`'s path."""
        fused = getattr(self._ops, "attention_step", None)
        if fused is None or self.score_options or self.training:
            return self._attend(q, k, v, mask)[0]
        return self.out_proj.forward(F.merge_heads(fused(q, k, v, mask)))

    # -- training: all positions at once ---------------------------------------------------------
    def forward(self, x, memory=None, mask=None):
        self._ops = ops()                 # NumPy reference or Numba kernels (npformer.backend)
        turn_cache = None
        if memory is None:                                        # self-attention
            q, k, v, proj_cache, turn_cache = self._project_self(x, 0)
            if self.window is not None:                           # (1, 1, T, T)
                window = F.causal_mask(x.shape[1], window=self.window)
                mask = window if mask is None else mask & window
        else:                                                     # cross-attention
            q, q_cache = self._project_query(x)
            k, v, kv_cache = self._project_memory(memory)
            proj_cache = (q_cache, kv_cache)
        out, attn_cache = self._attend(q, k, v, mask)
        self.attn_weights = attn_cache[3]
        self._cache = (memory is None, proj_cache, attn_cache, turn_cache)
        return out

    # -- decoding: new positions over the cached ones ---------------------------------------------
    def new_cache(self, batch_size, capacity, dtype):
        """An empty self-attention cache for ``batch_size`` rows of up to ``capacity`` positions."""
        d_k, d_v = self.qk_dim // self.n_heads, self.v_dim // self.n_heads
        return KVCache(batch_size, self.n_kv_heads, capacity, d_k, d_v, dtype)   # Hkv heads

    def memory_cache(self, memory):
        """The cross-attention keys and values of ``memory`` (B, S, D), computed once."""
        self._ops = ops()
        k, v, _ = self._project_memory(memory)
        cache = KVCache(memory.shape[0], self.n_kv_heads, memory.shape[1], k.shape[-1],
                        v.shape[-1], memory.dtype)
        cache.append(k, v)
        return cache

    def step(self, x, cache):
        """Self-attention of the newest positions x (R, t, D) -> (R, t, D): their keys and values
        join ``cache`` (from ``new_cache``) and each query attends to every cached position up
        to its own. One position (t = 1, a decoding step) sees the whole cache: no mask; several
        (a language model's prompt, run in one go) see each other causally. With a ``window``,
        each sees only the cached positions inside it (the rest masked)."""
        self._ops = ops()
        start, t = cache.length, x.shape[1]
        q, k, v, _, _ = self._project_self(x, start)              # (R, H, t, d)
        cache.append(k, v)
        sliding = self.window is not None and start + t > self.window
        mask = F.causal_mask(t, start, self.window) if t > 1 or sliding else None
        return self._attend_step(q, cache.keys(), cache.values(), mask)

    def cross_step(self, x, cache, mask=None):
        """Cross-attention of the newest position x (R, 1, D) -> (R, 1, D) over ``cache`` (from
        ``memory_cache``: one row per source). The R rows come in equal groups of consecutive
        rows, one group per source (a sentence's beams); a group's queries attend to its
        source's keys as so many query positions, so the keys are never repeated."""
        self._ops = ops()
        n = cache.batch_size
        q, _ = self._project_query(x.reshape(n, -1, self.d_model))   # (n, H, group, dk)
        out = self._attend_step(q, cache.keys(), cache.values(), mask)  # (n, group, D)
        return out.reshape(x.shape)

    def backward(self, dout):
        """Returns dx, or (dx, dmemory) for cross-attention.

        dq, dk, dv are written straight into the gradient of the fused projection
        ((B, T, qk + kw + vw) for self-attention, no concatenation), and the projection's
        weight gradients are added into .grad. With rotary positions, dq and dk are turned back
        in place there (the turn's transpose). With grouped key/value heads, the attention's
        per-query-head dk and dv are summed over each group first; with per-head norms, their
        backward follows the turn's."""
        is_self, proj_cache, attn_cache, turn_cache = self._cache
        f, qk, kw, h, hkv = self._ops, self.qk_dim, self.k_width, self.n_heads, self.n_kv_heads
        fa = self._attention_ops                                   # its cache, its backward
        dctx = F.split_heads(self.out_proj.backward(dout), h)     # (B, H, T, d)
        q, k, v = attn_cache[:3]                                   # (B, H, T|S, d)
        n_b, tq, tk = q.shape[0], q.shape[2], k.shape[2]
        gw = self.in_proj_weight.grad     # None: frozen (npformer.lora), no dW computed
        if is_self:
            dqkv = np.empty((n_b, tq, qk + kw + self.v_width), dtype=q.dtype)
            dq, dk = F.split_heads(dqkv[..., :qk], h), F.split_heads(dqkv[..., qk:qk + kw], hkv)
            dv = F.split_heads(dqkv[..., qk + kw:], hkv)
            dqk = F.split_heads(dqkv[..., :qk + kw], h + hkv)      # dq and dk side by side
            per_kv_head = k.shape[1] == hkv                      # no repeat: dk, dv per kv head
            if per_kv_head and self.q_norm is None:                # straight into dqkv
                fa.attention_backward_into(dctx, attn_cache, dq, dk, dv)
            else:
                dq_h, dk_h, dv_h = np.empty_like(q), np.empty_like(k), np.empty_like(v)
                fa.attention_backward_into(dctx, attn_cache, dq_h, dk_h, dv_h)
                dk_h, dv[...] = self._gather(dk_h), self._gather(dv_h)   # (B, Hkv, T, d)
                if self.q_norm is not None:                # the turn back, then the norms'
                    self._turn_back((dq_h, dk_h), turn_cache)
                    dq_h, dk_h = self.q_norm.backward(dq_h), self.k_norm.backward(dk_h)
                dq[...], dk[...] = dq_h, dk_h
            if self.q_norm is None:                        # turned back in one pass in dqkv
                self._turn_back((dqk,), turn_cache)
            return projection_backward(f, dqkv, proj_cache, gw, self._bias(None, grad=True),
                                       self.adapters)
        q_cache, kv_cache = proj_cache
        dq = np.empty((n_b, tq, qk), dtype=q.dtype)                            # (B, T, qk)
        dkv = np.empty((n_b, tk, kw + self.v_width), dtype=q.dtype)            # (B, S, kw + vw)
        if k.shape[1] == hkv:                                      # dk, dv per kv head
            fa.attention_backward_into(dctx, attn_cache, F.split_heads(dq, h),
                                      F.split_heads(dkv[..., :kw], hkv),
                                      F.split_heads(dkv[..., kw:], hkv))
        else:
            dk_h, dv_h = np.empty_like(k), np.empty_like(v)
            fa.attention_backward_into(dctx, attn_cache, F.split_heads(dq, h), dk_h, dv_h)
            F.split_heads(dkv[..., :kw], hkv)[...] = self._gather(dk_h)
            F.split_heads(dkv[..., kw:], hkv)[...] = self._gather(dv_h)
        dx = projection_backward(f, dq, q_cache, None if gw is None else gw[:qk],
                                 self._bias(slice(None, qk), True), self._adapters(query=True))
        dmem = projection_backward(f, dkv, kv_cache, None if gw is None else gw[qk:],
                                   self._bias(slice(qk, None), True),
                                   self._adapters(query=False), offset=qk)
        return dx, dmem
