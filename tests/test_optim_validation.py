"""Learning rates and optimizer settings are checked where they are set: a negative or non-finite
learning rate never reaches the weights, whether it comes from the constructor, a schedule or an
assignment to ``opt.lr`` before ``step()``."""
import math

import numpy as np
import pytest

import npformer as nf
from npformer.optim import (Adam, AdamW, NoamSchedule, WarmupCosineSchedule,
                            WarmupInverseSqrtSchedule, WarmupLinearSchedule, clip_grad_norm)

BAD_LR = [float("nan"), float("inf"), -float("inf"), -5.0, -1e-12, "1e-3", None, True]


@pytest.fixture
def model():
    return nf.Transformer(10, 12, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                          n_decoder_layers=1, max_len=6)


@pytest.mark.parametrize("cls", [Adam, AdamW])
@pytest.mark.parametrize("lr", BAD_LR)
def test_constructor_refuses_bad_lr(model, cls, lr):
    with pytest.raises(ValueError, match=r"lr: expected a finite number >= 0, got"):
        cls(model, lr=lr)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("lr", BAD_LR)
def test_assigning_bad_lr_before_step_leaves_weights_untouched(model, backend, lr):
    """The issue's case: `opt.lr = nan` (or -5) before step() wrote NaN into every weight."""
    previous = nf.get_backend()
    nf.set_backend(backend)
    try:
        opt = Adam(model, lr=1e-3)
        model.flat_grads[:] = 1.0
        before = model.flat_params.copy()
        with pytest.raises(ValueError, match="lr: expected a finite number >= 0"):
            opt.lr = lr
        assert opt.lr == 1e-3                     # the last good value stays
        opt.step()
        assert np.all(np.isfinite(model.flat_params))
        assert not np.array_equal(model.flat_params, before)
    finally:
        nf.set_backend(previous)


def test_zero_lr_is_allowed(model):
    opt = Adam(model, lr=0.0)
    opt.lr = 0                                    # a schedule at its very first step may give 0
    assert opt.lr == 0.0


@pytest.mark.parametrize("kwargs,match", [
    (dict(betas=(0.9, float("nan"))), r"betas: expected two numbers in \[0, 1\)"),
    (dict(betas=(1.0, 0.999)), r"betas: expected two numbers in \[0, 1\)"),
    (dict(betas=(0.9,)), r"betas: expected two numbers in \[0, 1\)"),
    (dict(betas=0.9), r"betas: expected two numbers in \[0, 1\)"),
    (dict(betas=("0.9", 0.999)), r"betas: expected two numbers in \[0, 1\)"),   # as check_real: no str
    (dict(betas=(0.9, 0.99, 0.999)), r"betas: expected two numbers in \[0, 1\)"),
    (dict(eps=float("nan")), r"eps: expected a finite number >= 0, got nan"),
    (dict(eps=-1e-8), r"eps: expected a finite number >= 0"),
    (dict(weight_decay=float("inf")), r"weight_decay: expected a finite number >= 0, got inf"),
    (dict(weight_decay=-0.1), r"weight_decay: expected a finite number >= 0"),
])
def test_other_settings_are_checked(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdamW(model, **kwargs)


def test_step_count_of_a_loaded_state_is_checked(model):
    opt = Adam(model)
    state = opt.state_dict()
    for bad in (np.array(-1), np.array(2.5), np.array([1, 2])):
        with pytest.raises(ValueError, match="step_count' expected a non-negative integer scalar"):
            opt.load_state_dict({**state, "step_count": bad})


@pytest.mark.parametrize("make,match", [
    (lambda: NoamSchedule(0), r"d_model: expected a finite positive number, got 0"),
    (lambda: NoamSchedule(64, warmup_steps=float("nan")), r"warmup_steps: expected a finite positive"),
    (lambda: NoamSchedule(64, factor=-1.0), r"factor: expected a finite positive number, got -1.0"),
    (lambda: NoamSchedule(64, factor=float("inf")), r"factor: expected a finite positive number"),
    (lambda: WarmupInverseSqrtSchedule(float("nan"), 10), r"peak_lr: expected a finite positive"),
    (lambda: WarmupInverseSqrtSchedule(1e-3, 0), r"warmup_steps: expected a finite positive"),
    (lambda: WarmupCosineSchedule(1e-3, 10, 100, min_lr=-1.0),
     r"min_lr: expected a finite number >= 0, got -1.0"),
    (lambda: WarmupCosineSchedule(1e-3, 10, 100, min_lr=1.0), r"min_lr: expected at most peak_lr=0.001, got 1.0"),
    (lambda: WarmupCosineSchedule(1e-3, 200, 100), r"warmup_steps: expected at most total_steps=100, got 200"),
    (lambda: WarmupCosineSchedule(1e-3, -1, 100), r"warmup_steps: expected a finite number >= 0, got -1"),
    (lambda: WarmupCosineSchedule(1e-3, "10", 100), r"warmup_steps: expected a finite number >= 0, got '10'"),
    (lambda: WarmupCosineSchedule(1e-3, 10, 100, min_lr=float("nan")), r"min_lr: expected a finite"),
    (lambda: WarmupCosineSchedule(1e-3, 10, float("inf")), r"total_steps: expected a finite positive"),
    (lambda: WarmupLinearSchedule(1e-3, 10, 100, min_lr=1.0), r"min_lr: expected at most peak_lr=0.001, got 1.0"),
    (lambda: WarmupLinearSchedule(1e-3, 200, 100), r"warmup_steps: expected at most total_steps=100, got 200"),
    (lambda: WarmupLinearSchedule(0.0, 10, 100), r"peak_lr: expected a finite positive number, got 0.0"),
])
def test_schedules_refuse_bad_settings(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("schedule", [WarmupCosineSchedule, WarmupLinearSchedule])
def test_decay_schedules_never_go_negative(schedule):
    s = schedule(1e-3, 10, 100, min_lr=0.0)
    assert min(s(step) for step in range(1, 300)) >= 0.0


@pytest.mark.parametrize("max_norm", [float("nan"), float("inf"), 0.0, -1.0, "1", None])
def test_clip_grad_norm_refuses_bad_max_norm(model, max_norm):
    with pytest.raises(ValueError, match=r"max_norm: expected a finite positive number"):
        clip_grad_norm(model, max_norm)


def test_clip_grad_norm_reports_a_non_finite_norm(model):
    model.flat_grads[:] = 0.0
    model.flat_grads[3] = np.inf
    assert math.isinf(clip_grad_norm(model, 1.0))
    model.flat_grads[3] = np.nan
    assert math.isnan(clip_grad_norm(model, 1.0))
