"""Gemma (``model_type`` "gemma", Gemma 1): Llama's block with three changes, all fields: an
RMSNorm whose gain is 1 + w (``norm`` "rmsnorm_1p", the weight starting at 0), a GeGLU
feed-forward with the tanh GELU (``ffn`` "gated", ``activation`` "gelu_tanh") and the token
vectors scaled by sqrt(d_model) (``scale_embedding``); tied embeddings and a ``head_dim`` given
apart from hidden_size / heads. Llama's tensor map, PEFT targets and end ids.

Its config.json is read by Llama's rules (``llama.read_config``) but for what Gemma reads its
own way: the activation (``hidden_activation``, else ``hidden_act``), the embeddings tied
unless the file says otherwise, and one ``attention_bias`` (q, k, v and o; the MLP has none)."""
from dataclasses import replace

from ..formats.json import short
from . import llama
from .llama import family

BLOCK = dict(norm="rmsnorm_1p", ffn="gated", activation="gelu_tanh", qkv_bias=False,
             proj_bias=False, scale_embedding=True)
# Hugging Face's defaults (GemmaConfig's: Gemma 7B's) of the fields a config.json may leave out
DEFAULTS = dict(num_key_value_heads=16, head_dim=256, max_position_embeddings=8192)
# config.json's names of the tanh GELU: transformers reads the first files' "gelu" as it too;
# a hidden_activation, where given, wins over hidden_act (transformers 4's rule)
TANH_GELU = ("gelu_pytorch_tanh", "gelu")
OWN_KEYS = ("hidden_act", "hidden_activation", "attention_bias", "use_bidirectional_attention")


def read_config(file, raw):
    """The GPTConfig of a Gemma config.json: its own keys (``OWN_KEYS``) checked here, the rest
    read by Llama's rules with Gemma's defaults."""
    key = "hidden_activation" if raw.get("hidden_activation") is not None else "hidden_act"
    activation = raw.get(key, TANH_GELU[0])
    if activation not in TANH_GELU:
        raise ValueError(f"{file}: {key}: expected 'gelu_pytorch_tanh' (the GeGLU of the "
                         f"Gemma family) or 'gelu' (read as it), got {short(activation)}")
    for name in ("attention_bias", "use_bidirectional_attention"):
        if raw.get(name) not in (None, False):
            raise ValueError(f"{file}: {name}: npformer builds Gemma's causal attention without "
                             f"biases; expected false, got {short(raw[name])}")
    rest = {k: v for k, v in raw.items() if k not in OWN_KEYS}
    rest.setdefault("tie_word_embeddings", True)
    return llama.read_config(file, rest, "gemma", DEFAULTS, BLOCK, read_biases=False)


FAMILY = replace(family("gemma", "Gemma", DEFAULTS, BLOCK), read_config=read_config)
