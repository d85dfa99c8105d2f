"""Model and training checkpoints on top of ``npformer.checkpoint`` (atomic npz + JSON).

Arrays: ``model/<parameter name>``, ``optim/{step_count,exp_avg,exp_avg_sq}``, ``rng/model/...``
(the dropout rng). Metadata (checkpoint format 3)::

    {"kind": "npformer-model", "npformer_version": "0.1.0",
     "config": {"arch": "transformer", ...},             # model.config.to_dict()
     "vocabularies": {"src": [...], "tgt": [...]},       # or {"joint": [...]}; absent: none
     "training": {...}, "runtime": {...}, "extra": {...}}

``training`` holds the trainer's counters, the batch sampler's position and the early-stopping
state, and ``runtime`` the matrix-product variants in force (``npformer.runtime.record``), so a
resumed run continues bit for bit. Format-2 files (no architecture, no npformer version,
``src_vocab``/``tgt_vocab`` lists) are migrated on load (:func:`migrate_meta`).
"""
import os
from dataclasses import dataclass

import numpy as np

from .. import runtime
from ..checkpoint import (CheckpointError, checkpoint_paths, load_checkpoint, rng_from_arrays,
                          rng_state_to_arrays, save_checkpoint)
from ..data.vocab import Vocabularies
from ..hf import from_pretrained
from ..lora import adapter_state, base_identity, load_adapter_state
from ..registry import ARCHITECTURES, build_model, config_from_dict, is_registered
from ..version import VERSION
from .lora_runs import rebuild, run_dropouts

KIND = "npformer-model"
_MODEL, _OPTIM, _RNG = "model/", "optim/", "rng/model"


def save_model_checkpoint(path, model, vocabs, optimizer=None, training=None, extra=None):
    """Write the weights (+ the optimizer state and the dropout rng if ``optimizer`` is given),
    the configuration and ``vocabs`` (a ``Vocabularies``; None for a model that reads no tokens,
    whose configuration's ``vocab_sizes()`` is empty). Returns the paths written."""
    Vocabularies.check_fits(vocabs, model.config.vocab_sizes(),
                            pad_id=getattr(model.config, "pad_id", None))
    lora = getattr(model, "lora", None)           # a LoRA run: its adapters alone, and its base
    if lora is not None:
        base_identity(model)                      # its base's sha256, computed once
        arrays = {_MODEL + name: value for name, value in adapter_state(model).items()}
    else:
        arrays = {_MODEL + name: value for name, value in model.state_dict().items()}
    if optimizer is not None:
        arrays.update({_OPTIM + k: np.asarray(v) for k, v in optimizer.state_dict().items()})
        arrays.update(rng_state_to_arrays(model.rng, _RNG))
    meta = {"kind": KIND, "npformer_version": VERSION, "config": model.config.to_dict(),
            "runtime": runtime.record()}
    if vocabs is not None:
        meta["vocabularies"] = vocabs.to_dict()
    if lora is not None:
        meta["lora"] = lora.to_dict()
    if training is not None:
        meta["training"] = training
    if extra:
        meta["extra"] = extra
    return save_checkpoint(path, arrays, meta)


@dataclass
class LoadedCheckpoint:
    model: object                 # the model of the stored configuration's architecture
    vocabs: Vocabularies          # None for a model that reads no tokens
    meta: dict                    # in today's layout (a format-2 file's is migrated on load)
    arrays: dict
    path: str


def migrate_meta(meta):
    """A model checkpoint's metadata in today's layout (format 3). Format 2 stored the
    configuration without its architecture (always the translator's) and the vocabularies as
    two lists, ``src_vocab`` and ``tgt_vocab``; the npformer that wrote it is not recorded."""
    if "vocabularies" in meta or "src_vocab" not in meta:
        return meta
    meta = dict(meta)
    meta["vocabularies"] = {"src": meta.pop("src_vocab"), "tgt": meta.pop("tgt_vocab", None)}
    if isinstance(meta.get("config"), dict):
        meta["config"] = {"arch": "transformer", **meta["config"]}
    return meta


