"""Model configurations: one frozen dataclass per architecture, validated in one place.

A configuration is what a model is built from and what a checkpoint stores about it::

    config = nf.TransformerConfig(src_vocab_size=8000, tgt_vocab_size=8000, d_model=256)
    model = nf.build_model(config)               # the registry (npformer.registry) picks the class
    config.to_dict()                              # {"arch": "transformer", "src_vocab_size": 8000, ...}
    TransformerConfig.from_dict(stored)           # fields a stored dict lacks take their defaults

Every value is checked when the configuration is made (``ValueError`` naming the field, what was
expected and what came), so a model, a checkpoint loader or a CLI never builds from a bad one.
Sizes arrive as Python ints (NumPy integers are accepted and converted), ``dtype`` as its name.
"""
import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

from .functional.activation_dropout import check_activation
from .functional.dropout import inner_dropout_rates
from .validation import check_flag, check_int, check_real


class ModelConfig:
    """What every architecture's configuration offers: ``arch``, ``to_dict``, ``from_dict``,
    ``replace``. Subclasses are frozen dataclasses that validate in ``__post_init__``."""

    arch: ClassVar[str] = None

    def to_dict(self):
        """{"arch": ..., field: value, ...}: plain JSON values, as a checkpoint stores them."""
        return {"arch": self.arch, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data):
        """The configuration stored as ``data`` (from :meth:`to_dict`). An "arch" entry, if
        present, must be this class's; a field ``data`` lacks takes its default; an unknown one
        is refused."""
        if not isinstance(data, dict):
            raise ValueError(f"config: expected a dict of fields, got {type(data).__name__}")
        data = dict(data)
        arch = data.pop("arch", cls.arch)
        if arch != cls.arch:
            raise ValueError(f"arch: expected {cls.arch!r} for {cls.__name__}, got {arch!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"{unknown[0]}: not a field of the {cls.arch!r} configuration "
                             f"(its fields: {', '.join(fields)})")
        missing = [name for name, f in fields.items() if name not in data
                   and f.default is dataclasses.MISSING]
        if missing:
            raise ValueError(f"{missing[0]}: required by the {cls.arch!r} configuration, missing")
        return cls(**data)

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def parameter_shapes(self):
        """``{name: shape}`` of a model's parameters, without building it (each architecture)."""
        raise NotImplementedError

    def layer_count(self):
        """How many layers the configuration asks for (each with parameters of its own): a
        checkpoint loader refuses a count beyond its stored arrays before listing them."""
        raise NotImplementedError

    def vocab_sizes(self):
        """``{side: size}`` of the vocabularies the model reads and writes ("src"/"tgt"), checked
        against a ``Vocabularies`` value before the two are used together; {} for a model that
        reads no tokens."""
        raise NotImplementedError

    def derived_arrays(self):
        """``{name: (bytes, why)}`` of the arrays a model computes from its configuration alone
        (stored in no checkpoint): a loader bounds them by the file's size before building."""
        return {}


def _check_dtype(dtype):
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype: expected float32 or float64, got {dtype!r}") from None
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
    return dtype.name


