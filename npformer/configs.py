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
import math
import os
import re
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

from .functional.activation_dropout import check_activation
from .dropout_rates import inner_dropout_rates
from .parts import FFNS, NORMS, POSITIONS as POSITION_KINDS, RECORDED_FFNS, choice
from .validation import check_flag, check_int, check_real

try:
    import resource                          # POSIX only: the address-space limit (ulimit -v)
except ImportError:                          # pragma: no cover (Windows)
    resource = None


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

    # what a model of this architecture does: "seq2seq" (reads a source, writes a target) or
    # "causal_lm" (continues one stream); decoding, the CLI and the loaders ask this, never a
    # class or an arch name
    capability: ClassVar[str] = None
    # the model class (``npformer.registry.register_architecture`` sets it)
    model_class: ClassVar[type] = None
    # (old prefix, new prefix) of parameter names renamed since checkpoints were first written;
    # loaders rename stored weights through ``current_names``
    RENAMED: ClassVar[tuple] = ()

    def parameter_shapes(self, max_layers=None):
        """``{name: shape}`` of the parameters a model of this configuration has, in the order of
        its ``named_parameters()``, from the modules themselves built without allocating
        anything (``Module.shapes_of``), so a loader can compare a file's claims with them
        before building a model. ``max_layers``: refuse (ValueError) a configuration of more
        layers before listing any (a loader passes how many arrays it holds: every layer has
        parameters of its own)."""
        layers = self.layer_count()
        if max_layers is not None and layers > max_layers:
            raise ValueError(f"the configuration claims {layers} layers, more than the "
                             f"{max_layers} its parameters could fill")
        if self.model_class is None:
            raise NotImplementedError(f"{type(self).__name__} is not registered "
                                      f"(npformer.registry.register_architecture)")
        return self.model_class.shapes_of(self)

    @classmethod
    def current_names(cls, weights):
        """``weights`` ({name: array}) with names stored before a rename (``RENAMED``) given
        their current names; others unchanged, order kept."""
        renamed = {}
        for name, value in weights.items():
            for old, new in cls.RENAMED:
                if name.startswith(old):
                    name = new + name[len(old):]
                    break
            renamed[name] = value
        return renamed

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

    # the fields that set a model's size, named in a refusal (each architecture)
    SIZE_FIELDS: ClassVar[tuple] = ()

    def parameter_count(self):
        """How many numbers the model's parameters hold (a shared one counted once), in closed
        form where the architecture gives one (no loop over layers): what a size check may ask
        of any configuration, however many layers it claims."""
        return sum(math.prod(shape) for shape in self.parameter_shapes().values())

    def memory_estimate(self, training=False):
        """Bytes a model of this configuration holds, at least: its parameters (one flat
        buffer) and the arrays computed from the configuration; for ``training`` also their
        gradients and Adam's two moments. No activations: a lower bound, so that what it
        refuses could not have been built.

        A model that only samples holds no gradients: its gradient buffer is mapped but never
        written (``aligned.zeros_aligned``: the operating system's zero pages, which take
        memory only once a backward pass writes them), so it is not counted then. (It does
        take address space: under an address-space limit, ``ulimit -v``, a model may pass
        this check and still fail to allocate.)"""
        copies = 4 if training else 1
        derived = sum(size for size, _ in self.derived_arrays().values())
        itemsize = np.dtype(getattr(self, "dtype", "float32")).itemsize
        return copies * self.parameter_count() * itemsize + derived

    def check_memory(self, training=False, memory=None, names=None):
        """Refuse (ValueError) a model whose :meth:`memory_estimate` exceeds ``memory`` (default:
        :func:`available_memory`), before anything is allocated. The message names the size
        fields, by ``names`` ({field: what to call it}, e.g. a command's options) where given.
        An architecture that lists no parameter shapes is not checked."""
        memory = available_memory() if memory is None else memory
        try:
            need = self.memory_estimate(training)
        except NotImplementedError:
            return
        if not memory or need <= memory:
            return
        names = names or {}                # a field named None is left out of the message
        shown = [f for f in self.SIZE_FIELDS if getattr(self, f) is not None and names.get(f, f)]
        # a command's flag and its value ("--layers 6"), a file's key or a field ("n_layers=6")
        fields = " ".join(f"{names.get(f, f)}{' ' if names.get(f, f).startswith('-') else '='}"
                          f"{getattr(self, f)}" for f in shown)
        what = "its weights, gradients and Adam's two moments" if training else "its weights"
        derived = {name: size for name, (size, _) in self.derived_arrays().items() if size}
        if derived:                        # each part its size: the tables may be most of it
            parts = [f"its {name} ({_gib(size)} GiB)" for name, size in derived.items()]
            what = " and ".join([f"{what} ({_gib(need - sum(derived.values()))} GiB)"] + parts)
        dtype = getattr(self, "dtype", "float32")
        raise ValueError(f"{fields}: a model this size ({self.parameter_count():,} {dtype} "
                         f"parameters) needs at least {_gib(need)} GiB of memory for {what}, "
                         f"more than this machine's {_gib(memory)} GiB; choose smaller values")