def _describe(path):
    return str(checkpoint_paths(path)[1].with_suffix(""))


# The one array a model derives rather than stores: the (max_len, d_model) table of sinusoidal
# positions. Its size comes from the config alone, so it is bounded by what the file justifies.
POSITION_TABLE_CEILING = 64 * 2**20   # bytes


def load_model_checkpoint(path):
    """Rebuild the model and vocabularies saved by ``save_model_checkpoint`` (eval mode).

    Raises ``CheckpointError`` (a ValueError) naming the file for a missing, truncated or corrupt
    checkpoint, or one that is not an npformer model. Before any model is built, the config must
    describe exactly the stored weights: every parameter it implies is stored under
    ``model/<name>`` with that shape and the config's dtype, and nothing else is stored there.
    So the model's parameters are no larger than the file. The one array a model derives from
    its config alone, the sinusoidal position table (max_len x d_model), may take at most
    ``max(POSITION_TABLE_CEILING, bytes of the stored weights)``. Every weight must be finite.
    """
    arrays, meta = load_checkpoint(path)
    name = _describe(path)
    if meta.get("kind") != KIND:
        raise CheckpointError(f"checkpoint {name}: expected kind {KIND!r}, got {meta.get('kind')!r}")
    meta = migrate_meta(meta)
    try:
        vocabs = (Vocabularies.from_dict(meta["vocabularies"]) if "vocabularies" in meta
                  else None)             # a model that reads no tokens has none
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {name}: bad vocabulary ({e})") from None
    stored = meta.get("config")
    if not isinstance(stored, dict):
        raise CheckpointError(f"checkpoint {name}: expected a 'config' object, got {stored!r:.60}")
    arch = stored.get("arch")
    if not is_registered(arch):
        writer = meta.get("npformer_version")
        raise CheckpointError(
            f"checkpoint {name}: holds a model of architecture {arch!r}, written by "
            f"{'npformer ' + str(writer) if writer else 'an unknown npformer'}; this npformer "
            f"{VERSION} knows {sorted(ARCHITECTURES)}")
    try:
        config = config_from_dict(stored)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {name}: cannot build the model from its config ({e})") from None
    weights = {k[len(_MODEL):]: v for k, v in arrays.items() if k.startswith(_MODEL)}
    if "lora" in meta:                                # adapters over a base named by folder
        model = _lora_model(meta, config, weights, name)
    else:
        weights = type(config).current_names(weights)   # names stored before a rename: migrated
        _check_weights_fit_config(config, weights, name)
        model = build_model(config)
    try:
        Vocabularies.check_fits(vocabs, model.config.vocab_sizes(), f"checkpoint {name}",
                                pad_id=getattr(model.config, "pad_id", None))
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    try:
        if "lora" not in meta:
            model.load_state_dict(weights)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {name}: weights do not match its config ({e})") from None
    model.eval()
    return LoadedCheckpoint(model, vocabs, meta, arrays, name)


def load_base(base, where):
    """The frozen base a LoRA checkpoint records: its Hugging Face folder or npformer checkpoint
    (``base["folder"]``, ``base["kind"]``)."""
    folder = base.get("folder")
    if not folder or not (os.path.exists(folder) or os.path.exists(f"{folder}.npz")):
        raise ValueError(f"{where}: its base model {folder!r} is not there any more (a LoRA "
                         f"checkpoint holds the adapters alone; put the base back, or pass it "
                         f"with sample --hf DIR --adapter)")
    if base.get("kind") == "npformer":
        return load_model_checkpoint(folder).model
    return from_pretrained(folder)


