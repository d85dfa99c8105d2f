"""Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one run.

Averaging the last few checkpoints of a run (Vaswani et al. average the last 5 or 20) smooths
out the noise of the final updates and usually gains a little BLEU for free::

    average_checkpoints(["run/step_900", "run/step_1050", "run/step_1200"], "run/averaged")

The checkpoints must share the model config (the seed of the initial weights aside) and the
vocabularies (else ``CheckpointError`` naming the first checkpoint that differs). The result is an inference checkpoint (weights,
config, vocabularies and the metadata ``extra`` of the first checkpoint, plus the list of
averaged files); it holds no optimizer state, so training cannot resume from it.
"""
import numpy as np

from ..checkpoint import CheckpointError
from .checkpointing import check_compatible, load_model_checkpoint, save_model_checkpoint


def average_state_dicts(state_dicts):
    """Mean of each parameter over ``state_dicts`` (accumulated in float64, cast back)."""
    state_dicts = list(state_dicts)
    if not state_dicts:
        raise ValueError("state_dicts: expected at least one state dict, got none")
    first = state_dicts[0]
    out = {}
    for name, value in first.items():
        total = np.zeros(np.shape(value), dtype=np.float64)
        for n, sd in enumerate(state_dicts):
            if name not in sd or np.shape(sd[name]) != np.shape(value):
                raise ValueError(f"state_dicts[{n}]: parameter {name!r} expected shape "
                                 f"{np.shape(value)}, got "
                                 f"{np.shape(sd[name]) if name in sd else 'nothing'}")
            total += sd[name]
        out[name] = (total / len(state_dicts)).astype(np.asarray(value).dtype)
    return out


def load_averaged(paths):
    """Load the checkpoints ``paths`` (one run's, checked compatible) and return the first, a
    ``LoadedCheckpoint`` whose model (eval mode) holds the mean weights of all of them."""
    if isinstance(paths, (str, bytes)):
        raise ValueError("paths: expected a list of checkpoint paths, got one string")
    paths = [str(p) for p in paths]
    if len(paths) < 1:
        raise ValueError("paths: expected at least one checkpoint, got none")
    first = load_model_checkpoint(paths[0])
    states = [first.model.state_dict()]
    for path in paths[1:]:
        loaded = load_model_checkpoint(path)
        try:
            # the initial-weights seed is the one config entry that may differ
            config = first.model.config.replace(seed=loaded.model.config.seed)
            check_compatible(loaded, config, first.vocabs)
        except CheckpointError as e:
            raise CheckpointError(f"cannot average {path} with {first.path}: {e}") from None
        states.append(loaded.model.state_dict())
    first.model.load_state_dict(average_state_dicts(states))
    return first


def average_checkpoints(paths, out):
    """Average the weights of the checkpoints ``paths`` and save them to ``out``.

    Returns the loaded model (eval mode) holding the averaged weights.
    """
    first = load_averaged(paths)
    extra = dict(first.meta.get("extra") or {})
    extra["averaged_from"] = [str(p) for p in paths]
    save_model_checkpoint(out, first.model, first.vocabs, extra=extra)
    return first.model
