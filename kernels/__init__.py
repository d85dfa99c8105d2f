"""npformer.kernels: the Numba backend (``npformer.set_backend("numba")``, the default).

The same names and signatures as :mod:`npformer.functional`, so the modules can call either.
Compiled, fused kernels replace the functions where they pay (attention, LayerNorm,
cross-entropy, embedding scatter-add, dropout and the residual sum with it, the feed-forward
block's activation + dropout,
the Adam update, rotary positions); learned positions (an addition and a sum over the batch) are the reference's;
every matrix product goes through ``matmul``, which computes each product shape by the variant
``npformer.runtime``'s dispatch table fixes for it; the masks and head reshapes are the reference functions themselves.
Caches of a kernel forward only fit the same kernel's backward.

Importing this package is the engine's first use: it applies ``npformer.runtime`` (its thread
policy and dispatch table; ``NPFORMER_RUNTIME=off`` opts out).
"""
from npformer.functional import (ACTIVATIONS, causal_mask, decoder_self_mask, gelu_backward,
                                 gelu_forward, gelu_tanh_backward, gelu_tanh_forward, merge_heads,
                                 padding_mask, position_embedding_backward,
                                 position_embedding_forward, relu_backward, relu_forward,
                                 softmax_backward, softmax_forward, split_heads)

from npformer import runtime

from .activation_dropout import activation_dropout_backward, activation_dropout_forward
from .adam import adam_step
from .attention import (attention_backward, attention_backward_into, attention_forward,
                        move_rows, take_rows)
from .dropout import (dropout_add_backward, dropout_add_forward, dropout_backward,
                      dropout_forward)
from .embedding import embedding_backward, embedding_forward, sinusoidal_positions
from .layernorm import layernorm_backward, layernorm_forward
from .linear import linear_backward, linear_backward_accumulate, linear_forward
from .loss import cross_entropy_backward, cross_entropy_forward, log_softmax, top_log_softmax
from .matmul import matmul
from .rotary import rotary_backward, rotary_forward, rotary_tables

runtime.ensure()

__all__ = [
    "ACTIVATIONS", "activation_dropout_backward", "activation_dropout_forward",
    "adam_step", "attention_backward", "attention_backward_into",
    "attention_forward", "causal_mask",
    "cross_entropy_backward", "cross_entropy_forward", "decoder_self_mask", "dropout_add_backward",
    "dropout_add_forward", "dropout_backward", "dropout_forward", "embedding_backward",
    "embedding_forward", "gelu_backward", "gelu_forward",
    "gelu_tanh_backward", "gelu_tanh_forward", "layernorm_backward", "layernorm_forward",
    "linear_backward", "linear_backward_accumulate",
    "linear_forward", "log_softmax", "matmul",
    "merge_heads", "move_rows", "padding_mask", "position_embedding_backward",
    "position_embedding_forward",
    "relu_backward", "relu_forward", "rotary_backward", "rotary_forward", "rotary_tables",
    "sinusoidal_positions",
    "softmax_backward", "softmax_forward", "split_heads", "take_rows", "top_log_softmax",
]