def _lora_model(meta, config, weights, name):
    """The model of a LoRA checkpoint: its base read again from the folder it records, checked
    by configuration and by the hash of its weights, then the stored adapters applied and
    loaded (each checked: present, of its shape and dtype, finite)."""
    where = f"checkpoint {name}"
    if not isinstance(meta["lora"], dict) or not isinstance(meta["lora"].get("base"), dict):
        raise CheckpointError(f"{where}: 'lora' expected an object with a 'base', got "
                              f"{meta['lora']!r:.80}")
    try:
        model = load_base(meta["lora"]["base"], where)
        dropouts = run_dropouts(config.to_dict(), model.config.to_dict(), where,
                                meta["lora"]["base"].get("folder"))
        return rebuild(model, meta["lora"], weights, where, dropouts=dropouts)
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def _check_weights_fit_config(config, weights, name):
    """Compare the (validated) config with the stored weights without allocating anything (see
    ``load_model_checkpoint``); raise CheckpointError naming every mismatch."""
    layers = config.layer_count()
    if layers > len(weights):      # each layer has parameters: don't even list a million of them
        raise CheckpointError(f"checkpoint {name}: the config claims {layers} layers but the file "
                              f"stores only {len(weights)} model arrays")
    shapes = config.parameter_shapes()         # (an architecture may define its own listing)
    missing = [k for k in shapes if k not in weights]
    unexpected = [_MODEL + k for k in weights if k not in shapes]
    wrong = [f"{_MODEL}{k}: the config implies shape {shape}, the file stores {weights[k].shape}"
             for k, shape in shapes.items() if k in weights and weights[k].shape != shape]
    if missing or unexpected or wrong:
        parts = ([f"missing {[_MODEL + k for k in missing][:5]}"] if missing else []) + \
                ([f"unexpected {unexpected[:5]}"] if unexpected else []) + wrong[:5]
        raise CheckpointError(f"checkpoint {name}: the stored weights do not match its config: "
                              + "; ".join(parts))
    dtype = np.dtype(config.dtype)
    for k, value in weights.items():
        _check_tensor(value, _MODEL + k, dtype, name)
    allowed = max(POSITION_TABLE_CEILING, sum(w.nbytes for w in weights.values()))
    for nbytes, why in config.derived_arrays().values():
        if nbytes > allowed:
            raise CheckpointError(
                f"checkpoint {name}: config {why}; a checkpoint may claim at most {allowed} bytes "
                f"for it (the larger of {POSITION_TABLE_CEILING} bytes and its stored weights' "
                f"bytes)")


def _check_tensor(value, key, dtype, name, minimum=None):
    """``value`` must have exactly ``dtype`` (no silent casts on load) and finite entries."""
    if value.dtype != dtype:
        raise CheckpointError(f"checkpoint {name}: array {key!r} is {value.dtype}; expected "
                              f"{dtype} (the config's dtype)")
    finite = np.isfinite(value)
    if not finite.all():
        bad = int(finite.size - np.count_nonzero(finite))
        raise CheckpointError(f"checkpoint {name}: array {key!r} holds {bad} non-finite "
                              f"value(s) (NaN or inf); refusing to load it")
    if minimum is not None and value.size and value.min() < minimum:
        raise CheckpointError(f"checkpoint {name}: array {key!r} holds negative values "
                              f"(min {value.min()!r}); expected >= {minimum}")


