"""A run's checkpointed training state, checked before a resume restores anything
(:func:`check_training_state`), and the ``step_<N>`` checkpoints a run keeps
(:func:`step_checkpoints`)."""
import glob
import os
import re
from dataclasses import fields

from ..validation import check_int, check_real
from .train_config import TrainConfig


# the scalar fields of a checkpoint's training state: (where, check, bounds)
_STATE_SCALARS = (("step", check_int, dict(minimum=0)), ("epoch", check_int, dict(minimum=0)),
                  ("seconds", check_real, dict(minimum=0)),
                  ("best_value", check_real, dict(allow_none=True)),
                  ("world_size", check_int, dict(minimum=1)),
                  ("total_steps", check_int, dict(minimum=1)),
                  ("data_crc32", check_int, dict(minimum=0, allow_none=True)),
                  ("early_stopping.best", check_real, dict(allow_none=True)),
                  ("early_stopping.bad_evals", check_int, dict(minimum=0)),
                  ("schedule.lr", check_real, dict(minimum=0)),        # the plateau schedule's
                  ("schedule.best", check_real, dict(allow_none=True)),
                  ("schedule.bad", check_int, dict(minimum=0)),
                  ("schedule.cooldown_left", check_int, dict(minimum=0)))


def check_training_state(training, name):
    """The ``training`` metadata of checkpoint ``name`` as ``Trainer.training_state`` writes it,
    or ValueError naming the field: the run's ``step``, ``epoch``, ``sampler`` and ``config``
    present, counters integers in range, times, losses and rates finite, ``schedule_warps``
    [step, factor > 0] pairs, ``config`` a valid ``TrainConfig``. Fields that older checkpoints
    lack (``world_size``, ``total_steps``, ...) may be absent. ``Trainer.resume`` calls it
    before anything is restored."""
    where = f"checkpoint {name}: training"
    if training is None:                         # an inference-only file (save_model_checkpoint)
        raise ValueError(f"checkpoint {name}: holds no training or optimizer state (saved for "
                         f"inference only?), cannot resume training from it")
    if not isinstance(training, dict):
        raise ValueError(f"{where}: expected the run's training state (a dict), got "
                         f"{training!r:.60}")
    for key in ("step", "epoch", "sampler", "config"):
        if key not in training:
            raise ValueError(f"{where}.{key}: missing; without it a resume would not continue "
                             f"the run but start over from defaults (Trainer.save writes it)")
    for key in ("early_stopping", "schedule", "config"):
        if not isinstance(training.get(key, {}), dict):
            raise ValueError(f"{where}.{key}: expected a dict, got {training[key]!r:.60}")
    for key, check, bounds in _STATE_SCALARS:
        group, _, field = key.rpartition(".")
        values = training.get(group, {}) if group else training
        if field in values or (group == "schedule" and values):   # a plateau state is whole
            check(f"{where}.{key}", values.get(field), **bounds)
    warps = training.get("schedule_warps", [])
    if not (isinstance(warps, list) and all(isinstance(w, list) and len(w) == 2 for w in warps)):
        raise ValueError(f"{where}.schedule_warps: expected a list of [step, factor] pairs, got "
                         f"{warps!r:.60}")
    for n, (start, factor) in enumerate(warps):
        check_int(f"{where}.schedule_warps[{n}][0]", start, minimum=0)
        check_real(f"{where}.schedule_warps[{n}][1]", factor, minimum=0, min_open=True)
    known = {f.name for f in fields(TrainConfig)}
    try:
        TrainConfig(**{k: v for k, v in training["config"].items() if k in known})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}.config: {e}") from None
    return training


def step_checkpoints(out_dir):
    """The ``step_<N>`` checkpoints (paths without suffix) in ``out_dir``, by step."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(os.fspath(out_dir)), "step_*.npz")):
        m = re.fullmatch(r"step_(\d+)\.npz", os.path.basename(path))
        if m:
            found.append((int(m.group(1)), path[:-4]))
    return [p for _, p in sorted(found)]
