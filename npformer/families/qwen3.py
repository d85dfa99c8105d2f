"""Qwen3 (``model_type`` "qwen3"): Llama's block with an RMSNorm over each query and key head
(``qk_norm``: its ``q_norm`` and ``k_norm`` tensors); Llama's tensor map and end ids."""
from .llama import BLOCK, family

DEFAULTS = dict(num_key_value_heads=32, head_dim=128, max_position_embeddings=32768,
                attention_bias=False)
FAMILY = family("qwen3", "Qwen3", DEFAULTS, {**BLOCK, "qk_norm": True})
