"""Step-by-step decoding with a key/value cache, written with the functional core.

Training runs the decoder over the whole target at once. Generating, we only know the prefix,
so we run the decoder one position at a time. Re-running it on the growing prefix repeats the
same work at every step (O(T^2) projections); instead we keep, for every decoder layer,

* the self-attention keys/values of the positions decoded so far (appended at each step), and
* the cross-attention keys/values of the encoder memory (computed once per sentence).

A step then costs one position's worth of projections plus attention over the cache.

    state = IncrementalDecoder(model).start(src)      # encode + cross-attention K/V
    logits = state.step(prev_ids)                     # (B,) -> (B, V), appends to the cache

Only parameters are read from the model (``model.eval()`` semantics: no dropout), so the
model's own forward caches and its dropout rng are left untouched.
"""
import numpy as np

from .. import functional as F


def _attend(q, k, v, mask):
    """One attention call over cached keys. q (B, H, 1, d), k/v (B, H, S, d) -> (B, H, 1, d)."""
    out, _ = F.attention_forward(q, k, v, mask)
    return out


class DecoderState:
    """The cache of one batch of sentences being decoded (see ``IncrementalDecoder.start``).

    ``self_k[i]``/``self_v[i]`` (B, H, t, d) grow by one position per step; ``cross_k[i]``/
    ``cross_v[i]`` (B, H, S, d) and ``src_mask`` (B, 1, 1, S) stay fixed.
    """

    def __init__(self, decoder, memory, src_mask, cross_k, cross_v):
        self.decoder, self.memory, self.src_mask = decoder, memory, src_mask
        self.cross_k, self.cross_v = cross_k, cross_v
        n_layers = len(cross_k)
        self.self_k = [None] * n_layers
        self.self_v = [None] * n_layers
        self.length = 0                                           # positions decoded so far

    @property
    def batch_size(self):
        return self.memory.shape[0]

    def step(self, prev_ids):
        """Feed the previous token of every sentence; return next-token logits (B, V)."""
        return self.decoder.step(self, prev_ids)

    def reorder(self, index):
        """Keep/duplicate rows (beam search): every cached array is indexed by ``index`` (B',)."""
        index = np.asarray(index)
        self.memory, self.src_mask = self.memory[index], self.src_mask[index]
        self.cross_k = [k[index] for k in self.cross_k]
        self.cross_v = [v[index] for v in self.cross_v]
        self.self_k = [None if k is None else k[index] for k in self.self_k]
        self.self_v = [None if v is None else v[index] for v in self.self_v]


