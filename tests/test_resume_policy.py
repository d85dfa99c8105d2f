"""``npformer train --resume``: options left out keep the checkpoint's values, changed options
are allowed only where npformer.cli.runs.RESUME_MAY_CHANGE says, and a resume with nothing left
to train, or one that would replace newer work, writes nothing."""
import numpy as np
import pytest

import npformer as nf

from npformer.cli.main import main
from npformer.cli.runs import RECORDED_OPTIONS, RESUME_MAY_CHANGE, recorded_options
from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.toy import toy_data
from npformer.training.trainer import TrainConfig
from npformer.training.translation import translation_trainer

TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--layers", "1", "--quiet"]


def train(out, *extra):
    return main(["train", "--dataset", "toy", "--out", str(out), *extra])


def small_model(data, **kw):
    """The one-layer, d_model 16 Transformer the library-run tests train on ``data``."""
    return nf.Transformer(len(data.vocabs.src), len(data.vocabs.tgt), d_model=16, n_heads=2,
                          d_ff=32, n_encoder_layers=1, n_decoder_layers=1, **kw)


def library_run(out, **config):
    """A small toy run trained through the library's Trainer (no recorded CLI options, as runs
    made before them or outside the CLI), for two updates."""
    data = toy_data(0)
    translation_trainer(small_model(data, max_len=32), data.vocabs, data.train, data.valid,
                        TrainConfig(max_steps=2, quiet=True, out_dir=str(out), **config)).fit()


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def error(capsys):
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def run(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, "--max-steps", "4", "--eval-every", "2", "--keep-last", "2",
                 "--schedule", "inverse_sqrt", *TINY) == 0
    capsys.readouterr()
    return out


def test_the_policy_covers_every_train_option():
    from npformer.cli.main import build_parser
    parser = build_parser()
    train_parser = parser._subparsers._group_actions[0].choices["train"]
    dests = {a.dest for a in train_parser._actions if a.dest != "help"}
    about_this_invocation = {"out", "resume", "overwrite", "quiet", "reduce"}
    assert dests - about_this_invocation == set(RECORDED_OPTIONS)
    assert set(RESUME_MAY_CHANGE) <= set(RECORDED_OPTIONS) | {"quiet"}


def test_resume_past_max_steps_is_refused_and_writes_nothing(run, capsys):
    before = snapshot(run)
    assert train(run, "--resume", str(run / "last"), "--max-steps", "3") == 1
    err = error(capsys)
    assert "--max-steps" in err and "already at step 4" in err
    assert train(run, "--resume", str(run / "last")) == 1       # the recorded max_steps 4: done
    assert "already at step 4" in error(capsys)
    assert snapshot(run) == before


def test_changed_numerics_are_refused_in_one_error_listing_each(run, capsys):
    before = snapshot(run)
    assert train(run, "--resume", str(run / "last"), "--max-steps", "6", "--lr", "0.01",
                 "--schedule", "cosine", "--dropout", "0.2", "--seed", "1", "--batch-size", "8") == 1
    err = error(capsys)
    for part in ("--lr 0.003 in the checkpoint, 0.01 given", "--schedule inverse_sqrt in the checkpoint, "
                 "cosine given", "--dropout 0.1 in the checkpoint, 0.2 given",
                 "--seed 0 in the checkpoint, 1 given", "--batch-size 64 in the checkpoint, 8 given"):
        assert part in err
    assert "--max-steps" not in err.split("A resume may change only")[0]
    assert snapshot(run) == before


def test_options_left_out_keep_the_checkpoints_and_the_run_is_bit_for_bit(tmp_path, run, capsys):
    straight = tmp_path / "straight"
    # (inverse_sqrt: the toy's cosine decays over --max-steps, so there a longer run differs)
    assert train(straight, "--max-steps", "6", "--eval-every", "2", "--keep-last", "2",
                 "--schedule", "inverse_sqrt", *TINY) == 0
    # no model option, no --eval-every: all come from the checkpoint; --quiet/--max-steps change
    assert train(run, "--resume", str(run / "last"), "--max-steps", "6", "--quiet") == 0
    a, b = load_model_checkpoint(run / "last"), load_model_checkpoint(straight / "last")
    assert a.model.config == b.model.config
    np.testing.assert_array_equal(a.model.flat_params, b.model.flat_params)
    assert a.meta["extra"]["options"]["max_steps"] == 6


def test_allowed_changes_are_accepted(run):
    assert train(run, "--resume", str(run / "last"), "--max-steps", "5", "--patience", "3",
                 "--keep-last", "3", "--eval-every", "1", *TINY) == 0
    assert load_model_checkpoint(run / "last").meta["training"]["config"]["patience"] == 3


def test_overwrite_of_the_resumed_run_is_refused(run, capsys):
    before = snapshot(run)
    assert train(run, "--resume", str(run / "last"), "--max-steps", "6", "--overwrite") == 1
    assert "--overwrite: would remove the run" in error(capsys)
    assert snapshot(run) == before


