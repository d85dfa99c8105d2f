"""What a model family is, declared as data: :class:`Family`, and the two rules every family
shares: its tensor map read into names (:func:`tensor_names`) and its end ids
(:func:`producible_ends`)."""
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Family:
    """One model family of Hugging Face folders, as npformer reads and writes it.

    - ``name``: its ``model_type`` in config.json, and npformer's name for it;
    - ``display``: how messages and summaries name it;
    - ``block``: its block fields (a partial ``GPTConfig``: what ``npformer lm --arch`` trains);
    - ``read_config(file, raw)``: the ``GPTConfig`` of its config.json (``raw``, read from
      ``file``), with the family's defaults for what the file leaves out;
    - ``end_ids(folder, raw, vocab_size, warn)``: the folder's end-of-text ids (an int, a tuple
      of them, or None), those the model cannot produce left out (:func:`producible_ends`);
    - the tensor map: ``layer``, a block's prefix with ``{}`` for its number (``h.{}.``);
      ``blocks`` and ``ends``, {Hugging Face module: (npformer parameter less its
      "weight"/"bias", the part of its rows filled, stored transposed)}, inside a block and
      outside the blocks; ``buffers``, a pattern of the stored tensors that are not weights;
      ``prefix``, a prefix the stored names may carry (GPT-2's ``transformer.``);
    - ``peft_targets``: {PEFT target name: the modules inside a block it names (PEFT matches a
      name at the end of a module's path: GPT-2's ``c_proj`` is the attention's and the
      MLP's)}; ``default_targets``, PEFT's default for the family; ``gated_targets``, those
      that exist only in a gated feed-forward (Llama's ``gate_proj`` and ``up_proj``);
    - ``layers_key`` and ``size_keys``: config.json's names of the layer count and of
      ``GPTConfig``'s size fields, for messages.
    """
    name: str
    display: str
    block: dict
    read_config: Callable
    end_ids: Callable
    layer: str
    blocks: dict
    ends: dict
    layers_key: str
    size_keys: dict
    buffers: str = r"(?!)"
    prefix: str = ""
    peft_targets: dict = field(default_factory=dict)
    default_targets: tuple = ()
    gated_targets: tuple = ()

    @property
    def head(self):
        """The Hugging Face name of the output projection's weight (GPT-2's and Llama's
        ``lm_head.weight``): absent, or equal to the embedding, where the two are tied."""
        theirs, = (name for name, (ours, _, _) in self.ends.items() if ours == "generator.")
        return f"{theirs}.weight"

    def from_hf_config(self, raw, file="config.json"):
        """The ``GPTConfig`` of this family's config.json (the dict ``raw``, read from
        ``file``, which errors name)."""
        return self.read_config(file, raw)

    @property
    def layer_pattern(self):
        """A compiled pattern matching a block's tensor names; group 1 is the block's number."""
        head, tail = self.layer.split("{}")
        return re.compile(re.escape(head) + r"(\d+)" + re.escape(tail))

    def is_buffer(self, name):
        """Whether the stored tensor ``name`` (less ``prefix``) is a buffer, not a weight."""
        return re.fullmatch(self.buffers, name) is not None


def rows(config, part):
    """The rows of a fused npformer parameter that ``part`` ("q", "k", "v", "gate", "up"; None:
    all) fills, as a slice: the attention's in_proj holds [q | k | v] (H, then H_kv, then H_kv
    heads), a gated feed-forward's linear1 holds [gate | up] (d_ff rows each)."""
    q = config.n_heads * config.head_size
    kv = (config.n_kv_heads or config.n_heads) * config.head_size
    return {None: slice(None), "q": slice(0, q), "k": slice(q, q + kv),
            "v": slice(q + kv, q + 2 * kv), "gate": slice(0, config.d_ff),
            "up": slice(config.d_ff, 2 * config.d_ff)}[part]


def tensor_names(family, config):
    """{Hugging Face tensor name: (npformer parameter name, rows, stored transposed)} of every
    tensor a model of ``config`` (a ``GPTConfig``) of ``family`` has, in npformer's parameter
    order: ``model.named_parameters()[name].data[rows]`` is the tensor (its transpose where
    stored transposed). Which exist (biases, the query/key norms, an untied lm_head) the
    configuration's parameters decide."""
    shapes = config.parameter_shapes()
    modules = [(family.layer.format(i) + theirs, f"blocks.{i}.{ours}", part, transposed)
               for i in range(config.n_layers)
               for theirs, (ours, part, transposed) in family.blocks.items()]
    modules += [(theirs, ours, part, transposed)
                for theirs, (ours, part, transposed) in family.ends.items()]
    names = {}
    for theirs, ours, part, transposed in modules:
        for suffix in ("weight", "bias"):
            if ours + suffix in shapes:
                names[f"{theirs}.{suffix}"] = (ours + suffix, rows(config, part),
                                               transposed and suffix == "weight")
    order = {name: i for i, name in enumerate(shapes)}
    return dict(sorted(names.items(), key=lambda item: (order[item[1][0]],
                                                        item[1][1].start or 0)))


def parameter_of(family, config, name):
    """Where the Hugging Face tensor ``name`` (e.g. ``model.layers.3.self_attn.k_proj.weight``)
    of a model of ``config`` of ``family`` lives in npformer: ``(parameter name, rows,
    transposed)``, the tensor being ``parameters[parameter name].data[rows]`` (for k_proj, the
    key rows of the fused ``in_proj_weight``). ValueError for a name the model does not have."""
    match = family.layer_pattern.match(name)
    layer = int(match.group(1)) if match else None
    if layer is not None and layer >= config.n_layers:
        raise ValueError(f"{name}: the model has {config.n_layers} layers (0 to "
                         f"{config.n_layers - 1})")
    single = config.replace(n_layers=1) if layer is not None else config
    key = name if layer is None else family.layer.format(0) + name[match.end():]
    found = tensor_names(family, single).get(key)
    if found is None:
        raise ValueError(f"{name}: not a tensor of this model (npformer.families.tensor_names "
                         f"lists them: a bias, a query/key norm or an lm_head only where the "
                         f"configuration has one)")
    ours, part, transposed = found
    if layer is not None:
        ours = f"blocks.{layer}." + ours[len("blocks.0."):]
    return ours, part, transposed


def producible_ends(file, key, ids, vocab_size, warn=True):
    """The end-of-text ids among ``ids`` (``file``'s ``key``: non-negative ints) that a model of
    ``vocab_size`` tokens can produce: one int, a tuple of them (generation stops at any), or
    None. An id of ``vocab_size`` or more is dropped with one warning naming the file (with
    ``warn``), as transformers loads such a folder (GPT2Config(vocab_size=101) keeps GPT-2's
    end id 50256): the end id matters only to generation, which then stops at the other ids or
    only at its length limit. Every family's end ids go through here."""
    ids = tuple(dict.fromkeys(ids))
    kept = tuple(i for i in ids if i < vocab_size)
    if warn and len(kept) < len(ids):
        lost = ", ".join(str(i) for i in ids if i >= vocab_size)
        then = (f"generation stops at {', '.join(map(str, kept))} or at the length limit"
                if kept else "generation stops only at the length limit")
        warnings.warn(f"{file}: {key}: {lost} cannot be produced by a model of vocab_size="
                      f"{vocab_size} (ids 0 to {vocab_size - 1}); {then}", stacklevel=2)
    return None if not kept else kept[0] if len(kept) == 1 else kept
