"""npformer.kernels: the Numba backend (``npformer.set_backend("numba")``, the default).

Every name of :mod:`npformer.functional`, with the same signatures, so the modules can call
either. Compiled, fused kernels replace the functions where they pay (attention, LayerNorm,
cross-entropy, embedding scatter-add, dropout and the residual sum with it, the feed-forward
block's activation + dropout, RMSNorm, SwiGLU, rotary positions, the decoding cache's row
movers), and some
names have no reference of the same name (``EXTRAS``: the Adam update, ``matmul``,
``add_layernorm_forward`` and ``linear_relu_forward``, eval mode's fused post-norm residual
and feed-forward activation, which the modules use only where the backend offers them,
``reads_grouped_kv``, which tells the attention module that the kernels read grouped
key/value heads without repeating them; a backend without it repeats them, and
``top_log_softmax_bounded``, decoding's fast path with error bounds; a backend without it
decodes on the exact path; and ``attention_step``, a cached decoding step's attention in one
pass per row, which the attention module uses where the backend has it). Every
other name falls back to the reference's own function (``__getattr__`` below): the masks, the
head reshapes, learned positions (an addition and a sum over the batch). Every matrix product
goes through ``matmul``, which computes each product shape by the variant ``npformer.runtime``'s
dispatch table fixes for it. Caches of a kernel forward only fit the same kernel's backward.

Importing this package is the engine's first use: it applies ``npformer.runtime`` (its thread
policy and dispatch table; ``NPFORMER_RUNTIME=off`` opts out).
"""
from npformer import functional as _reference
from npformer import runtime

from .activation_dropout import activation_dropout_backward, activation_dropout_forward
from .adam import adam_step
from .bounded_top import top_log_softmax_bounded
from .attention import (attention_backward, attention_backward_into, attention_forward,
                        reads_grouped_kv)
from .attention_step import attention_step
from .dropout import (dropout_add_backward, dropout_add_forward, dropout_backward,
                      dropout_forward)
from .embedding import (embedding_backward, embedding_backward_into, embedding_forward,
                        sinusoidal_positions)
from .kv_cache import move_rows, take_rows
from .layernorm import add_layernorm_forward, layernorm_backward, layernorm_forward
from .linear import (linear_backward, linear_backward_accumulate, linear_forward,
                     linear_input_backward, linear_relu_forward)
from .lora import adapter_backward, adapter_forward
from .loss import cross_entropy_backward, cross_entropy_forward, log_softmax, top_log_softmax
from .matmul import matmul
from .rmsnorm import rmsnorm_backward, rmsnorm_forward
from .rotary import rotary_backward, rotary_forward, rotary_tables
from .swiglu import swiglu_backward, swiglu_forward

runtime.ensure()

# Kernels with no function of the same name in the functional core: their references are
# NumPy's ``@`` (``matmul``), ``npformer.optim.adam`` (``adam_step``) and ``grad +=
# embedding_backward(...)`` (``embedding_backward_into``); and one question the reference never
# needs asking (``reads_grouped_kv``: it always takes repeated heads); two fusions of eval mode
# whose references are two calls each (``add_layernorm_forward``: ``dropout_add_forward`` then
# ``layernorm_forward``; ``linear_relu_forward``: ``linear_forward`` then
# ``activation_dropout_forward`` with ReLU); and the fast path of
# ``top_log_softmax`` (``top_log_softmax_bounded``: its results carry error bounds, so the
# searches use it only where the backend offers it); and ``attention_step``, whose reference
# is ``attention_forward(...)[0]`` in evaluation.
EXTRAS = ("adam_step", "add_layernorm_forward", "attention_step", "embedding_backward_into",
          "linear_relu_forward", "matmul", "reads_grouped_kv", "top_log_softmax_bounded")

__all__ = sorted(set(_reference.__all__) | set(EXTRAS))


def __getattr__(name):
    """The backend contract: every name of the functional core that no kernel above overrides is
    the reference's own function (the masks, the head reshapes, softmax, ...). So a new layer
    pair added to ``npformer.functional`` (and its ``__all__``) works on this backend at once;
    a Numba twin imported above is an optimisation. Python calls this only for a name the module
    itself lacks (PEP 562)."""
    if name in _reference.__all__:
        return getattr(_reference, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_reference.__all__))