def test_resuming_an_older_checkpoint_over_a_newer_last_is_refused(run, tmp_path, capsys):
    before = snapshot(run)
    assert train(run, "--resume", str(run / "step_2"), "--max-steps", "6") == 1
    err = error(capsys)
    assert "step_2: is at step 2" in err and "is at step 4" in err
    assert snapshot(run) == before
    # into another folder it is a new branch of the run: fine
    assert train(tmp_path / "branch", "--resume", str(run / "step_2"), "--max-steps", "3") == 0


def test_resume_into_another_folder_holding_a_run_follows_the_folder_policy(run, tmp_path, capsys):
    other = tmp_path / "other"
    assert train(other, "--max-steps", "2", *TINY) == 0
    capsys.readouterr()
    assert train(other, "--resume", str(run / "last"), "--max-steps", "6") == 1
    assert "already holds a run" in error(capsys)


def test_checkpoints_without_recorded_options_are_checked_against_their_config(tmp_path, capsys):
    library_run(tmp_path / "old", lr=1e-3, schedule="constant")
    meta = load_model_checkpoint(tmp_path / "old" / "last").meta
    assert "extra" not in meta                   # as older runs were saved
    assert recorded_options(meta)["lr"] == 1e-3 and recorded_options(meta)["layers"] == 1
    assert train(tmp_path / "old", "--resume", str(tmp_path / "old" / "last"), "--max-steps", "4",
                 "--lr", "0.002") == 1
    assert "--lr 0.001 in the checkpoint, 0.002 given" in error(capsys)
    assert train(tmp_path / "old", "--resume", str(tmp_path / "old" / "last"), "--max-steps", "4",
                 "--quiet") == 0


def test_a_final_validation_between_scheduled_ones_does_not_change_early_stopping(tmp_path):
    """Stopped by max_steps mid-epoch, the final weights are validated once (so `best` exists),
    but that extra validation must not count towards --patience: resumed, the run stops at the
    same step, with the same weights, as the run that went straight through."""
    data = toy_data(seed=2, n_train=64, n_heldout=4, n_valid=8)

    def trainer(out, **kw):
        model = small_model(data, max_len=16, seed=0)
        config = TrainConfig(epochs=6, batch_size=16, patience=1, stop_metric="exact_match",
                             quiet=True, out_dir=str(out), **kw)
        return translation_trainer(model, data.vocabs, data.train, data.valid, config)

    straight = trainer(tmp_path / "straight")
    summary = straight.fit()
    assert summary["stop_reason"] == "early_stopping"

    first = trainer(tmp_path / "split", max_steps=2)      # 4 batches an epoch: stops mid-epoch
    assert first.fit()["stop_reason"] == "max_steps"
    assert (tmp_path / "split" / "best.npz").exists()
    resumed = trainer(tmp_path / "split").resume(str(tmp_path / "split" / "last"))
    again = resumed.fit()
    assert (again["stop_reason"], again["step"]) == ("early_stopping", summary["step"])
    np.testing.assert_array_equal(resumed.model.flat_params, straight.model.flat_params)


def test_a_resume_over_other_text_of_the_same_lengths_is_refused(tmp_path):
    """The batch sampler checks only the lengths of the pairs; the checkpoint also records a
    CRC of their token ids, so other text with the same line lengths cannot continue a run."""
    data = toy_data(seed=2, n_train=64, n_heldout=4, n_valid=8)

    def trainer(train_pairs):
        config = TrainConfig(epochs=2, max_steps=2, batch_size=16, quiet=True,
                             out_dir=str(tmp_path))
        return translation_trainer(small_model(data, max_len=16), data.vocabs, train_pairs,
                                   data.valid, config)

    trainer(data.train).fit()
    other = list(data.train)
    other[0] = (other[0][0], " ".join(reversed(other[0][1].split())))   # same length, other ids
    assert other[0] != data.train[0]
    with pytest.raises(ValueError, match="the translation task.s training or validation data differ from its run.s"):
        trainer(other).resume(str(tmp_path / "last"))
    trainer(data.train).resume(str(tmp_path / "last"))                 # the same data resumes


def test_the_inner_dropout_rates_are_recorded_and_fixed_for_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, "--max-steps", "2", "--dropout", "0.2", "--attention-dropout", "0",
                 "--activation-dropout", "0.05", *TINY) == 0
    config = load_model_checkpoint(out / "last").model.config
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.2, 0.0, 0.05)
    capsys.readouterr()
    assert train(out, "--resume", str(out / "last"), "--max-steps", "3",
                 "--attention-dropout", "0.1") == 1
    assert "--attention-dropout 0.0 in the checkpoint, 0.1 given" in error(capsys)


