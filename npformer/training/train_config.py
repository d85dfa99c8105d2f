"""A training run's configuration: ``TrainConfig`` (every field checked on construction) and
the learning-rate schedule it names (:func:`make_schedule`)."""
import math
from dataclasses import dataclass, fields

from ..optim import (NoamSchedule, PlateauSchedule, WarmupCosineSchedule,
                     WarmupInverseSqrtSchedule, WarmupLinearSchedule, matrices_only)
from ..optim.adam import check_betas
from ..validation import check_int, check_real

SCHEDULES = ("inverse_sqrt", "cosine", "linear", "noam", "constant", "plateau")
# the schedules that fall from lr to min_lr over the whole run, by TrainConfig.schedule name
SPANNING_SCHEDULES = {"cosine": WarmupCosineSchedule, "linear": WarmupLinearSchedule}
SPANNING = tuple(SPANNING_SCHEDULES)
DECAY = {"all": None, "matrices": matrices_only}      # TrainConfig.decay -> Adam's decay=


@dataclass
class TrainConfig:
    epochs: int = 10
    max_steps: int = None            # stop after this many optimizer steps (overrides epochs)
    batch_size: int = 64
    lr: float = 2e-3                 # peak learning rate
    warmup_steps: int = 100
    schedule: str = "inverse_sqrt"
    min_lr: float = 0.0              # cosine, linear and plateau
    plateau_factor: float = 0.1      # plateau: ReduceLROnPlateau's factor, patience, threshold,
    plateau_patience: int = 10       # cooldown (in validations), on the validation loss
    plateau_threshold: float = 1e-4
    plateau_cooldown: int = 0
    optimizer: str = "adam"          # or "adamw"
    betas: tuple = (0.9, 0.98)
    weight_decay: float = 0.0
    decay: str = "all"               # the parameters weight decay applies to: "all", or
                                     # "matrices" (weights and embeddings, not biases or norms)
    label_smoothing: float = 0.1
    clip_norm: float = 1.0           # None: no clipping
    seed: int = 0                    # batch order
    eval_every: int = 1              # validate every N epochs
    stop_metric: str = None          # one of the task's metrics (None: its first)
    patience: int = None             # early stopping after N validations without improvement
    target: float = None             # stop as soon as the validation metric reaches this value
    log_every: int = 10              # steps between "train" records of the metrics log
    out_dir: str = None              # best/last checkpoints and metrics.jsonl go here
    quiet: bool = False
    max_tokens: int = None           # batch by padded tokens (src + tgt) instead of batch_size
    bucket_size: int = 1000          # examples sorted by length together before batching (None:
                                     # the whole set, fairseq's order; see data.BatchSampler)
    # batch_size, max_tokens, bucket_size and label_smoothing are the task's knobs: a recipe
    # hands them to it
    accum_steps: int = 1             # batches whose gradients are summed before one update
    eval_every_steps: int = None     # also validate every N optimizer steps (inside epochs)
    time_budget: float = None        # seconds: stop training (then validate once) after this
    keep_last: int = None            # keep the last N step_<N> checkpoints (for averaging): one per
                                     # validation, or per save_every_* where given
    save_every_steps: int = None     # also checkpoint step_<N> every N updates, without validating
    save_every_epochs: int = None    # ... and at the end of every N epochs

    def __post_init__(self):
        for name in ("epochs", "batch_size", "eval_every", "log_every", "accum_steps"):
            setattr(self, name, check_int(name, getattr(self, name)))
        for name in ("max_steps", "max_tokens", "bucket_size", "eval_every_steps", "keep_last",
                     "save_every_steps", "save_every_epochs"):
            setattr(self, name, check_int(name, getattr(self, name), allow_none=True))
        self.warmup_steps = check_int("warmup_steps", self.warmup_steps, minimum=0)
        self.seed = check_int("seed", self.seed, minimum=0)
        self.time_budget = check_real("time_budget", self.time_budget, minimum=0, min_open=True,
                                      allow_none=True)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {self.schedule!r}")
        self.lr = check_real("lr", self.lr, minimum=0, min_open=True)
        self.min_lr = check_real("min_lr", self.min_lr, minimum=0)
        self.plateau_factor = check_real("plateau_factor", self.plateau_factor, minimum=0,
                                         maximum=1, min_open=True, max_open=True)
        self.plateau_patience = check_int("plateau_patience", self.plateau_patience, minimum=0)
        self.plateau_threshold = check_real("plateau_threshold", self.plateau_threshold, minimum=0)
        self.plateau_cooldown = check_int("plateau_cooldown", self.plateau_cooldown, minimum=0)
        if self.schedule in SPANNING and self.min_lr > self.lr:         # they fall lr -> min_lr
            raise ValueError(f"min_lr: expected at most lr={self.lr!r} (the {self.schedule} "
                             f"schedule falls from lr to min_lr), got {self.min_lr!r}")
        self.clip_norm = check_real("clip_norm", self.clip_norm, minimum=0, min_open=True,
                                    allow_none=True)             # None: no clipping
        self.weight_decay = check_real("weight_decay", self.weight_decay, minimum=0)
        if self.decay not in DECAY:
            raise ValueError(f"decay: expected one of {tuple(DECAY)}, got {self.decay!r}")
        self.betas = check_betas(self.betas)
        self.target = check_real("target", self.target, allow_none=True)
        if self.optimizer not in ("adam", "adamw"):
            raise ValueError(f"optimizer: expected 'adam' or 'adamw', got {self.optimizer!r}")
        if self.stop_metric is not None and not isinstance(self.stop_metric, str):
            raise ValueError(f"stop_metric: expected a metric's name, got {self.stop_metric!r}")
        self.label_smoothing = check_real("label_smoothing", self.label_smoothing, minimum=0,
                                          maximum=1, max_open=True)

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


def make_schedule(config, total_steps):
    if config.schedule == "inverse_sqrt":
        return WarmupInverseSqrtSchedule(config.lr, max(1, config.warmup_steps))
    if config.schedule in SPANNING:
        return SPANNING_SCHEDULES[config.schedule](config.lr, min(config.warmup_steps, total_steps),
                                                   total_steps, config.min_lr)
    if config.schedule == "plateau":     # the rate falls when the validation loss stops falling
        return PlateauSchedule(config.lr, config.plateau_factor, config.plateau_patience,
                               config.plateau_threshold, cooldown=config.plateau_cooldown,
                               min_lr=config.min_lr)
    if config.schedule == "noam":        # the paper's shape, scaled so that the peak (at warm-up) is lr
        warmup = max(1, config.warmup_steps)
        return NoamSchedule(1.0, warmup, config.lr * math.sqrt(warmup))
    return lambda step: config.lr
