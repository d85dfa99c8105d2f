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


class WarmupCosineSchedule:
    """Linear warm-up to ``peak_lr``, then a half cosine down to ``min_lr`` at ``total_steps``
    (and ``min_lr`` after that)."""

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
        return self.min_lr + 0.5 * (self.peak_lr - self.min_lr) * (1.0 + math.cos(math.pi * progress))