def _gib(size):
    return f"{size / 2**30:,.0f}" if size >= 2**30 else f"{size / 2**30:,.2f}"


def physical_memory():
    """Bytes of memory of this machine, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def available_memory():
    """Bytes this process may hold at most, or None where nothing says: the machine's physical
    memory, less where the cgroup's ``memory.max`` (a container's limit) or the address-space
    limit (``ulimit -v``, RLIMIT_AS, less what the process already maps) sets less."""
    limits = [physical_memory()]
    try:
        text = open("/sys/fs/cgroup/memory.max").read().strip()
        limits.append(None if text == "max" else int(text))
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS) if resource else (None, None)
    if soft is not None and soft != resource.RLIM_INFINITY:
        try:                               # /proc/self/statm: the pages mapped now, first
            mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            mapped = 0
        limits.append(max(0, soft - mapped))
    limits = [size for size in limits if size]
    return min(limits) if limits else None


def _check_dtype(dtype):
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype: expected float32 or float64, got {dtype!r}") from None
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
    return dtype.name


def _put(config, name, value):
    object.__setattr__(config, name, value)          # (frozen dataclass: only while validating)


def _check_sizes(config, names, heads_split_d_model=True):
    """The positive integer sizes ``names``; d_model a multiple of n_heads (unless the heads
    have a size of their own: ``heads_split_d_model`` False)."""
    for name in names:
        _put(config, name, check_int(name, getattr(config, name)))
    if heads_split_d_model and config.d_model % config.n_heads:
        raise ValueError(f"d_model: expected a multiple of n_heads={config.n_heads}, "
                         f"got {config.d_model}")


def _check_layer_options(config, flags, activations=None):
    """What every architecture's layers share: the dropout rates (the inner two resolved from
    ``dropout``), the LayerNorm epsilon, the activation (``activations``: (names, why) where
    the architecture's feed-forward kind sets them; else ``ACTIVATIONS``), the boolean
    ``flags``, dtype and seed."""
    _put(config, "dropout", check_real("dropout", config.dropout, minimum=0, maximum=1,
                                       max_open=True))
    rates = inner_dropout_rates(config.dropout, config.attention_dropout, config.activation_dropout)
    for name, value in zip(("attention_dropout", "activation_dropout"), rates):
        _put(config, name, check_real(name, value, minimum=0, maximum=1, max_open=True))
    _put(config, "layer_norm_eps", check_real("layer_norm_eps", config.layer_norm_eps, minimum=0,
                                              min_open=True))
    if not isinstance(config.activation, str):
        raise ValueError(f"activation: expected a str such as 'relu', got {config.activation!r}")
    if activations is None:
        check_activation(config.activation)
    elif config.activation not in activations[0]:
        raise ValueError(f"activation: expected one of {', '.join(activations[0])} "
                         f"{activations[1]}, got {config.activation!r}")
    for name in flags:
        _put(config, name, check_flag(name, getattr(config, name)))
    _put(config, "dtype", _check_dtype(config.dtype))
    _put(config, "seed", check_int("seed", config.seed, minimum=0))


def _position_table(max_len, d_model, dtype):
    """``derived_arrays`` of a model with the sinusoidal position table."""
    itemsize = np.dtype(dtype).itemsize
    size = max_len * d_model * itemsize
    return {"position table": (size, f"max_len={max_len} needs a {size}-byte position table "
                                     f"(max_len x d_model x {itemsize})")}


@dataclass(frozen=True)
class TransformerConfig(ModelConfig):
    """The encoder-decoder of "Attention Is All You Need" (:class:`npformer.Transformer`).

    ``qk_dim``: query/key width when it differs from ``d_model``; ``tie_embeddings``: the
    generator shares the target embedding matrix; ``share_all_embeddings``: the source embedding,
    the target embedding and the generator share one matrix (fairseq's option, for one joint
    vocabulary: the two sizes must be equal; it implies ``tie_embeddings``); ``generator_bias``:
    whether the generator adds a bias (False: logits = h E^T, as fairseq's output projection);
    ``seed`` draws the initial weights and then every dropout mask.

    Dropout: ``dropout`` on the residual paths (each sublayer's output) and on the embeddings;
    ``attention_dropout`` on the attention weights; ``activation_dropout`` after the feed-forward
    activation. Left out (None), the last two take ``dropout``'s value, as in
    torch.nn.Transformer, which has one rate for all three; fairseq sets them apart (its
    defaults are 0). The value is resolved when the configuration is made, so ``replace`` with a
    new ``dropout`` keeps the other two as they were."""
    arch: ClassVar[str] = "transformer"
    capability: ClassVar[str] = "seq2seq"

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
    generator_bias: bool = True
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self):
        _check_sizes(self, ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff",
                            "n_encoder_layers", "n_decoder_layers", "max_len"))
        if self.qk_dim is not None:
            _put(self, "qk_dim", check_int("qk_dim", self.qk_dim))
            if self.qk_dim % self.n_heads:
                raise ValueError(f"n_heads: expected a divisor of d_model={self.d_model} and "
                                 f"qk_dim={self.qk_dim}, got {self.n_heads}")
        n_ids = min(self.src_vocab_size, self.tgt_vocab_size)
        _put(self, "pad_id", check_int("pad_id", self.pad_id, minimum=0))
        if self.pad_id >= n_ids:
            raise ValueError(f"pad_id: expected an id in [0, {n_ids}), got {self.pad_id!r}")
        _check_layer_options(self, ("norm_first", "tie_embeddings", "share_all_embeddings",
                                    "generator_bias"))
        if self.share_all_embeddings:
            if self.src_vocab_size != self.tgt_vocab_size:
                raise ValueError(f"share_all_embeddings: needs one joint vocabulary, but "
                                 f"src_vocab_size={self.src_vocab_size} differs from "
                                 f"tgt_vocab_size={self.tgt_vocab_size}")
            _put(self, "tie_embeddings", True)         # the generator shares it too

    SIZE_FIELDS: ClassVar[tuple] = ("src_vocab_size", "tgt_vocab_size", "d_model", "d_ff",
                                    "qk_dim", "n_encoder_layers", "n_decoder_layers", "max_len")

    def parameter_count(self):
        """The sum of :meth:`parameter_shapes`, in closed form."""
        d, ff, qk = self.d_model, self.d_ff, self.qk_dim or self.d_model
        attention = (2 * qk + d) * (d + 1) + d * (d + 1)             # in_proj, out_proj
        ffn = d * ff + ff + ff * d + d
        encoder_layer = attention + ffn + 2 * 2 * d                   # two norms
        decoder_layer = 2 * attention + ffn + 3 * 2 * d               # three norms
        embeddings = self.src_vocab_size * d
        if not self.share_all_embeddings:
            embeddings += self.tgt_vocab_size * d
        generator = (0 if self.tie_embeddings else d * self.tgt_vocab_size) + \
            (self.tgt_vocab_size if self.generator_bias else 0)
        return (embeddings + self.n_encoder_layers * encoder_layer + 2 * d
                + self.n_decoder_layers * decoder_layer + 2 * d + generator)

    def layer_count(self):
        return self.n_encoder_layers + self.n_decoder_layers

    def vocab_sizes(self):
        """The size of each vocabulary the model reads or writes (``Vocabularies.check_fits``)."""
        return {"src": self.src_vocab_size, "tgt": self.tgt_vocab_size}

    def derived_arrays(self):
        return _position_table(self.max_len, self.d_model, self.dtype)


def check_rope_scaling(scaling, name="rope_scaling"):
    """GPTConfig.rope_scaling as a plain dict of Llama 3's five settings, or ValueError naming
    the key as ``name.key`` (Hugging Face's ``rope_scaling``; its older spelling ``type`` is
    read too; ``npformer.hf`` reads config.json's through here)."""
    if not isinstance(scaling, dict):
        raise ValueError(f"{name}: expected a dict such as Llama 3's {{'rope_type': "
                         f"'llama3', 'factor': 8.0, ...}}, got {type(scaling).__name__}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        raise ValueError(f"{name}: rope_type: expected 'llama3' (the only rescaling built), "
                         f"got {kind!r}")
    out = {"rope_type": "llama3"}
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        out[key] = check_real(f"{name}.{key}", scaling.get(key), minimum=0, min_open=True)
    if out["high_freq_factor"] <= out["low_freq_factor"]:
        raise ValueError(f"{name}.high_freq_factor: expected more than low_freq_factor="
                         f"{out['low_freq_factor']}, got {out['high_freq_factor']}")
    out["original_max_position_embeddings"] = check_int(
        f"{name}.original_max_position_embeddings",
        scaling.get("original_max_position_embeddings"))
    return out


# GPTConfig.norm, GPTConfig.ffn and GPTConfig.positions name parts of npformer.parts (NORMS,
# FFNS, POSITIONS); the names of positions, as a command's choices
POSITIONS = tuple(POSITION_KINDS)
FAMILY_NAME = re.compile(r"[a-z][a-z0-9_]*")          # GPTConfig.family (npformer.families)


@dataclass(frozen=True)
class GPTConfig(ModelConfig):
    """The decoder-only language model (:class:`npformer.GPT`); the defaults are GPT-2 small's.

    A token embedding plus positions, ``n_layers`` causal self-attention blocks (pre-norm by
    default), a final norm and an output projection without bias, tied to the token embedding
    by default. ``positions``: "learned", one trained vector per position added to the token's
    (GPT-2's ``wpe``); "sinusoidal", the fixed table added instead, with the token embedding
    scaled by sqrt(d_model) as in "Attention Is All You Need"; "rotary", nothing added: each
    self-attention turns its queries and keys by their positions (RoPE, GPT-NeoX's layout; an
    even head size), at the frequencies ``rope_theta`` ** (-2i / head size), rescaled by
    ``rope_scaling`` (Llama 3's "llama3" rule; None: not rescaled).

    Dropout as GPT-2's: ``dropout`` on the embeddings and on each block's residual paths
    (``embd_pdrop``, ``resid_pdrop``), ``attention_dropout`` on the attention weights (None:
    ``dropout``'s value, GPT-2's ``attn_pdrop``); ``activation_dropout`` after the feed-forward
    activation, which GPT-2 does not have (0; None: ``dropout``'s value).

    The block, chosen by fields (a new variant is a field, not a class):
    - ``norm``: "layernorm" or "rmsnorm" (Llama's: no mean, no shift; ``layer_norm_eps`` is its
      epsilon too);
    - ``ffn``: "mlp", two matrices around ``activation``, or "gated", act(x W_gate) * (x W_up),
      then W_down, ``act`` the ``activation``: SwiGLU with "silu" (Llama's), GeGLU with
      "gelu_tanh" or "gelu", ReGLU with "relu" (the kinds: ``npformer.parts``);
    - ``n_heads`` query heads of ``head_dim`` each (None: d_model / n_heads; Qwen3-0.6B has a
      width of 1024, 16 heads of 128); ``n_kv_heads`` key/value heads (None: n_heads; fewer is
      grouped-query attention, one multi-query attention: a divisor of n_heads); ``qk_norm``:
      Qwen3's RMSNorm over each query and key head;
    - ``qkv_bias``: the query, key and value projections add a bias; ``proj_bias``: every other
      projection does (attention output, feed-forward). GPT-2 has both, Qwen2 only the first,
      Llama neither;
    - ``post_norms``: a norm also after each sub-layer, before its residual add (Gemma 2's
      ``post_attention_layernorm`` and ``post_feedforward_layernorm``): x + norm'(f(norm(x)));
    - ``attention_scale``: the factor of the attention scores (None: 1 / sqrt(head size); Gemma
      2's query_pre_attn_scalar ** -0.5); ``attention_softcap`` and ``logit_softcap``: the
      attention scores and the final logits soft-capped, cap * tanh(x / cap) (Gemma 2's
      ``attn_logit_softcapping`` and ``final_logit_softcapping``; None: not capped);
    - ``sliding_window``: each query sees only the last ``sliding_window`` positions, itself
      included (Mistral's sliding-window attention; None: every earlier position);
      ``sliding_window_pattern``: which layers slide (None: every layer; p: all but every p-th,
      layer i, from 0, attending fully where (i + 1) % p == 0, as Hugging Face's Gemma 2
      (p = 2) and Gemma 3 (p = 6)). :meth:`layer_window` gives one layer's window;
    - ``scale_embedding``: the token vectors are scaled by sqrt(d_model) whatever the positions
      (Gemma's; the sinusoidal positions scale them anyway).

    ``family``: the model family whose block and Hugging Face names the model has
    (``npformer.families``: "gpt2", "llama", "qwen2", "qwen3"), as recorded where the model was
    made (a Hugging Face folder's ``model_type``, ``npformer lm --arch``); None where none was
    recorded, as in configurations stored before the field existed (never guessed from the
    other fields)."""
    arch: ClassVar[str] = "gpt"
    capability: ClassVar[str] = "causal_lm"
    # GPT parameters were named after the Encoder stack it was built from until the blocks
    # became its own: checkpoints written then are renamed on load
    RENAMED: ClassVar[tuple] = (("transformer.layers.", "blocks."), ("transformer.norm.", "norm."))

    vocab_size: int
    d_model: int = 768
    n_heads: int = 12
    d_ff: int = 3072
    n_layers: int = 12
    max_len: int = 1024
    dropout: float = 0.1
    attention_dropout: Optional[float] = None
    activation_dropout: Optional[float] = 0.0
    norm_first: bool = True
    activation: str = "gelu_tanh"
    layer_norm_eps: float = 1e-5
    positions: str = "learned"
    tie_embeddings: bool = True
    dtype: str = "float32"
    seed: int = 0
    norm: str = "layernorm"
    ffn: str = "mlp"
    n_kv_heads: Optional[int] = None
    head_dim: Optional[int] = None
    qkv_bias: bool = True
    proj_bias: bool = True
    qk_norm: bool = False
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    post_norms: bool = False
    attention_scale: Optional[float] = None
    attention_softcap: Optional[float] = None
    logit_softcap: Optional[float] = None
    family: Optional[str] = None
    sliding_window: Optional[int] = None
    sliding_window_pattern: Optional[int] = None
    scale_embedding: bool = False

    def __post_init__(self):
        if self.family is not None and (not isinstance(self.family, str) or
                                        not FAMILY_NAME.fullmatch(self.family)):
            raise ValueError(f"family: expected a model family's name such as 'llama' (lower "
                             f"case letters and digits) or None, got {self.family!r}")
        if self.head_dim is not None:
            _put(self, "head_dim", check_int("head_dim", self.head_dim))
        _check_sizes(self, ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"),
                     heads_split_d_model=self.head_dim is None)
        if isinstance(self.ffn, str) and self.ffn in RECORDED_FFNS:   # a recorded name
            now = ", ".join(f"{k}={v!r}" for k, v in RECORDED_FFNS[self.ffn].items())
            raise ValueError(f"ffn: expected one of {', '.join(FFNS)}, got {self.ffn!r} "
                             f"(which is now {now})")
        ffn = choice("ffn", FFNS, self.ffn)
        _check_layer_options(self, ("norm_first", "tie_embeddings", "qkv_bias", "proj_bias",
                                    "qk_norm", "post_norms", "scale_embedding"),
                             (ffn.activations, f"for ffn={self.ffn!r}"))
        choice("norm", NORMS, self.norm)
        positions = choice("positions", POSITION_KINDS, self.positions)
        if self.n_kv_heads is not None:
            _put(self, "n_kv_heads", check_int("n_kv_heads", self.n_kv_heads))
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_kv_heads: expected a divisor of n_heads={self.n_heads} (each "
                                 f"key/value head serves a group of query heads), got "
                                 f"{self.n_kv_heads}")
        _put(self, "rope_theta", check_real("rope_theta", self.rope_theta, minimum=0,
                                            min_open=True))
        for name in ("attention_scale", "attention_softcap", "logit_softcap"):
            if getattr(self, name) is not None:              # None: the usual 1 / sqrt, no cap
                _put(self, name, check_real(name, getattr(self, name), minimum=0,
                                            min_open=True))
        if self.rope_scaling is not None:
            if not positions.rotates:
                raise ValueError(f"rope_scaling: rescales rotary positions, but positions is "
                                 f"{self.positions!r}")
            _put(self, "rope_scaling", check_rope_scaling(self.rope_scaling))
        if positions.rotates and self.head_size % 2:
            raise ValueError(f"positions: {self.positions!r} turns pairs of dimensions, so "
                             f"expected an even head size, got {self.head_size}")
        if self.sliding_window is not None:
            _put(self, "sliding_window", check_int("sliding_window", self.sliding_window))
        if self.sliding_window_pattern is not None:
            _put(self, "sliding_window_pattern",
                 check_int("sliding_window_pattern", self.sliding_window_pattern, minimum=2))
            if self.sliding_window is None:
                raise ValueError(f"sliding_window_pattern: chooses the layers whose attention "
                                 f"slides, but sliding_window is None; expected None, got "
                                 f"{self.sliding_window_pattern}")

    def layer_window(self, layer):
        """The sliding window of block ``layer`` (from 0): ``sliding_window``, or None where
        that layer attends to every earlier position."""
        pattern = self.sliding_window_pattern
        if pattern is not None and (layer + 1) % pattern == 0:
            return None
        return self.sliding_window

    @property
    def head_size(self):
        """The width of one attention head: ``head_dim``, or d_model / n_heads."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @classmethod
    def from_dict(cls, data):
        """As :meth:`ModelConfig.from_dict`, with two migrations. A configuration stored before
        ``positions`` existed names them with the flag ``learned_positions`` (True: "learned",
        False: "sinusoidal"). One stored before ``activation`` applied to gated feed-forwards
        names the kind of one (``ffn`` "swiglu": "gated" with "silu"; its ``activation`` was
        unused): ``parts.RECORDED_FFNS`` gives its fields now."""
        if isinstance(data, dict) and "learned_positions" in data and "positions" not in data:
            data = dict(data)
            learned = check_flag("learned_positions", data.pop("learned_positions"))
            data["positions"] = "learned" if learned else "sinusoidal"
        if isinstance(data, dict) and isinstance(data.get("ffn"), str) \
                and data["ffn"] in RECORDED_FFNS:
            data = {**data, **RECORDED_FFNS[data["ffn"]]}
        return super().from_dict(data)

    SIZE_FIELDS: ClassVar[tuple] = ("vocab_size", "d_model", "d_ff", "n_layers", "max_len",
                                    "head_dim")

    def parameter_count(self):
        """The sum of :meth:`parameter_shapes`, without a loop over the layers: one block's
        parameters, read off the modules of a one-layer model built without allocating, times
        ``n_layers``, plus the ends (embeddings, positions, the final norm, the generator). For
        sizes whose arrays NumPy cannot even describe, a lower bound (the size checks' use)."""
        try:
            one = {name: math.prod(shape)
                   for name, shape in self.replace(n_layers=1).parameter_shapes().items()}
        except ValueError:        # shapes past NumPy's reach ("array is too big": over 2**63
            # bytes) cannot be listed; every block has at least its query, key and value
            # projections and its two feed-forward matrices, and the model its embedding: one
            # of them is the size past that reach, already more than any machine holds
            heads = self.n_heads + 2 * (self.n_kv_heads or self.n_heads)
            block = heads * self.head_size * self.d_model + 2 * self.d_model * self.d_ff
            return self.n_layers * block + self.vocab_size * self.d_model
        block = sum(size for name, size in one.items() if name.startswith("blocks.0."))
        return sum(one.values()) - block + self.n_layers * block

    def layer_count(self):
        return self.n_layers

    def vocab_sizes(self):
        """{}: a language model's tokens come from its tokenizer (a Hugging Face tokenizer.json,
        or a vocabulary the caller stores), not from a ``Vocabularies`` pair it must match."""
        return {}

    def derived_arrays(self):
        positions = POSITION_KINDS[self.positions]
        if positions.table:
            return _position_table(self.max_len, self.d_model, self.dtype)
        if positions.rotates:                 # cos and sin, (max_len, head size / 2) each
            size = self.max_len * self.head_size * np.dtype(self.dtype).itemsize
            return {"rotary tables": (size, f"max_len={self.max_len} needs {size} bytes of rotary "
                                            f"tables (max_len x head size x "
                                            f"{np.dtype(self.dtype).itemsize})")}
        return {}
