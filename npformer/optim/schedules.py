"""Learning-rate schedules: callables from step (1-based) to learning rate.

Use them by assigning before each step::

    schedule = nf.optim.NoamSchedule(d_model=512, warmup_steps=4000)
    opt.lr = schedule(opt.step_count + 1); opt.step()
"""
import math

from ..validation import check_real


def _check_positive(name, value):
    """``value`` must be a finite real number > 0 (NaN, inf, bools and strings are refused)."""
    check_real(name, value, minimum=0, min_open=True)


class NoamSchedule:
    """The paper's schedule: lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)."""

    def __init__(self, d_model, warmup_steps=4000, factor=1.0):
        _check_positive("d_model", d_model)
        _check_positive("warmup_steps", warmup_steps)
        _check_positive("factor", factor)
        self.d_model, self.warmup_steps, self.factor = d_model, warmup_steps, factor

    def __call__(self, step):
        step = max(step, 1)
        return self.factor * self.d_model ** -0.5 * min(step ** -0.5, step * self.warmup_steps ** -1.5)


class WarmupInverseSqrtSchedule:
    """Linear warm-up to ``peak_lr`` over ``warmup_steps``, then peak_lr * sqrt(warmup / step)."""

    def __init__(self, peak_lr, warmup_steps):
        _check_positive("peak_lr", peak_lr)
        _check_positive("warmup_steps", warmup_steps)
        self.peak_lr, self.warmup_steps = peak_lr, warmup_steps

    def __call__(self, step):
        step = max(step, 1)
        if step < self.warmup_steps:
            return self.peak_lr * step / self.warmup_steps
        return self.peak_lr * math.sqrt(self.warmup_steps / step)


class _WarmupDecaySchedule:
    """Linear warm-up from 0 to ``peak_lr`` over ``warmup_steps``, then a fall to ``min_lr`` at
    ``total_steps`` (and ``min_lr`` after that) along ``shape``: the fraction of the way from
    ``min_lr`` to ``peak_lr`` still left, as a function of the progress p in [0, 1]."""

    def __init__(self, peak_lr, warmup_steps, total_steps, min_lr=0.0):
        _check_positive("peak_lr", peak_lr)
        _check_positive("total_steps", total_steps)
        check_real("warmup_steps", warmup_steps, minimum=0)
        if warmup_steps > total_steps:
            raise ValueError(f"warmup_steps: expected at most total_steps={total_steps}, got {warmup_steps!r}")
        check_real("min_lr", min_lr, minimum=0)
        if min_lr > peak_lr:       # worded as TrainConfig's "min_lr: expected at most lr=..."
            raise ValueError(f"min_lr: expected at most peak_lr={peak_lr}, got {min_lr!r}")
        self.peak_lr, self.warmup_steps, self.total_steps, self.min_lr = (
            peak_lr, warmup_steps, total_steps, min_lr)

    def __call__(self, step):
        step = max(step, 1)
        if step < self.warmup_steps:
            return self.peak_lr * step / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr + (self.peak_lr - self.min_lr) * self.shape(progress)


class WarmupCosineSchedule(_WarmupDecaySchedule):
    """Linear warm-up to ``peak_lr``, then a half cosine down to ``min_lr`` at ``total_steps``
    (and ``min_lr`` after that)."""

    @staticmethod
    def shape(progress):
        return 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupLinearSchedule(_WarmupDecaySchedule):
    """Linear warm-up to ``peak_lr``, then a straight line down to ``min_lr`` at ``total_steps``
    (and ``min_lr`` after that). With ``min_lr=0`` its rate at update s is the one Hugging
    Face's ``get_linear_schedule_with_warmup`` gives after s scheduler steps. Against a cosine
    to the same end it runs below the cosine in the first half of the decay and above it in the
    second, still falling at full slope at the end, where the cosine flattens."""

    @staticmethod
    def shape(progress):
        return 1.0 - progress


