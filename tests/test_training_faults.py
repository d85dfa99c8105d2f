"""Faults in training: bad TrainConfig numbers, a non-finite loss, a run with nothing left to
train, and the final validation that makes ``best`` exist however training stops."""
import math

import numpy as np
import pytest

import npformer as nf
from npformer.cli.main import main
from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.metrics_log import read_metrics_log
from npformer.training.toy import toy_data
from npformer.training.trainer import TrainConfig, TrainingDiverged
from npformer.training.translation import translation_trainer


@pytest.fixture(scope="module")
def data():
    return toy_data(seed=1, n_train=64, n_heldout=4, n_valid=8)


def make_trainer(data, **cfg):
    model = nf.Transformer(len(data.vocabs.src), len(data.vocabs.tgt), d_model=16, n_heads=2,
                           d_ff=32, n_encoder_layers=1, n_decoder_layers=1, max_len=16, seed=0)
    config = TrainConfig(**{"batch_size": 16, "lr": 3e-3, "warmup_steps": 2, "quiet": True, **cfg})
    return translation_trainer(model, data.vocabs, data.train, data.valid, config)


@pytest.mark.parametrize("field,value", [
    ("lr", math.nan), ("lr", math.inf), ("lr", 0.0), ("lr", -1.0), ("lr", "0.1"),
    ("min_lr", -1.0), ("min_lr", math.nan), ("min_lr", math.inf),
    ("clip_norm", 0.0), ("clip_norm", -1.0), ("clip_norm", math.nan), ("clip_norm", math.inf),
    ("weight_decay", -0.1), ("weight_decay", math.nan),
    ("betas", (1.0, 0.98)), ("betas", (0.9,)), ("betas", (0.9, math.nan)),
    ("label_smoothing", math.nan), ("time_budget", math.inf), ("time_budget", 0),
    ("target", math.nan),
])
def test_train_config_refuses_non_finite_and_out_of_range_numbers(field, value):
    with pytest.raises(ValueError, match=f"^{field}: expected"):
        TrainConfig(**{field: value})


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_min_lr_above_lr_is_refused_for_the_schedules_that_fall_to_it_only(schedule):
    with pytest.raises(ValueError, match=f"min_lr: expected at most lr=0.001 \\(the {schedule} "):
        TrainConfig(lr=1e-3, min_lr=1e-2, schedule=schedule)
    TrainConfig(lr=1e-3, min_lr=1e-2, schedule="constant")       # min_lr is not used there


def test_a_non_finite_loss_stops_training_and_saves_nothing_from_it(data, tmp_path):
    trainer = make_trainer(data, max_steps=2, out_dir=str(tmp_path))
    trainer.fit()
    good = (tmp_path / "last.npz").read_bytes()
    trainer.config.max_steps = 5
    trainer.model.flat_params[0] = np.nan        # the next forward pass gives a NaN loss
    with pytest.raises(TrainingDiverged, match=r"^task 'translation', step 3: the training loss is nan.*step 2"):
        trainer.fit()
    assert trainer.step == 2                     # the bad update was not applied
    assert (tmp_path / "last.npz").read_bytes() == good
    assert read_metrics_log(tmp_path / "metrics.jsonl")[-1]["stop_reason"] == "non_finite"


def test_the_gradient_norm_is_measured_without_clipping(data):
    trainer = make_trainer(data, max_steps=1, clip_norm=None)
    trainer.fit()
    assert trainer.grad_norm is not None and math.isfinite(trainer.grad_norm) and trainer.grad_norm > 0


def test_non_finite_weights_are_never_saved(data, tmp_path):
    trainer = make_trainer(data, max_steps=1)
    trainer.model.flat_params[3] = np.inf
    with pytest.raises(TrainingDiverged, match="non-finite"):
        trainer.save(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt.npz").exists()


def test_cli_exits_non_zero_naming_the_step_on_divergence(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "toy", "--out", str(out), "--lr", "1e30", "--schedule",
                 "constant", "--max-steps", "20", "--d-model", "16", "--n-heads", "2", "--d-ff",
                 "32", "--layers", "1", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("npformer train: error: task 'translation', step ") and "loss is" in err
    assert not (out / "last.npz").exists()


def test_max_steps_inside_an_epoch_still_validates_and_writes_best(data, tmp_path):
    trainer = make_trainer(data, max_steps=2, out_dir=str(tmp_path))  # 4 batches an epoch
    summary = trainer.fit()
    assert summary["stop_reason"] == "max_steps" and len(trainer.history) == 1
    assert trainer.history[0]["step"] == 2
    assert load_model_checkpoint(tmp_path / "best").meta["training"]["step"] == 2


def test_a_run_with_nothing_left_to_train_is_refused_before_writing(data, tmp_path):
    first = make_trainer(data, max_steps=3, out_dir=str(tmp_path))
    first.fit()
    log = (tmp_path / "metrics.jsonl").read_bytes()
    again = make_trainer(data, max_steps=3, out_dir=str(tmp_path))
    again.resume(tmp_path / "last")
    with pytest.raises(ValueError, match=r"max_steps 3 \(--max-steps\): the run is already at step 3"):
        again.fit()
    assert (tmp_path / "metrics.jsonl").read_bytes() == log
    done = make_trainer(data, epochs=1, out_dir=str(tmp_path / "e"))
    done.fit()
    with pytest.raises(ValueError, match="epochs 1"):
        done.fit()

