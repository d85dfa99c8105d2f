"""Model and training checkpoints on top of ``npformer.checkpoint`` (atomic npz + JSON).

Arrays: ``model/<parameter name>``, ``optim/{step_count,exp_avg,exp_avg_sq}``, ``rng/model/...``
(the dropout generator). Metadata: ``{"kind": "npformer-model", "config": model.config,
"src_vocab": [...], "tgt_vocab": [...], "training": {...}}``, where ``training`` holds the
trainer's counters, the batch sampler's position and the early-stopping state, so a resumed run
continues bit for bit.
"""
from dataclasses import dataclass

import numpy as np

from ..checkpoint import (CheckpointError, checkpoint_paths, load_checkpoint, rng_from_arrays,
                          rng_state_to_arrays, save_checkpoint)
from ..data.vocab import Vocab
from ..nn import Transformer

KIND = "npformer-model"
_MODEL, _OPTIM, _RNG = "model/", "optim/", "rng/model"


def save_model_checkpoint(path, model, src_vocab, tgt_vocab, optimizer=None, training=None,
                          extra=None):
    """Write weights (+ optimizer state and RNG if given) and config/vocabularies. Returns paths."""
    arrays = {_MODEL + name: value for name, value in model.state_dict().items()}
    if optimizer is not None:
        arrays.update({_OPTIM + k: np.asarray(v) for k, v in optimizer.state_dict().items()})
        arrays.update(rng_state_to_arrays(model.rng, _RNG))
    meta = {"kind": KIND, "config": dict(model.config), "src_vocab": src_vocab.tokens,
            "tgt_vocab": tgt_vocab.tokens}
    if training is not None:
        meta["training"] = training
    if extra:
        meta["extra"] = extra
    return save_checkpoint(path, arrays, meta)


@dataclass
class LoadedCheckpoint:
    model: Transformer
    src_vocab: Vocab
    tgt_vocab: Vocab
    meta: dict
    arrays: dict
    path: str


def _describe(path):
    return str(checkpoint_paths(path)[1].with_suffix(""))


def load_model_checkpoint(path):
    """Rebuild the model and vocabularies saved by ``save_model_checkpoint`` (eval mode).

    Raises ``CheckpointError`` (a ValueError) naming the file for a missing, truncated or corrupt
    checkpoint, or one that is not an npformer model.
    """
    arrays, meta = load_checkpoint(path)
    name = _describe(path)
    if meta.get("kind") != KIND:
        raise CheckpointError(f"checkpoint {name}: expected kind {KIND!r}, got {meta.get('kind')!r}")
    try:
        src_vocab, tgt_vocab = Vocab(meta["src_vocab"]), Vocab(meta["tgt_vocab"])
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"checkpoint {name}: bad vocabulary ({e})") from None
    config = meta.get("config")
    if not isinstance(config, dict):
        raise CheckpointError(f"checkpoint {name}: expected a 'config' object, got {config!r:.60}")
    try:
        model = Transformer(**config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {name}: cannot build the model from its config ({e})") from None
    check_vocab_sizes(model.config, src_vocab, tgt_vocab, name)
    weights = {k[len(_MODEL):]: v for k, v in arrays.items() if k.startswith(_MODEL)}
    try:
        model.load_state_dict(weights)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {name}: weights do not match its config ({e})") from None
    model.eval()
    return LoadedCheckpoint(model, src_vocab, tgt_vocab, meta, arrays, name)


def check_vocab_sizes(config, src_vocab, tgt_vocab, where):
    for side, vocab in (("src", src_vocab), ("tgt", tgt_vocab)):
        if len(vocab) != config[f"{side}_vocab_size"]:
            raise CheckpointError(f"{where}: {side} vocabulary has {len(vocab)} tokens but the "
                                  f"model config says {side}_vocab_size={config[f'{side}_vocab_size']}")


def check_compatible(loaded, config=None, src_vocab=None, tgt_vocab=None):
    """Raise CheckpointError naming every config key / vocabulary that differs from the checkpoint."""
    problems = []
    if config is not None:
        for key in sorted(set(config) | set(loaded.model.config)):
            mine, theirs = config.get(key), loaded.model.config.get(key)
            if mine != theirs:
                problems.append(f"config {key}: checkpoint has {theirs!r}, expected {mine!r}")
    for side, vocab, saved in (("src", src_vocab, loaded.src_vocab), ("tgt", tgt_vocab, loaded.tgt_vocab)):
        if vocab is not None and vocab != saved:
            diff = sorted(set(vocab.tokens) ^ set(saved.tokens))[:5]
            problems.append(f"{side} vocabulary differs ({len(saved)} tokens in the checkpoint, "
                            f"{len(vocab)} expected; e.g. {diff})")
    if problems:
        raise CheckpointError(f"checkpoint {loaded.path} does not match this run: " + "; ".join(problems))


def restore_training_state(loaded, model, optimizer):
    """Copy weights, optimizer moments and the dropout RNG of ``loaded`` into a live run."""
    name = loaded.path
    model.load_state_dict(loaded.model.state_dict())
    optim = {k[len(_OPTIM):]: v for k, v in loaded.arrays.items() if k.startswith(_OPTIM)}
    if not optim:
        raise CheckpointError(f"checkpoint {name}: holds no optimizer state (saved for inference "
                              f"only?), cannot resume training from it")
    try:
        optimizer.load_state_dict(optim)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {name}: optimizer state does not fit ({e})") from None
    # set the state in place: every Dropout holds a reference to this very generator
    model.rng.bit_generator.state = rng_from_arrays(loaded.arrays, _RNG).bit_generator.state
    training = loaded.meta.get("training")
    if not isinstance(training, dict):
        raise CheckpointError(f"checkpoint {name}: no 'training' state in its metadata")
    return training
