"""GPT-2 (``model_type`` "gpt2"): LayerNorm, a GELU MLP four times as wide, learned positions,
biases everywhere, the embedding tied to the output.

Its linear layers are ``Conv1D`` modules, which store their weight as (in, out), the transpose
of a Linear's (out, in): the map marks them transposed. The fused ``c_attn`` (D, 3D) holds the
query, key and value columns in that order, as npformer's fused ``in_proj_weight`` (3D, D)
holds their rows."""
import warnings

from ..configs import GPTConfig
from ..formats.json import field_reader, short
from ..validation import check_flag, check_int, check_real
from .base import Family, producible_ends

# Hugging Face's activation names -> npformer's
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
               "relu": "relu"}
BLOCK = {}                      # GPTConfig's defaults are GPT-2's block


def read_config(file, raw):
    """The ``GPTConfig`` of a GPT-2 config.json; ValueError naming the file and the key."""
    field = field_reader(file, raw)

    def rate(name):
        return field(name, check_real, 0.1, minimum=0, maximum=1, max_open=True)

    activation = raw.get("activation_function", "gelu_new")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"{file}: activation_function: expected one of {sorted(ACTIVATIONS)}, "
                         f"got {short(activation)}")
    for name, supported in (("add_cross_attention", False), ("scale_attn_weights", True),
                            ("scale_attn_by_inverse_layer_idx", False)):
        if raw.get(name, supported) != supported:
            raise ValueError(f"{file}: {name}: npformer's GPT supports only {supported}, got "
                             f"{short(raw[name])}")
    resid, embd = rate("resid_pdrop"), rate("embd_pdrop")
    if resid != embd:
        warnings.warn(f"{file}: embd_pdrop {embd} differs from resid_pdrop {resid}; npformer's "
                      f"GPT has one rate for both and uses {resid} (only training sees it)")
    # every field is read (its error naming the file once) before the configuration is made
    d_model = field("n_embd", check_int)
    n_inner = raw.get("n_inner")
    sizes = dict(vocab_size=field("vocab_size", check_int), d_model=d_model,
                 n_heads=field("n_head", check_int),
                 d_ff=4 * d_model if n_inner is None else field("n_inner", check_int),
                 n_layers=field("n_layer", check_int), max_len=field("n_positions", check_int))
    options = dict(dropout=resid, attention_dropout=rate("attn_pdrop"),
                   layer_norm_eps=field("layer_norm_epsilon", check_real, 1e-5, minimum=0,
                                        min_open=True),
                   tie_embeddings=field("tie_word_embeddings", check_flag, True))
    if raw.get("eos_token_id") is not None:
        field("eos_token_id", check_int, minimum=0)
    try:
        return GPTConfig(**sizes, **options, **BLOCK, activation_dropout=0.0, norm_first=True,
                         activation=ACTIVATIONS[activation], positions="learned", family="gpt2")
    except ValueError as e:                   # a rule between fields (d_model and n_heads)
        raise ValueError(f"{file}: {e}") from None


def end_ids(folder, raw, vocab_size, warn=True):
    """config.json's ``eos_token_id`` (one id; checked by :func:`read_config`), or None."""
    eos = raw.get("eos_token_id")
    if eos is None:
        return None
    return producible_ends(folder / "config.json", "eos_token_id", [eos], vocab_size, warn)


FAMILY = Family(
    name="gpt2", display="GPT-2", block=BLOCK, read_config=read_config, end_ids=end_ids,
    layer="h.{}.",
    blocks={"ln_1": ("norm1.", None, False),
            "attn.c_attn": ("self_attn.in_proj_", None, True),
            "attn.c_proj": ("self_attn.out_proj.", None, True),
            "ln_2": ("norm2.", None, False),
            "mlp.c_fc": ("ffn.linear1.", None, True),
            "mlp.c_proj": ("ffn.linear2.", None, True)},
    ends={"wte": ("tok_embed.", None, False), "wpe": ("pos_embed.", None, False),
          "ln_f": ("norm.", None, False), "lm_head": ("generator.", None, False)},
    # per-block buffers that older files store (the causal mask and its fill value)
    buffers=r"h\.\d+\.attn\.(bias|masked_bias)", prefix="transformer.",
    peft_targets={"c_attn": ("attn.c_attn",), "c_proj": ("attn.c_proj", "mlp.c_proj"),
                  "c_fc": ("mlp.c_fc",)},
    default_targets=("c_attn",),
    layers_key="n_layer",
    size_keys={"d_model": "n_embd", "n_layers": "n_layer", "max_len": "n_positions",
               "d_ff": "n_inner"})