class IncrementalDecoder:
    """Runs a ``Transformer``'s decoder one position at a time from its parameters."""

    def __init__(self, model):
        self.model = model
        self.n_heads = model.config.n_heads
        self.norm_first = model.config.norm_first
        self.eps = model.config.layer_norm_eps
        self.act_forward, _ = F.ACTIVATIONS[model.config.activation]
        self.layers = list(model.decoder.layers)

    def start(self, src):
        """Encode ``src`` (B, S) and precompute cross-attention K/V for every layer."""
        was_training = self.model.training
        self.model.eval()
        try:
            memory, src_mask = self.model.encode(src)             # (B, S, D), (B, 1, 1, S)
        finally:
            self.model.train(was_training)
        return self.start_from_memory(memory, src_mask)

    def start_from_memory(self, memory, src_mask):
        cross_k, cross_v = [], []
        for layer in self.layers:
            attn = layer.multihead_attn
            qk = attn.qk_dim
            kv, _ = F.linear_forward(memory, attn.in_proj_weight.data[qk:],
                                     attn.in_proj_bias.data[qk:])   # (B, S, qk + D)
            cross_k.append(F.split_heads(kv[..., :qk], self.n_heads))    # (B, H, S, dk)
            cross_v.append(F.split_heads(kv[..., qk:], self.n_heads))    # (B, H, S, dv)
        return DecoderState(self, memory, src_mask, cross_k, cross_v)

    # -- one position ----------------------------------------------------------------------------
    def _norm(self, norm, x):
        y, _ = F.layernorm_forward(x, norm.weight.data, norm.bias.data, self.eps)
        return y

    def _residual(self, x, sublayer, norm):
        """post-norm: LN(x + f(x)); pre-norm: x + f(LN(x)) (dropout is off when decoding)."""
        if self.norm_first:
            return x + sublayer(self._norm(norm, x))
        return self._norm(norm, x + sublayer(x))

    def _self_attention(self, state, i, attn, x):
        qk, h = attn.qk_dim, self.n_heads
        qkv, _ = F.linear_forward(x, attn.in_proj_weight.data, attn.in_proj_bias.data)  # (B, 1, 2qk+D)
        q = F.split_heads(qkv[..., :qk], h)                       # (B, H, 1, dk)
        k = F.split_heads(qkv[..., qk:2 * qk], h)
        v = F.split_heads(qkv[..., 2 * qk:], h)
        if state.self_k[i] is None:
            state.self_k[i], state.self_v[i] = k, v
        else:                                                     # (B, H, t, d) -> (B, H, t+1, d)
            state.self_k[i] = np.concatenate([state.self_k[i], k], axis=2)
            state.self_v[i] = np.concatenate([state.self_v[i], v], axis=2)
        # the newest position may see every cached one: no causal mask is needed
        ctx = _attend(q, state.self_k[i], state.self_v[i], None)
        out, _ = F.linear_forward(F.merge_heads(ctx), attn.out_proj.weight.data,
                                  attn.out_proj.bias.data)
        return out

    def _cross_attention(self, state, i, attn, x):
        qk = attn.qk_dim
        q, _ = F.linear_forward(x, attn.in_proj_weight.data[:qk], attn.in_proj_bias.data[:qk])
        ctx = _attend(F.split_heads(q, self.n_heads), state.cross_k[i], state.cross_v[i],
                      state.src_mask)
        out, _ = F.linear_forward(F.merge_heads(ctx), attn.out_proj.weight.data,
                                  attn.out_proj.bias.data)
        return out

    def _ffn(self, ffn, x):
        h, _ = F.linear_forward(x, ffn.linear1.weight.data, ffn.linear1.bias.data)   # (B, 1, d_ff)
        h, _ = self.act_forward(h)
        out, _ = F.linear_forward(h, ffn.linear2.weight.data, ffn.linear2.bias.data)
        return out

    def step(self, state, prev_ids):
        """prev_ids (B,) int: the token at position ``state.length`` -> logits (B, V)."""
        model = self.model
        prev_ids = np.asarray(prev_ids, dtype=np.int64).reshape(-1, 1)          # (B, 1)
        if prev_ids.shape[0] != state.batch_size:
            raise ValueError(f"prev_ids: expected {state.batch_size} ids (one per sentence), "
                             f"got {prev_ids.shape[0]}")
        t = state.length
        if t >= model.max_len:
            raise ValueError(f"step: position {t} exceeds the model's max_len={model.max_len}")
        x, _ = F.embedding_forward(prev_ids, model.tgt_embed.weight.data, model.tgt_embed.scale)
        x = x + model.positions[t:t + 1]                          # (B, 1, D)
        for i, layer in enumerate(self.layers):
            x = self._residual(x, lambda h: self._self_attention(state, i, layer.self_attn, h),
                               layer.norm1)
            x = self._residual(x, lambda h: self._cross_attention(state, i, layer.multihead_attn, h),
                               layer.norm2)
            x = self._residual(x, lambda h: self._ffn(layer.ffn, h), layer.norm3)
        x = self._norm(model.decoder.norm, x)
        logits, _ = F.linear_forward(x, model.generator.weight.data, model.generator.bias.data)
        state.length = t + 1
        return logits[:, 0]                                       # (B, V)
