"""Llama (``model_type`` "llama": Llama 2 and 3, SmolLM, TinyLlama): npformer's GPT with
RMSNorm, SwiGLU, rotary positions and grouped-query attention, no biases. Qwen2 and Qwen3
(``qwen2.py``, ``qwen3.py``) read their config.json, their tensors and their end ids through
this module's rules.

Its separate q, k and v projections fill rows of the fused ``in_proj_weight``, its gate and up
projections rows of the SwiGLU's fused ``linear1``: ``BLOCK_TENSORS`` is the table."""
from ..configs import GPTConfig, check_rope_scaling
from ..formats.json import field_reader, read_json, short
from ..formats.tokenizer import load_tokenizer
from ..validation import check_flag, check_int, check_real
from .base import Family, producible_ends

BLOCK = dict(norm="rmsnorm", ffn="gated", activation="silu", qkv_bias=False, proj_bias=False)
# Hugging Face's defaults of the fields a config.json may leave out (a size it leaves out is
# refused: no model has the default size of its class)
DEFAULTS = dict(num_key_value_heads=None, head_dim=None, max_position_embeddings=2048,
                attention_bias=False, mlp_bias=False)
ROPE_THETA = 10000.0                   # Hugging Face's default_theta

# Each Hugging Face module of a block -> (the npformer parameter its weight goes to, less the
# "weight"/"bias" it ends with; the part of that parameter's rows it fills, None: all of them;
# stored transposed). A block's modules are model.layers.N.<module>, npformer's
# blocks.N.<parameter>.
BLOCK_TENSORS = {
    "self_attn.q_proj": ("self_attn.in_proj_", "q", False),
    "self_attn.k_proj": ("self_attn.in_proj_", "k", False),
    "self_attn.v_proj": ("self_attn.in_proj_", "v", False),
    "self_attn.o_proj": ("self_attn.out_proj.", None, False),
    "self_attn.q_norm": ("self_attn.q_norm.", None, False),        # qwen3
    "self_attn.k_norm": ("self_attn.k_norm.", None, False),        # qwen3
    "mlp.gate_proj": ("ffn.linear1.", "gate", False),
    "mlp.up_proj": ("ffn.linear1.", "up", False),
    "mlp.down_proj": ("ffn.linear2.", None, False),
    "input_layernorm": ("norm1.", None, False),
    "post_attention_layernorm": ("norm2.", None, False),
}
END_TENSORS = {
    "model.embed_tokens": ("tok_embed.", None, False),
    "model.norm": ("norm.", None, False),
    "lm_head": ("generator.", None, False),                        # untied only
}
PEFT_TARGETS = {name: (module,) for name, module in (
    ("q_proj", "self_attn.q_proj"), ("k_proj", "self_attn.k_proj"),
    ("v_proj", "self_attn.v_proj"), ("o_proj", "self_attn.o_proj"),
    ("gate_proj", "mlp.gate_proj"), ("up_proj", "mlp.up_proj"), ("down_proj", "mlp.down_proj"))}
SIZE_KEYS = {"d_model": "hidden_size", "d_ff": "intermediate_size",
             "n_layers": "num_hidden_layers", "max_len": "max_position_embeddings"}


def family(name, display, defaults, block, read_biases=True):
    """A family of the Llama kind: Llama's tensor map, PEFT targets and end ids; its own
    config.json defaults and block fields (``read_biases``: config.json's attention_bias and
    mlp_bias set the biases)."""
    return Family(
        name=name, display=display, block=block,
        read_config=lambda file, raw: read_config(file, raw, name, defaults, block,
                                                  read_biases),
        end_ids=end_ids, layer="model.layers.{}.", blocks=BLOCK_TENSORS, ends=END_TENSORS,
        # per-block buffers that older files store (the rotary frequencies)
        buffers=r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",
        peft_targets=PEFT_TARGETS, default_targets=("q_proj", "v_proj"),
        gated_targets=("gate_proj", "up_proj"),
        layers_key="num_hidden_layers", size_keys=SIZE_KEYS)


