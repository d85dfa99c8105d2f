"""Early stopping on a validation metric."""
import math

from ..validation import check_int


class EarlyStopping:
    """Stop after ``patience`` evaluations without an improvement of more than ``min_delta``.

    ``mode="max"`` for metrics such as exact match or BLEU, ``"min"`` for a loss.
    ``step(value)`` returns True if ``value`` is a new best (the caller keeps that checkpoint).
    """

    def __init__(self, patience=None, mode="max", min_delta=0.0):
        if mode not in ("max", "min"):
            raise ValueError(f"mode: expected 'max' or 'min', got {mode!r}")
        patience = check_int("patience", patience, allow_none=True)
        self.patience, self.mode, self.min_delta = patience, mode, min_delta
        self.best = -math.inf if mode == "max" else math.inf
        self.bad_evals = 0

    def better(self, value, than):
        """Is ``value`` an improvement on ``than`` (by more than ``min_delta``)?"""
        return (value > than + self.min_delta if self.mode == "max"
                else value < than - self.min_delta)

    def step(self, value):
        better = self.better(value, self.best)
        if better:
            self.best, self.bad_evals = value, 0
        else:
            self.bad_evals += 1
        return better

    @property
    def should_stop(self):
        return self.patience is not None and self.bad_evals >= self.patience

    def state_dict(self):
        return {"best": self.best if math.isfinite(self.best) else None, "bad_evals": self.bad_evals}

    def load_state_dict(self, d):
        best = d.get("best")
        self.best = (-math.inf if self.mode == "max" else math.inf) if best is None else float(best)
        self.bad_evals = int(d.get("bad_evals", 0))
