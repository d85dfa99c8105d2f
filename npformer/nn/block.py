"""The block of a decoder-only model, chosen by its configuration: a decoder is a list of these,
and a new variant (another norm, another feed-forward, grouped-query attention) is a field of
``GPTConfig`` plus its layer pair, not a class. The kinds of norm and feed-forward are declared
once, in :mod:`npformer.parts`: ``build_norm`` and ``build_ffn`` build the module a part names.

    block = Block(config, rotary, rng=rng, dtype=np.float32)    # GPT builds n_layers of them

Parameters, in ``named_parameters()`` order (each family's names for them in
``npformer.families``):

    self_attn.in_proj_weight ((H + 2 H_kv) d_h, D), self_attn.in_proj_bias   [qkv_bias]
                       (the query rows, then the key rows, then the value rows)
    self_attn.out_proj.weight (D, H d_h), self_attn.out_proj.bias (D,)          [proj_bias]
    self_attn.q_norm.weight (d_h,), self_attn.k_norm.weight (d_h,)             [qk_norm]
    ffn.linear1.weight (d_ff, D), ffn.linear1.bias (d_ff,)                      [proj_bias]
                       (gated: (2 d_ff, D), the gate's rows then the up projection's)
    ffn.linear2.weight (D, d_ff), ffn.linear2.bias (D,)                         [proj_bias]
    norm1.weight (D,), norm1.bias (D,), norm2.weight (D,), norm2.bias (D,)   [RMSNorm: no bias]
    post_norm1.weight (D,), post_norm2.weight (D,), (biases)                    [post_norms]
"""
import importlib

from ..parts import FFNS, NORMS
from .attention import MultiHeadAttention
from .dropout import Dropout
from .encoder import SelfAttentionBlock


def build(part, *args, **kwargs):
    """The module ``part`` names (``npformer.parts``: "file.Class" inside ``npformer.nn``),
    built with ``args``, ``kwargs`` and the part's ``options``; it keeps its part as ``part``
    (its parameters' starting values)."""
    file, name = part.module.rsplit(".", 1)
    module = getattr(importlib.import_module(f"{__package__}.{file}"), name)(
        *args, **kwargs, **part.options)
    module.part = part
    return module


def build_norm(config, dtype):
    """The norm ``config.norm`` names, over d_model features."""
    return build(NORMS[config.norm], config.d_model, config.layer_norm_eps, dtype=dtype)


def build_ffn(config, dropout, rng, dtype):
    """The feed-forward ``config.ffn`` names, applying ``config.activation``."""
    return build(FFNS[config.ffn], config.d_model, config.d_ff, dropout, config.activation,
                 bias=config.proj_bias, rng=rng, dtype=dtype)


def starting_values(norms):
    """{id(parameter): value} of the ``norms``' parameters that start at a fixed value (their
    part's ``start``: a gain at 1, a shift at 0)."""
    return {id(getattr(norm, name)): value for norm in norms
            for name, value in norm.part.start.items()}


class Block(SelfAttentionBlock):
    """Causal self-attention then feed-forward, each in a residual connection (pre-norm when
    ``config.norm_first``), its parts chosen by ``config`` (a ``GPTConfig``). ``rotary``: the
    attention's (cos, sin) tables, or None. ``layer``: the block's number in the stack (from 0),
    which chooses its sliding window (``config.layer_window``). Shape: x (B, T, D) -> (B, T, D)."""

    def __init__(self, config, rotary=None, *, rng, dtype, layer=0):
        super().__init__()
        self.norm_first = config.norm_first
        width = config.n_heads * config.head_size
        self.self_attn = MultiHeadAttention(
            config.d_model, config.n_heads, config.attention_dropout, qk_dim=width, rotary=rotary,
            v_dim=width, bias=config.qkv_bias, out_bias=config.proj_bias,
            n_kv_heads=config.n_kv_heads, qk_norm=config.qk_norm, norm_eps=config.layer_norm_eps,
            scale=config.attention_scale, softcap=config.attention_softcap,
            window=config.layer_window(layer), rng=rng, dtype=dtype)
        self.ffn = build_ffn(config, config.activation_dropout, rng, dtype)
        self.norm1 = build_norm(config, dtype)
        self.norm2 = build_norm(config, dtype)
        if config.post_norms:                 # each sub-layer's output normed before its add
            self.post_norm1 = build_norm(config, dtype)
            self.post_norm2 = build_norm(config, dtype)
        self.dropout1 = Dropout(config.dropout, rng=rng)
        self.dropout2 = Dropout(config.dropout, rng=rng)

    def norms(self):
        """The block's norms (their parts give their parameters' starting values)."""
        return [norm for norm in (self.norm1, self.norm2, self.post_norm1, self.post_norm2)
                if norm is not None]

    def residual_projections(self):
        """The two matrices that end a residual branch (GPT-2 scales their initial weights by
        1 / sqrt(2 n_layers), so the residual stream's variance does not grow with depth)."""
        return [self.self_attn.out_proj.weight, self.ffn.linear2.weight]
