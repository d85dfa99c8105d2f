"""Qwen2 (``model_type`` "qwen2", Qwen2 and Qwen2.5): Llama's block whose query, key and value
projections add a bias (o_proj and the MLP none, whatever config.json says); Llama's tensor map
and end ids."""
from .llama import BLOCK, family

DEFAULTS = dict(num_key_value_heads=32, head_dim=None, max_position_embeddings=32768)
FAMILY = family("qwen2", "Qwen2", DEFAULTS, {**BLOCK, "qkv_bias": True}, read_biases=False)