def check_compatible(loaded, config=None, vocabs=None):
    """Raise CheckpointError naming every config field / vocabulary that differs from the
    checkpoint's. ``config``: a model configuration (``model.config``); ``vocabs``: a
    ``Vocabularies`` (a joint one matches only a joint one)."""
    problems = []
    if config is not None:
        mine_all, theirs_all = config.to_dict(), loaded.model.config.to_dict()
        for key in sorted(set(mine_all) | set(theirs_all)):
            mine, theirs = mine_all.get(key), theirs_all.get(key)
            if mine != theirs:
                problems.append(f"config {key}: checkpoint has {theirs!r}, expected {mine!r}")
    if vocabs is not None and loaded.vocabs is None:
        problems.append("vocabularies differ: the checkpoint holds none")
    elif vocabs is not None and vocabs.is_joint != loaded.vocabs.is_joint:
        problems.append(f"vocabularies differ: the checkpoint holds "
                        f"{'one joint vocabulary' if loaded.vocabs.is_joint else 'a source and a target vocabulary'}, "
                        f"expected {'one joint vocabulary' if vocabs.is_joint else 'a source and a target vocabulary'}")
    elif vocabs is not None:
        for (side, vocab), (_, saved) in zip(vocabs.sides(), loaded.vocabs.sides()):
            if vocab != saved:
                diff = sorted(set(vocab.tokens) ^ set(saved.tokens))[:5]
                problems.append(f"{side} vocabulary differs ({len(saved)} tokens in the "
                                f"checkpoint, {len(vocab)} expected; e.g. {diff})")
    if problems:
        raise CheckpointError(f"checkpoint {loaded.path} does not match this run: " + "; ".join(problems))


def restore_training_state(loaded, model, optimizer):
    """Copy weights, optimizer moments and the dropout RNG of ``loaded`` into a live run.

    Everything is checked before anything is copied, so a CheckpointError (naming the file)
    leaves ``model`` and ``optimizer`` as they were. Returns the metadata's ``training`` dict.
    """
    name = loaded.path
    mine, theirs = getattr(model, "lora", None), getattr(loaded.model, "lora", None)
    if (mine is None) != (theirs is None):
        raise CheckpointError(f"checkpoint {name}: " + (
            "holds LoRA adapters; this run trains the whole model" if theirs is not None else
            "trained the whole model; this run trains LoRA adapters"))
    own = {k: p.shape for k, p in model.named_parameters()}
    saved = {k: p.shape for k, p in loaded.model.named_parameters()}
    if own != saved:
        diff = sorted(k for k in own.keys() | saved.keys() if own.get(k) != saved.get(k))[:5]
        raise CheckpointError(f"checkpoint {name}: its weights do not fit this model (names or "
                              f"shapes differ, e.g. {diff})")
    optim = {k[len(_OPTIM):]: v for k, v in loaded.arrays.items() if k.startswith(_OPTIM)}
    if not optim:
        raise CheckpointError(f"checkpoint {name}: holds no optimizer state (saved for inference "
                              f"only?), cannot resume training from it")
    _check_optimizer_state(optim, np.dtype(loaded.model.config.dtype), name)
    training = loaded.meta.get("training")
    if not isinstance(training, dict):
        raise CheckpointError(f"checkpoint {name}: no 'training' state in its metadata")
    try:
        state = rng_from_arrays(loaded.arrays, _RNG).bit_generator.state
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {name}: bad dropout RNG state ({e})") from None
    if state["bit_generator"] != model.rng.bit_generator.state["bit_generator"]:
        raise CheckpointError(f"checkpoint {name}: its dropout RNG is a {state['bit_generator']}, "
                              f"this model's a {model.rng.bit_generator.state['bit_generator']}")
    try:
        optimizer.load_state_dict(optim)  # checks every entry before copying any
    except ValueError as e:
        raise CheckpointError(f"checkpoint {name}: optimizer state does not fit ({e})") from None
    if getattr(model, "lora", None) is not None:    # the base is frozen: the adapters alone
        if loaded.model is not model:
            load_adapter_state(model, adapter_state(loaded.model), name)
    else:
        model.load_state_dict(loaded.model.state_dict())
    # set the state in place: every Dropout holds a reference to this very rng
    model.rng.bit_generator.state = state
    return training


def _check_optimizer_state(optim, dtype, name):
    """Adam's moments must have the model's dtype and be finite (exp_avg_sq also >= 0), as
    ``save_model_checkpoint`` writes them (``Adam.load_state_dict`` checks step_count itself)."""
    for key, minimum in (("exp_avg", None), ("exp_avg_sq", 0)):
        if key in optim:
            _check_tensor(optim[key], _OPTIM + key, dtype, name, minimum)
