"""Gemma 2 (``model_type`` "gemma2"): Gemma's block (``gemma.py``: the 1 + w RMSNorm, GeGLU with
the tanh GELU, the token vectors scaled by sqrt(d_model), tied) with four changes, all fields:

- a norm after each sub-layer too, before its residual add (``post_norms``);
- the attention scores scaled by query_pre_attn_scalar ** -0.5 (``attention_scale``) and
  soft-capped (``attention_softcap``), the final logits soft-capped (``logit_softcap``);
- sliding-window attention on every other layer, from the first (``sliding_window``,
  ``sliding_window_pattern`` 2; config.json's ``layer_types``).

Its config.json is read by Gemma's rules but for those keys. Llama's tensor map, but for the
norms: Gemma 2's ``post_attention_layernorm`` is the attention's post-norm (Llama's is the
feed-forward's pre-norm), ``pre_feedforward_layernorm`` the feed-forward's pre-norm."""
from dataclasses import replace

from ..formats.json import field_reader, short
from ..validation import check_int, check_real
from . import gemma
from .llama import BLOCK_TENSORS

# the block ``npformer lm --arch gemma2`` trains: Gemma 2's caps (its windows of thousands of
# positions are longer than any of the recipe's contexts, so the recipe leaves them out)
BLOCK = dict(gemma.BLOCK, post_norms=True, attention_softcap=50.0, logit_softcap=30.0)
# Hugging Face's defaults (Gemma2Config's: Gemma 2 2B's) of the keys a config.json may leave out
DEFAULTS = dict(num_key_value_heads=4, head_dim=256, max_position_embeddings=8192,
                query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                final_logit_softcapping=30.0, sliding_window=4096)
OWN_KEYS = ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
            "sliding_window", "layer_types")
BLOCK_NORMS = {"input_layernorm": ("norm1.", None, False),
               "post_attention_layernorm": ("post_norm1.", None, False),
               "pre_feedforward_layernorm": ("norm2.", None, False),
               "post_feedforward_layernorm": ("post_norm2.", None, False)}
LAYER_KINDS = ("sliding_attention", "full_attention")


def read_config(file, raw):
    """The GPTConfig of a Gemma 2 config.json: its own keys (``OWN_KEYS``) read here, the rest
    by Gemma's rules with Gemma 2's defaults."""
    field = field_reader(file, raw)

    def optional(name, check, **bounds):
        """A key that may be null (Hugging Face's None: no cap, no window)."""
        value = raw.get(name, DEFAULTS[name])
        return None if value is None else field(name, check, DEFAULTS[name], **bounds)

    scalar = field("query_pre_attn_scalar", check_real, DEFAULTS["query_pre_attn_scalar"],
                   minimum=0, min_open=True)
    caps = {ours: optional(theirs, check_real, minimum=0, min_open=True) for ours, theirs in
            (("attention_softcap", "attn_logit_softcapping"),
             ("logit_softcap", "final_logit_softcapping"))}
    window = optional("sliding_window", check_int)
    rest = {key: value for key, value in raw.items() if key not in OWN_KEYS}
    for key in ("num_key_value_heads", "head_dim", "max_position_embeddings"):
        rest.setdefault(key, DEFAULTS[key])
    config = gemma.read_config(file, rest)
    pattern = window_pattern(file, raw.get("layer_types"), config.n_layers)
    if pattern == "none":
        window = pattern = None
    try:
        return config.replace(family="gemma2", post_norms=True, attention_scale=scalar ** -0.5,
                              sliding_window=window,
                              sliding_window_pattern=pattern if window else None, **caps)
    except ValueError as e:                   # none expected: every key was checked above
        raise ValueError(f"{file}: {e}") from None


def window_pattern(file, layer_types, n_layers):
    """``sliding_window_pattern`` of config.json's ``layer_types`` (None: Hugging Face's
    default, every other layer sliding from the first): 2 for that alternation, p where every
    p-th layer attends fully, None where every layer slides, "none" where none does. Another
    list is refused, naming the key."""
    if layer_types is None:
        return 2
    expected = (f"a list of {n_layers} of {' and '.join(map(repr, LAYER_KINDS))}, the full "
                f"ones every p-th layer (Gemma 2's p = 2)")
    if not isinstance(layer_types, list) or len(layer_types) != n_layers or \
            any(kind not in LAYER_KINDS for kind in layer_types):
        raise ValueError(f"{file}: layer_types: expected {expected}, got {short(layer_types)}")
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    if not full:
        return None
    if len(full) == n_layers:
        return "none"
    p = full[0] + 1
    if p >= 2 and full == list(range(p - 1, n_layers, p)):
        return p
    raise ValueError(f"{file}: layer_types: expected {expected}, got {short(layer_types)}")


FAMILY = replace(gemma.FAMILY, name="gemma2", display="Gemma 2", block=BLOCK,
                 read_config=read_config,
                 blocks={**{k: v for k, v in BLOCK_TENSORS.items() if k not in BLOCK_NORMS},
                         **BLOCK_NORMS})
