"""Optimizers, learning-rate schedules and gradient clipping."""
from .adam import Adam, AdamW, matrices_only
from .clip import clip_grad_norm, grad_norm
from .schedules import (NoamSchedule, PlateauSchedule, WarmupCosineSchedule,
                        WarmupInverseSqrtSchedule, WarmupLinearSchedule)

__all__ = ["Adam", "AdamW", "NoamSchedule", "PlateauSchedule", "WarmupCosineSchedule",
           "WarmupInverseSqrtSchedule", "WarmupLinearSchedule", "clip_grad_norm", "grad_norm",
           "matrices_only"]
