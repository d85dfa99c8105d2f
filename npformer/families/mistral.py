"""Mistral (``model_type`` "mistral", MistralForCausalLM: Mistral 7B and its fine-tunes):
Llama's block (RMSNorm, SwiGLU, rotary positions, grouped-query attention, no biases) with
sliding-window attention on every layer: config.json's ``sliding_window`` becomes
``GPTConfig.sliding_window`` (null: full attention; absent: transformers' default, 4096).
Llama's tensor map, PEFT targets and end ids.

As transformers' MistralModel, every layer slides: a ``layer_types`` list is not read (the
Ministral classes read it; transformers warns and ignores it here)."""
import dataclasses

from ..validation import check_int
from . import llama

# Hugging Face's defaults of the keys a config.json may leave out (MistralConfig's)
DEFAULTS = dict(num_key_value_heads=8, head_dim=None, max_position_embeddings=4096 * 32)
SLIDING_WINDOW = 4096                     # MistralConfig's default
# the block ``npformer lm --arch mistral`` trains: Llama's, its attention sliding
BLOCK = {**llama.BLOCK, "sliding_window": SLIDING_WINDOW}


def read_config(file, raw):
    """The GPTConfig of a Mistral config.json: Llama's reading (no biases), then the window."""
    config = llama.read_config(file, {k: v for k, v in raw.items() if k != "layer_types"},
                               "mistral", DEFAULTS, llama.BLOCK, read_biases=False)
    window = raw.get("sliding_window", SLIDING_WINDOW)
    if window is None:
        return config
    try:
        return config.replace(sliding_window=check_int("sliding_window", window))
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None


FAMILY = dataclasses.replace(llama.family("mistral", "Mistral", DEFAULTS, BLOCK,
                                          read_biases=False), read_config=read_config)