@dataclass(frozen=True)
class TransformerConfig(ModelConfig):
    """The encoder-decoder of "Attention Is All You Need" (:class:`npformer.Transformer`).

    ``qk_dim``: query/key width when it differs from ``d_model``; ``tie_embeddings``: the
    generator shares the target embedding matrix; ``share_all_embeddings``: the source embedding,
    the target embedding and the generator share one matrix (fairseq's option, for one joint
    vocabulary: the two sizes must be equal; it implies ``tie_embeddings``); ``seed`` draws the
    initial weights and then every dropout mask.

    Dropout: ``dropout`` on the residual paths (each sublayer's output) and on the embeddings;
    ``attention_dropout`` on the attention weights; ``activation_dropout`` after the feed-forward
    activation. Left out (None), the last two take ``dropout``'s value, as in
    torch.nn.Transformer, which has one rate for all three; fairseq sets them apart (its
    defaults are 0). The value is resolved when the configuration is made, so ``replace`` with a
    new ``dropout`` keeps the other two as they were."""
    arch: ClassVar[str] = "transformer"

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: Optional[float] = None
    activation_dropout: Optional[float] = None
    max_len: int = 256
    pad_id: int = 0
    norm_first: bool = False
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    qk_dim: Optional[int] = None
    tie_embeddings: bool = False
    share_all_embeddings: bool = False
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff",
                     "n_encoder_layers", "n_decoder_layers", "max_len"):
            put(name, check_int(name, getattr(self, name)))
        if self.qk_dim is not None:
            put("qk_dim", check_int("qk_dim", self.qk_dim))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model: expected a multiple of n_heads={self.n_heads}, "
                             f"got {self.d_model}")
        if self.qk_dim is not None and self.qk_dim % self.n_heads:
            raise ValueError(f"n_heads: expected a divisor of d_model={self.d_model} and "
                             f"qk_dim={self.qk_dim}, got {self.n_heads}")
        n_ids = min(self.src_vocab_size, self.tgt_vocab_size)
        put("pad_id", check_int("pad_id", self.pad_id, minimum=0))
        if self.pad_id >= n_ids:
            raise ValueError(f"pad_id: expected an id in [0, {n_ids}), got {self.pad_id!r}")
        put("dropout", check_real("dropout", self.dropout, minimum=0, maximum=1, max_open=True))
        rates = inner_dropout_rates(self.dropout, self.attention_dropout, self.activation_dropout)
        for name, value in zip(("attention_dropout", "activation_dropout"), rates):
            put(name, check_real(name, value, minimum=0, maximum=1, max_open=True))
        put("layer_norm_eps", check_real("layer_norm_eps", self.layer_norm_eps, minimum=0,
                                         min_open=True))
        if not isinstance(self.activation, str):
            raise ValueError(f"activation: expected a str such as 'relu', got {self.activation!r}")
        check_activation(self.activation)
        put("norm_first", check_flag("norm_first", self.norm_first))
        put("tie_embeddings", check_flag("tie_embeddings", self.tie_embeddings))
        put("share_all_embeddings", check_flag("share_all_embeddings", self.share_all_embeddings))
        if self.share_all_embeddings:
            if self.src_vocab_size != self.tgt_vocab_size:
                raise ValueError(f"share_all_embeddings: needs one joint vocabulary, but "
                                 f"src_vocab_size={self.src_vocab_size} differs from "
                                 f"tgt_vocab_size={self.tgt_vocab_size}")
            put("tie_embeddings", True)                # the generator shares it too
        put("dtype", _check_dtype(self.dtype))
        put("seed", check_int("seed", self.seed, minimum=0))

    def parameter_shapes(self):
        """``{name: shape}`` of the parameters a model of this configuration has, in the order of
        its ``named_parameters()``, computed without allocating anything (a checkpoint loader
        compares them with the stored arrays before building a model, so a configuration that
        claims huge sizes is refused instead of exhausting memory)."""
        d, ff, qk = self.d_model, self.d_ff, self.qk_dim or self.d_model

        def linear(prefix, n_in, n_out):
            return {f"{prefix}.weight": (n_out, n_in), f"{prefix}.bias": (n_out,)}

        def attention(prefix):
            return {f"{prefix}.in_proj_weight": (2 * qk + d, d),
                    f"{prefix}.in_proj_bias": (2 * qk + d,), **linear(f"{prefix}.out_proj", d, d)}

        def norm(prefix):
            return {f"{prefix}.weight": (d,), f"{prefix}.bias": (d,)}

        def ffn(prefix):
            return {**linear(f"{prefix}.linear1", d, ff), **linear(f"{prefix}.linear2", ff, d)}

        shapes = {"src_embed.weight": (self.src_vocab_size, d),
                  "tgt_embed.weight": (self.tgt_vocab_size, d)}
        for i in range(self.n_encoder_layers):
            layer = f"encoder.layers.{i}"
            shapes.update({**attention(f"{layer}.self_attn"), **ffn(f"{layer}.ffn"),
                           **norm(f"{layer}.norm1"), **norm(f"{layer}.norm2")})
        shapes.update(norm("encoder.norm"))
        for i in range(self.n_decoder_layers):
            layer = f"decoder.layers.{i}"
            shapes.update({**attention(f"{layer}.self_attn"),
                           **attention(f"{layer}.multihead_attn"), **ffn(f"{layer}.ffn"),
                           **norm(f"{layer}.norm1"), **norm(f"{layer}.norm2"),
                           **norm(f"{layer}.norm3")})
        shapes.update(norm("decoder.norm"))
        shapes.update(linear("generator", d, self.tgt_vocab_size))
        if self.tie_embeddings:
            del shapes["generator.weight"]          # the same Parameter as tgt_embed.weight
        if self.share_all_embeddings:
            del shapes["tgt_embed.weight"]          # ... and as src_embed.weight
        return shapes

    def layer_count(self):
        return self.n_encoder_layers + self.n_decoder_layers

    def vocab_sizes(self):
        """The size of each vocabulary the model reads or writes (``Vocabularies.check_fits``)."""
        return {"src": self.src_vocab_size, "tgt": self.tgt_vocab_size}

    def derived_arrays(self):
        itemsize = np.dtype(self.dtype).itemsize
        return {"position table": (self.max_len * self.d_model * itemsize,
                                   f"max_len={self.max_len} needs a "
                                   f"{self.max_len * self.d_model * itemsize}-byte position table "
                                   f"(max_len x d_model x {itemsize})")}
