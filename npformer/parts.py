"""The parts a decoder is made of, each kind declared once: what ``GPTConfig.norm``,
``GPTConfig.ffn`` and ``GPTConfig.positions`` may name, and everything that follows from the name.

    part = NORMS[config.norm]       # Part(name="rmsnorm", module="rmsnorm.RMSNorm", ...)
    part.start                      # {"weight": 1.0}: the starting value of each fixed parameter
    FFNS[config.ffn].gated          # True: linear1 holds the gate's rows, then the up rows

A part names the module that builds it (``module``, "file.Class" inside ``npformer.nn``, which
``npformer.nn.block`` builds with the configuration's sizes and the part's ``options``), the
starting values of its parameters that are not drawn (``start``: a norm's gain and shift), the
names of its parameters (``params``), whether it is gated, which activations it can apply, and
for positions what they do (a table added, the token vectors scaled, the attention turning).
Nothing else compares a configuration's field with a kind's name: the configuration checks its
fields against these tables, the model builds from them, its initialisation reads ``start``,
``parameter_count`` counts the modules they build, LoRA asks ``gated``.

A new kind is an entry here (a new module where no existing one fits): Gemma's norm with a gain
of 1 + w is an entry whose ``options`` ask the RMSNorm for that gain and whose ``start`` has the
weight at 0. A new gated activation is a pair in ``functional.swiglu.GATED_ACTIVATIONS``.

This module imports nothing of npformer's but the activation tables: a configuration (below the
modules) can read it, and the modules read it to build.
"""
from dataclasses import dataclass, field
from typing import Optional

from .functional.activations import ACTIVATIONS
from .functional.swiglu import GATED_ACTIVATIONS


@dataclass(frozen=True)
class Part:
    """One kind of a decoder's part. ``module``: "file.Class" in ``npformer.nn`` (None: a part
    without parameters); ``params``: its parameters' names (a bias left out where the
    configuration asks for none); ``start``: the starting value of each parameter not drawn at
    random; ``gated``: a feed-forward whose first projection holds a gate's rows and an up
    projection's; ``activations``: the activations a feed-forward of this kind applies (empty
    for a part without one); ``options``: keyword arguments the module is built with besides
    the sizes. Positions: ``table``, a fixed table computed from the configuration is added to
    the token vectors; ``scales_embedding``, the token vectors are scaled by sqrt(d_model)
    first; ``rotates``, each attention turns its queries and keys by their positions (RoPE)."""
    name: str
    module: Optional[str]
    params: tuple
    start: dict = field(default_factory=dict)
    gated: bool = False
    activations: tuple = ()
    options: dict = field(default_factory=dict)
    table: bool = False
    scales_embedding: bool = False
    rotates: bool = False


NORMS = {part.name: part for part in (
    Part("layernorm", "layernorm.LayerNorm", ("weight", "bias"), {"weight": 1.0, "bias": 0.0}),
    Part("rmsnorm", "rmsnorm.RMSNorm", ("weight",), {"weight": 1.0}),   # Llama's: no shift
    # Gemma's: a gain of 1 + w, the weight starting at 0
    Part("rmsnorm_1p", "rmsnorm.RMSNorm", ("weight",), {"weight": 0.0},
         options={"gain_offset": 1.0}),
)}

FFN_PARAMS = ("linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias")
FFNS = {part.name: part for part in (
    # two matrices around the activation (GPT-2's, with the tanh GELU)
    Part("mlp", "feedforward.FeedForward", FFN_PARAMS, activations=tuple(ACTIVATIONS)),
    # act(x W_gate) * (x W_up), then W_down: SwiGLU (silu, Llama's), GeGLU (gelu), ReGLU (relu)
    Part("gated", "feedforward.GatedFeedForward", FFN_PARAMS, gated=True,
         activations=tuple(GATED_ACTIVATIONS)),
)}

POSITIONS = {part.name: part for part in (
    # one trained vector per position added to the token's (GPT-2's wpe)
    Part("learned", "embedding.PositionEmbedding", ("weight",)),
    # the fixed table of "Attention Is All You Need", the token vectors scaled by sqrt(d_model)
    Part("sinusoidal", None, (), table=True, scales_embedding=True),
    # nothing added: the attention turns queries and keys (GPT-NeoX's layout)
    Part("rotary", None, (), rotates=True),
)}

# ffn kinds that configurations recorded before ``activation`` applied to every feed-forward
# named: their meaning now, as fields (GPTConfig.from_dict migrates them)
RECORDED_FFNS = {"swiglu": {"ffn": "gated", "activation": "silu"}}


def choice(name, table, value):
    """``table[value]``, or a ValueError naming the field ``name``, the choices and ``value``."""
    if not isinstance(value, str) or value not in table:
        raise ValueError(f"{name}: expected one of {', '.join(table)}, got {value!r}")
    return table[value]


def is_gated(config):
    """Whether ``config``'s feed-forward is gated (False for a configuration without ``ffn``,
    as an encoder-decoder's)."""
    part = FFNS.get(getattr(config, "ffn", None))
    return part is not None and part.gated