def read_config(file, raw, model_type, defaults, block, read_biases):
    """The GPTConfig of a Llama, Qwen2 or Qwen3 config.json (sizes checked under their Hugging
    Face names first, so that an error names the key of the file): ``defaults``, Hugging
    Face's for the keys the file may leave out; ``block``, the family's block fields, whose
    biases config.json's attention_bias and mlp_bias replace with ``read_biases``."""
    field = field_reader(file, raw)

    def optional(name, check, **bounds):
        """A key that may be missing or null: Hugging Face's default (None: none)."""
        value = raw.get(name, defaults.get(name))
        if value is None:
            return None
        try:
            return check(name, value, **bounds)
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from None

    hidden, heads = field("hidden_size", check_int), field("num_attention_heads", check_int)
    sizes = dict(vocab_size=field("vocab_size", check_int), d_model=hidden, n_heads=heads,
                 d_ff=field("intermediate_size", check_int),
                 n_layers=field("num_hidden_layers", check_int),
                 max_len=field("max_position_embeddings", check_int,
                               defaults["max_position_embeddings"]))
    kv = optional("num_key_value_heads", check_int) or heads
    head_dim = optional("head_dim", check_int)
    if head_dim is None and hidden % heads:
        raise ValueError(f"{file}: hidden_size: expected a multiple of num_attention_heads="
                         f"{heads} (config.json gives no head_dim), got {hidden}")
    if heads % kv:
        raise ValueError(f"{file}: num_key_value_heads: expected a divisor of "
                         f"num_attention_heads={heads} (each key/value head serves a group of "
                         f"query heads), got {kv}")
    size = head_dim or hidden // heads
    if size % 2:
        name = "head_dim" if head_dim else f"hidden_size / num_attention_heads ({hidden} / {heads})"
        raise ValueError(f"{file}: {name}: expected an even head size (rotary positions turn "
                         f"pairs of dimensions), got {size}")
    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        raise ValueError(f"{file}: hidden_act: expected 'silu' (the SwiGLU of the "
                         f"{model_type} family), got {short(activation)}")
    if optional("use_sliding_window", check_flag):
        raise ValueError(f"{file}: use_sliding_window: npformer's attention sees every earlier "
                         f"position; expected false, got true")
    layer_types = raw.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or
                                    any(t != "full_attention" for t in layer_types)):
        raise ValueError(f"{file}: layer_types: npformer's attention sees every earlier "
                         f"position; expected only 'full_attention', got {short(layer_types)}")
    biases = {}
    if read_biases:                            # attention_bias: q, k, v and o; mlp_bias: the MLP
        attention_bias = optional("attention_bias", check_flag)
        mlp_bias = bool(optional("mlp_bias", check_flag))
        if attention_bias != mlp_bias:
            raise ValueError(f"{file}: mlp_bias: npformer's GPT has one flag for the biases of "
                             f"o_proj and the MLP, so expected attention_bias's value "
                             f"{attention_bias}, got {mlp_bias}")
        biases = dict(qkv_bias=attention_bias, proj_bias=attention_bias)
    theta, scaling = rope(file, raw, sizes["max_len"])
    options = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, norm_first=True,
                   positions="rotary",
                   layer_norm_eps=field("rms_norm_eps", check_real, 1e-6, minimum=0,
                                        min_open=True),
                   tie_embeddings=field("tie_word_embeddings", check_flag, False),
                   n_kv_heads=kv, head_dim=head_dim, rope_theta=theta, rope_scaling=scaling)
    try:
        return GPTConfig(**sizes, **options, **{**block, **biases}, family=model_type)
    except ValueError as e:                   # none expected: every rule was checked above
        raise ValueError(f"{file}: {e}") from None