class PlateauSchedule:
    """The learning rate falls by ``factor`` when a watched metric (the validation loss) stops
    improving: ``torch.optim.lr_scheduler.ReduceLROnPlateau``'s rule, step for step.

        schedule = PlateauSchedule(lr=5e-4, factor=0.1, patience=10)
        opt.lr = schedule(step)           # the current rate, whatever the step
        schedule.observe(valid_loss)      # after each validation

    ``observe(value)``: a value better than the best by more than ``threshold`` (relative to the
    best with ``threshold_mode="rel"``, absolute with ``"abs"``) resets the count of bad
    validations; after more than ``patience`` bad ones the rate becomes ``max(lr * factor,
    min_lr)`` (unless that changes it by ``eps`` or less), then ``cooldown`` validations pass
    uncounted. ``mode="min"`` watches a loss, ``"max"`` a score. ``state_dict`` holds what a
    resumed run needs to continue the same way.
    """

    def __init__(self, lr, factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                 cooldown=0, min_lr=0.0, eps=1e-8, mode="min"):
        _check_positive("lr", lr)
        check_real("factor", factor, minimum=0, maximum=1, min_open=True, max_open=True)
        check_real("patience", patience, minimum=0)
        check_real("threshold", threshold, minimum=0)
        check_real("cooldown", cooldown, minimum=0)
        check_real("min_lr", min_lr, minimum=0)
        check_real("eps", eps, minimum=0)
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"threshold_mode: expected 'rel' or 'abs', got {threshold_mode!r}")
        if mode not in ("min", "max"):
            raise ValueError(f"mode: expected 'min' or 'max', got {mode!r}")
        self.factor, self.patience, self.threshold = factor, patience, threshold
        self.threshold_mode, self.cooldown, self.min_lr, self.eps = (threshold_mode, cooldown,
                                                                      min_lr, eps)
        self.mode = mode
        self.lr = lr
        self.best = math.inf if mode == "min" else -math.inf
        self.bad, self.cooldown_left = 0, 0

    def __call__(self, step):
        return self.lr

    def _better(self, value):
        if self.mode == "min":
            bound = (self.best * (1.0 - self.threshold) if self.threshold_mode == "rel"
                     else self.best - self.threshold)
            return value < bound
        bound = (self.best * (1.0 + self.threshold) if self.threshold_mode == "rel"
                 else self.best + self.threshold)
        return value > bound

    def observe(self, value):
        """One validation's metric; returns the learning rate from now on."""
        value = float(value)
        if self._better(value):
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            self.bad = 0
        if self.bad > self.patience:
            new = max(self.lr * self.factor, self.min_lr)
            if self.lr - new > self.eps:
                self.lr = new
            self.cooldown_left, self.bad = self.cooldown, 0
        return self.lr

    def state_dict(self):
        return {"lr": self.lr, "best": self.best if math.isfinite(self.best) else None,
                "bad": self.bad, "cooldown_left": self.cooldown_left}

    def load_state_dict(self, state):
        best = state["best"]
        self.lr = float(state["lr"])
        self.best = (math.inf if self.mode == "min" else -math.inf) if best is None else float(best)
        self.bad, self.cooldown_left = int(state["bad"]), int(state["cooldown_left"])


class WarpedSchedule:
    """A schedule whose rest, from update ``start`` on, is stretched by ``factor`` for each
    ``[start, factor]`` of ``warps`` (in the order they were made): update s > start reads the
    rate the schedule had at start + (s - start) * factor. The Trainer stretches a cosine or
    linear decay this way when a run resumes on another number of data-parallel processes (an
    epoch then holds another number of updates), so that it still ends at min_lr with the last
    update."""

    def __init__(self, schedule, warps):
        self.schedule, self.warps = schedule, warps

    def __call__(self, step):
        for start, factor in reversed(self.warps):       # the latest stretch is the outermost
            if step > start:
                step = start + (step - start) * factor
        return self.schedule(step)

    @staticmethod
    def unwarp(step, warps):
        """The update at which the warped schedule reads the schedule's update ``step``."""
        for start, factor in warps:
            if step > start:
                step = start + (step - start) / factor
        return step
