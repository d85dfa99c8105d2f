"""The block of a decoder-only model, chosen by its configuration: a decoder is a list of these,
and a new variant (another norm, another feed-forward, grouped-query attention) is a field of
``GPTConfig`` plus its layer pair, not a class.

    block = Block(config, rotary, rng=rng, dtype=np.float32)    # GPT builds n_layers of them

Parameters, in ``named_parameters()`` order (each family's names for them in
``npformer.families``):

    self_attn.in_proj_weight ((H + 2 H_kv) d_h, D), self_attn.in_proj_bias   [qkv_bias]
                       (the query rows, then the key rows, then the value rows)
    self_attn.out_proj.weight (D, H d_h), self_attn.out_proj.bias (D,)          [proj_bias]
    self_attn.q_norm.weight (d_h,), self_attn.k_norm.weight (d_h,)             [qk_norm]
    ffn.linear1.weight (d_ff, D), ffn.linear1.bias (d_ff,)                      [proj_bias]
                       (SwiGLU: (2 d_ff, D), the gate's rows then the up projection's)
    ffn.linear2.weight (D, d_ff), ffn.linear2.bias (D,)                         [proj_bias]
    norm1.weight (D,), norm1.bias (D,), norm2.weight (D,), norm2.bias (D,)   [RMSNorm: no bias]
"""
from .attention import MultiHeadAttention
from .dropout import Dropout
from .encoder import SelfAttentionBlock
from .feedforward import FeedForward, SwiGLUFeedForward
from .layernorm import LayerNorm
from .rmsnorm import RMSNorm

# GPTConfig.norm and GPTConfig.ffn -> the module that builds it (the configuration refuses the
# variants whose layer pairs are not built yet)
NORMS = {"layernorm": lambda config, dtype: LayerNorm(config.d_model, config.layer_norm_eps,
                                                      dtype=dtype),
         "rmsnorm": lambda config, dtype: RMSNorm(config.d_model, config.layer_norm_eps,
                                                  dtype=dtype)}
FFNS = {"mlp": lambda config, dropout, rng, dtype: FeedForward(
             config.d_model, config.d_ff, dropout, config.activation, bias=config.proj_bias,
             rng=rng, dtype=dtype),
        "swiglu": lambda config, dropout, rng, dtype: SwiGLUFeedForward(
             config.d_model, config.d_ff, dropout, bias=config.proj_bias, rng=rng, dtype=dtype)}


class Block(SelfAttentionBlock):
    """Causal self-attention then feed-forward, each in a residual connection (pre-norm when
    ``config.norm_first``), its parts chosen by ``config`` (a ``GPTConfig``). ``rotary``: the
    attention's (cos, sin) tables, or None. Shape: x (B, T, D) -> (B, T, D)."""

    def __init__(self, config, rotary=None, *, rng, dtype):
        super().__init__()
        self.norm_first = config.norm_first
        width = config.n_heads * config.head_size
        self.self_attn = MultiHeadAttention(
            config.d_model, config.n_heads, config.attention_dropout, qk_dim=width, rotary=rotary,
            v_dim=width, bias=config.qkv_bias, out_bias=config.proj_bias,
            n_kv_heads=config.n_kv_heads, qk_norm=config.qk_norm, norm_eps=config.layer_norm_eps,
            rng=rng, dtype=dtype)
        self.ffn = FFNS[config.ffn](config, config.activation_dropout, rng, dtype)
        self.norm1 = NORMS[config.norm](config, dtype)
        self.norm2 = NORMS[config.norm](config, dtype)
        self.dropout1 = Dropout(config.dropout, rng=rng)
        self.dropout2 = Dropout(config.dropout, rng=rng)

    def norm_gains(self):
        """The norms' scale parameters (they start at 1)."""
        return [self.norm1.weight, self.norm2.weight]

    def residual_projections(self):
        """The two matrices that end a residual branch (GPT-2 scales their initial weights by
        1 / sqrt(2 n_layers), so the residual stream's variance does not grow with depth)."""
        return [self.self_attn.out_proj.weight, self.ffn.linear2.weight]
