"""The functional core: pure forward/backward pairs, caches passed explicitly.

Every layer follows the CS231n convention::

    out, cache = f_forward(x, params...)
    dx, dparams... = f_backward(dout, cache)

This is the NumPy reference path: written to be read next to docs/backprop.md. The modules in
``npformer.nn`` own the parameters and call these functions (or their Numba twins).
"""
from .activation_dropout import activation_dropout_backward, activation_dropout_forward
from .activations import (ACTIVATIONS, gelu_backward, gelu_forward, gelu_tanh_backward,
                          gelu_tanh_forward, relu_backward, relu_forward)
from .attention import (attention_backward, attention_backward_into, attention_forward,
                        flush_subnormal, merge_heads, split_heads)
from .dropout import (dropout_add_backward, dropout_add_forward, dropout_backward,
                      dropout_forward)
from .embedding import (embedding_backward, embedding_forward, position_embedding_backward,
                        position_embedding_forward, position_rows, sinusoidal_positions)
from .kv_cache import move_rows, take_rows
from .layernorm import layernorm_backward, layernorm_forward
from .linear import linear_backward, linear_backward_accumulate, linear_forward
from .lora import (adapter_backward, adapter_forward, linear_input_backward, lora_backward,
                   lora_forward)
from .loss import cross_entropy_backward, cross_entropy_forward, log_softmax, top_log_softmax
from .masks import causal_mask, decoder_self_mask, padding_mask
from .rmsnorm import rmsnorm_backward, rmsnorm_forward
from .rotary import rotary_backward, rotary_forward, rotary_frequencies, rotary_tables
from .softcap import softcap_backward, softcap_forward
from .softmax import softmax_backward, softmax_forward
from .swiglu import (GATED_ACTIVATIONS, gated_backward, gated_forward, silu_backward, silu_forward,
                     swiglu_backward, swiglu_forward)

__all__ = [
    "ACTIVATIONS", "activation_dropout_backward", "activation_dropout_forward",
    "attention_backward", "attention_backward_into", "attention_forward", "causal_mask",
    "cross_entropy_backward", "cross_entropy_forward", "decoder_self_mask", "dropout_add_backward",
    "dropout_add_forward", "dropout_backward", "dropout_forward", "embedding_backward",
    "embedding_forward", "flush_subnormal", "GATED_ACTIVATIONS", "gated_backward",
    "gated_forward", "gelu_backward", "gelu_forward",
    "gelu_tanh_backward", "gelu_tanh_forward", "layernorm_backward", "layernorm_forward",
    "adapter_backward", "adapter_forward", "linear_backward", "linear_backward_accumulate",
    "linear_forward", "linear_input_backward", "log_softmax", "lora_backward", "lora_forward",
    "merge_heads", "move_rows", "padding_mask", "position_embedding_backward",
    "position_embedding_forward", "position_rows",
    "relu_backward", "relu_forward", "rmsnorm_backward", "rmsnorm_forward",
    "rotary_backward", "rotary_forward", "rotary_frequencies", "rotary_tables",
    "silu_backward", "silu_forward", "sinusoidal_positions", "softcap_backward", "softcap_forward",
    "softmax_backward", "softmax_forward",
    "split_heads", "swiglu_backward", "swiglu_forward", "take_rows", "top_log_softmax",
]