def test_runs_that_predate_the_inner_dropout_rates_used_their_one_rate():
    meta = {"extra": {"options": {"dataset": "toy", "dropout": 0.3, "lr": 1e-3}}}
    options = recorded_options(meta)
    assert options["attention_dropout"] == options["activation_dropout"] == 0.3
    meta = {"config": {"dropout": 0.2}, "training": {"config": {"lr": 1e-3}}}
    assert recorded_options(meta)["attention_dropout"] == 0.2


def test_inner_dropout_rates_left_out_are_recorded_as_the_rate_the_run_uses(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, "--max-steps", "2", "--dropout", "0.2", *TINY) == 0
    loaded = load_model_checkpoint(out / "last")
    assert loaded.meta["extra"]["options"]["attention_dropout"] == 0.2
    assert loaded.model.config.activation_dropout == 0.2
    # giving the rate it already uses is no change
    assert train(out, "--resume", str(out / "last"), "--max-steps", "3",
                 "--attention-dropout", "0.2") == 0


def test_the_bucket_size_is_recorded_and_fixed_for_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, "--max-steps", "2", "--bucket-size", "all", *TINY) == 0
    loaded = load_model_checkpoint(out / "last")
    assert loaded.meta["extra"]["options"]["bucket_size"] == "all"
    assert loaded.meta["training"]["config"]["bucket_size"] is None
    assert loaded.meta["training"]["sampler"]["bucket_size"] is None
    assert train(out, "--resume", str(out / "last"), "--max-steps", "3") == 0      # kept
    capsys.readouterr()
    assert train(out, "--resume", str(out / "last"), "--max-steps", "4",
                 "--bucket-size", "7") == 1
    assert "--bucket-size all in the checkpoint, 7 given" in error(capsys)
    for bad in ("0", "some"):
        with pytest.raises(SystemExit) as exit_:
            train(tmp_path / "x", "--bucket-size", bad, *TINY)
        assert exit_.value.code == 2
        assert f"--bucket-size: expected 'all' or a positive integer, got '{bad}'" in \
            capsys.readouterr().err


def test_runs_that_predate_the_bucket_size_used_1000():
    assert recorded_options({"extra": {"options": {"dataset": "toy"}}})["bucket_size"] == 1000
    assert recorded_options({"training": {"config": {"lr": 1e-3}}})["bucket_size"] == 1000
    assert recorded_options({"training": {"config": {"bucket_size": None}}})["bucket_size"] == "all"


def test_weight_decay_is_adamw_on_the_matrices_recorded_and_fixed_for_the_run(tmp_path, capsys):
    plain, decayed = tmp_path / "plain", tmp_path / "decayed"
    assert train(plain, "--max-steps", "1", *TINY) == 0
    assert train(decayed, "--max-steps", "1", "--weight-decay", "0.5", *TINY) == 0
    a, b = load_model_checkpoint(plain / "last"), load_model_checkpoint(decayed / "last")
    assert a.meta["training"]["config"]["optimizer"] == "adam"
    assert a.meta["extra"]["options"]["weight_decay"] == 0.0
    config = b.meta["training"]["config"]
    assert (config["optimizer"], config["weight_decay"], config["decay"]) == ("adamw", 0.5, "matrices")
    assert b.meta["extra"]["options"]["weight_decay"] == 0.5
    # after one update from the same initial weights and batch, decoupled decay on the matrices
    # only: every bias and LayerNorm parameter is the same bits, every matrix moved
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    assert any(p.data.ndim == 1 for p in pa.values())
    for name, p in pa.items():
        if p.data.ndim >= 2:
            assert not np.array_equal(p.data, pb[name].data), name
        else:
            np.testing.assert_array_equal(p.data, pb[name].data, err_msg=name)
    capsys.readouterr()
    assert train(decayed, "--resume", str(decayed / "last"), "--max-steps", "2",
                 "--weight-decay", "0.1") == 1
    assert "--weight-decay 0.5 in the checkpoint, 0.1 given" in error(capsys)
    assert train(decayed, "--resume", str(decayed / "last"), "--max-steps", "2") == 0
    resumed = load_model_checkpoint(decayed / "last").meta["training"]["config"]
    assert (resumed["optimizer"], resumed["weight_decay"]) == ("adamw", 0.5)


def test_runs_that_predate_weight_decay_used_none():
    assert recorded_options({"extra": {"options": {"dataset": "toy"}}})["weight_decay"] == 0.0
    assert recorded_options({"training": {"config": {"lr": 1e-3}}})["weight_decay"] == 0.0


@pytest.mark.parametrize("optimizer,decay", [("adam", "matrices"), ("adamw", "all")])
def test_a_library_run_with_an_optimizer_train_cannot_spell_is_refused(tmp_path, capsys,
                                                                       optimizer, decay):
    old = tmp_path / "old"
    library_run(old, optimizer=optimizer, weight_decay=0.01, decay=decay)
    before = snapshot(old)
    assert train(old, "--resume", str(old / "last"), "--max-steps", "4") == 1
    err = error(capsys)
    assert f"its run used {optimizer} with weight_decay 0.01 on {decay} parameters" in err
    assert snapshot(old) == before