def rope(file, raw, max_len):
    """(rope_theta, rope_scaling for GPTConfig) of a config.json: Hugging Face's older keys
    (``rope_theta``, ``rope_scaling``) or transformers 5's ``rope_parameters`` (the theta
    inside), read as transformers reads them: a ``rope_scaling`` that is null or an empty
    object counts as absent, and ``rope_parameters`` is read instead; a ``rope_theta`` inside
    the object read wins over the top-level one. Rotary positions as they are ("default") or
    Llama 3's rescaling ("llama3"); anything else is refused, naming the key."""
    name = "rope_scaling" if raw.get("rope_scaling") not in (None, {}) else "rope_parameters"
    rope = raw.get(name)
    if rope is None:
        rope = {}
    if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
        raise ValueError(f"{file}: {name}: expected one object of rotary settings such as "
                         f"{{'rope_type': 'llama3', 'factor': 8.0, ...}}, got {short(rope)}")
    theta = rope.get("rope_theta", raw.get("rope_theta", ROPE_THETA))
    theta_name = f"{name}.rope_theta" if "rope_theta" in rope else "rope_theta"
    try:
        theta = check_real(theta_name, theta, minimum=0, min_open=True)
        for key, where in (("partial_rotary_factor", raw), ("partial_rotary_factor", rope)):
            if where.get(key, 1.0) != 1.0:
                raise ValueError(f"{key}: npformer turns every pair of a head; expected 1.0, "
                                 f"got {short(where[key])}")
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ValueError(f"{file}: {name}: rope_type: expected 'default' or 'llama3' (the "
                         f"rotary rescalings npformer builds), got {short(kind)}")
    try:                            # the configuration's own check, named as config.json's keys
        return theta, check_rope_scaling(
            {"original_max_position_embeddings": max_len, **rope}, name)
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None


def end_ids(folder, raw, vocab_size, warn):
    """The end-of-text ids of a Llama-family folder: ``generation_config.json``'s
    ``eos_token_id``, else config.json's, else ``tokenizer_config.json``'s ``eos_token`` looked
    up in ``tokenizer.json`` (an int, a tuple of ints, or None); an id the model cannot produce
    is left out (:func:`producible_ends`, which warns with ``warn``)."""
    sources = []
    generation = folder / "generation_config.json"
    if generation.is_file():
        data = read_json(generation)
        if not isinstance(data, dict):
            raise ValueError(f"{generation}: expected a JSON object, got {type(data).__name__}")
        sources.append((generation, data))
    sources.append((folder / "config.json", raw))
    for file, data in sources:
        value = data.get("eos_token_id")
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids:
            continue
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool) or i < 0:
                raise ValueError(f"{file}: eos_token_id: expected a token id (an int from 0) "
                                 f"or a list of them, got {short(value)}")
        return producible_ends(file, "eos_token_id", ids, vocab_size, warn)
    return tokenizer_config_eos(folder, vocab_size, warn)


def tokenizer_config_eos(folder, vocab_size, warn):
    """tokenizer_config.json's ``eos_token`` (a string, or {"content": string}) as its id in
    tokenizer.json (:func:`producible_ends`); None where either file or the entry is
    missing."""
    file = folder / "tokenizer_config.json"
    if not file.is_file() or not (folder / "tokenizer.json").is_file():
        return None
    data = read_json(file)
    token = data.get("eos_token") if isinstance(data, dict) else None
    if isinstance(token, dict):
        token = token.get("content")
    if token is None:
        return None
    if not isinstance(token, str):
        raise ValueError(f"{file}: eos_token: expected a token (a string), got {short(token)}")
    i = load_tokenizer(folder).token_to_id(token)
    if i is None:
        raise ValueError(f"{file}: eos_token: {short(token)} is not a token of "
                         f"{folder / 'tokenizer.json'}")
    return producible_ends(file, f"eos_token {short(token)}", [i], vocab_size, warn)


FAMILY = family("llama", "Llama", DEFAULTS, BLOCK)
