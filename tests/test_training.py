"""Trainer: bit-exact resume, early stopping, best checkpoints, metrics, checkpoint errors."""
import numpy as np
import pytest

import npformer as nf
from npformer.checkpoint import CheckpointError
from npformer.data.vocab import Vocab, Vocabularies
from npformer.training.checkpointing import (check_compatible, load_model_checkpoint,
                                             save_model_checkpoint)
from npformer.training.early_stopping import EarlyStopping
from npformer.training.metrics import corpus_bleu, exact_match
from npformer.training.metrics_log import MetricsLog, read_metrics_log
from npformer.training.toy import toy_data
from npformer.training.trainer import TrainConfig
from npformer.training.translation import translation_trainer


@pytest.fixture(scope="module")
def data():
    return toy_data(seed=1, n_train=120, n_heldout=10, n_valid=16)


def tiny_model(data, seed=0, **kw):
    return nf.Transformer(len(data.vocabs.src), len(data.vocabs.tgt), d_model=16, n_heads=2, d_ff=32,
                          n_encoder_layers=1, n_decoder_layers=1, dropout=0.1, max_len=16,
                          seed=seed, **kw)


def make_trainer(data, **cfg):
    config = TrainConfig(**{"batch_size": 16, "lr": 3e-3, "warmup_steps": 4, "quiet": True,
                            "log_every": 2, **cfg})
    return translation_trainer(tiny_model(data), data.vocabs, data.train, data.valid, config)


def test_resume_is_bit_for_bit(tmp_path, data):
    n, m = 5, 7                            # 8 batches an epoch: the resumed part crosses an epoch
    straight = make_trainer(data, max_steps=n + m, epochs=5)
    straight.fit()

    first = make_trainer(data, max_steps=n, epochs=5)
    first.fit()
    first.save(tmp_path / "ckpt")
    resumed = make_trainer(data, max_steps=n + m, epochs=5)
    resumed.resume(tmp_path / "ckpt")
    assert resumed.step == n
    resumed.fit()

    assert resumed.step == straight.step == n + m
    assert np.array_equal(resumed.model.flat_params, straight.model.flat_params)
    for key in ("exp_avg", "exp_avg_sq"):
        assert np.array_equal(resumed.optimizer.state_dict()[key], straight.optimizer.state_dict()[key])
    assert resumed.optimizer.step_count == straight.optimizer.step_count
    assert resumed.model.rng.bit_generator.state == straight.model.rng.bit_generator.state
    assert resumed.task.state_dict() == straight.task.state_dict()
    # and the run did move: resuming from scratch would not give the same weights
    assert not np.array_equal(first.model.flat_params, straight.model.flat_params)


def test_fit_writes_metrics_log_best_and_last_and_early_stops(tmp_path, data):
    # a learning rate so small that exact match stays 0: the 2nd validation is no improvement
    trainer = make_trainer(data, epochs=6, lr=1e-9, schedule="constant", patience=1,
                           out_dir=str(tmp_path))
    summary = trainer.fit()
    assert summary["stop_reason"] == "early_stopping" and summary["epoch"] == 2
    records = read_metrics_log(tmp_path / "metrics.jsonl")
    events = [r["event"] for r in records]
    assert events.count("eval") == 2 and events[-1] == "end" and "train" in events
    train_rec = next(r for r in records if r["event"] == "train")
    assert {"loss", "lr", "tokens_per_s", "step"} <= set(train_rec)
    best = load_model_checkpoint(tmp_path / "best")
    last = load_model_checkpoint(tmp_path / "last")
    steps_per_epoch = trainer.task.batches_per_epoch()
    assert best.meta["training"]["step"] == steps_per_epoch           # kept from epoch 1
    assert last.meta["training"]["step"] == 2 * steps_per_epoch


def test_training_reduces_loss_and_target_stops(data):
    trainer = make_trainer(data, epochs=30, lr=1e-2, warmup_steps=8, target=0.0)
    summary = trainer.fit()
    assert summary["stop_reason"] == "target" and summary["epoch"] == 1
    trainer = make_trainer(data, epochs=6, lr=1e-2, warmup_steps=8)
    trainer.model.eval()                         # (fit puts it back in training mode)
    before = trainer.task.evaluate(trainer.model, data.train[:32])["loss"]
    trainer.fit()
    after = trainer.task.evaluate(trainer.model, data.train[:32])["loss"]
    assert after < 0.8 * before


def test_train_config_rejects_bad_values():
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match=r"schedule: expected one of \(.*'linear'.*\), got 'step'"):
        TrainConfig(schedule="step")
    with pytest.raises(ValueError, match="label_smoothing"):
        TrainConfig(label_smoothing=1.5)


def test_trainer_and_checkpoints_take_the_vocabularies_as_one_value(tmp_path, data):
    with pytest.raises(ValueError, match="vocabs: expected a Vocabularies"):
        translation_trainer(tiny_model(data), data.vocabs.src, data.train, data.valid, TrainConfig(quiet=True))
    wrong = Vocabularies(data.vocabs.tgt, data.vocabs.src)      # the sides swapped
    with pytest.raises(ValueError, match="src vocabulary has"):
        save_model_checkpoint(tmp_path / "x", tiny_model(data), wrong)
    assert not (tmp_path / "x.npz").exists()


def test_trainer_rejects_too_long_pairs(data):
    with pytest.raises(ValueError, match=r"train_pairs\[1\].*max_len=16"):
        translation_trainer(tiny_model(data), data.vocabs,
                [data.train[0], (" ".join(["我"] * 20), "i")], None, TrainConfig(quiet=True))


def test_metrics():
    assert exact_match(["a b", "c"], ["a  b", "d"]) == 0.5
    assert corpus_bleu(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(100.0)
    assert corpus_bleu(["x y z w"], ["a b c d"]) == pytest.approx(0.0)


def test_corpus_bleu_of_tokenised_text_says_nothing(capfd):
    """tokenize="none" means the text is tokenised on purpose: sacrebleu's warning about lines
    ending in a tokenised period (once per validation, in every training log) is not printed."""
    lines = [f"sentence {i} ends here ." for i in range(120)]
    assert corpus_bleu(lines, lines) == pytest.approx(100.0)
    out, err = capfd.readouterr()
    assert "tokenized period" not in out + err
    with pytest.raises(ValueError, match="same number"):
        exact_match(["a"], ["a", "b"])


def test_metrics_log_roundtrip_and_broken_line(tmp_path):
    path = tmp_path / "m.jsonl"
    with MetricsLog(path) as log:
        log.log("train", step=1, loss=2.5)
        log.log("eval", step=1, loss=float("nan"))
    records = read_metrics_log(path)
    assert [r["event"] for r in records] == ["train", "eval"] and records[0]["loss"] == 2.5
    with open(path, "a") as f:
        f.write("{not json\n")
    with pytest.raises(ValueError, match=r"m.jsonl:3"):
        read_metrics_log(path)


def test_early_stopping():
    es = EarlyStopping(patience=2, mode="min")
    assert es.step(1.0) and not es.step(1.5) and not es.should_stop
    assert not es.step(1.2) and es.should_stop
    assert es.step(0.5) and not es.should_stop


def test_checkpoint_errors_name_the_file(tmp_path, data):
    model = tiny_model(data)
    path = tmp_path / "ckpt"
    save_model_checkpoint(path, model, data.vocabs)
    loaded = load_model_checkpoint(path)
    assert np.array_equal(loaded.model.flat_params, model.flat_params)
    assert loaded.vocabs.src == data.vocabs.src and not loaded.model.training

    with pytest.raises(CheckpointError, match=r"nope\.npz"):
        load_model_checkpoint(tmp_path / "nope")
    npz = tmp_path / "ckpt.npz"
    raw = npz.read_bytes()
    npz.write_bytes(raw[: len(raw) // 2])                            # truncated
    with pytest.raises(CheckpointError, match="ckpt.npz"):
        load_model_checkpoint(path)
    npz.write_bytes(raw[:100] + bytes([raw[100] ^ 0xFF]) + raw[101:])  # one flipped byte
    with pytest.raises(CheckpointError, match="ckpt.npz"):
        load_model_checkpoint(path)


def test_mismatched_config_or_vocabulary_is_a_clear_error(tmp_path, data):
    trainer = make_trainer(data, max_steps=1)
    trainer.fit()
    trainer.save(tmp_path / "ckpt")
    loaded = load_model_checkpoint(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match=r"config d_model: checkpoint has 16, expected 32"):
        check_compatible(loaded, loaded.model.config.replace(d_model=32))
    other = Vocab(data.vocabs.tgt.tokens + ["zebra"])
    with pytest.raises(CheckpointError, match=r"tgt vocabulary differs.*zebra"):
        check_compatible(loaded, vocabs=Vocabularies(data.vocabs.src, other))
    with pytest.raises(CheckpointError, match=r"vocabularies differ: the checkpoint holds a "
                                              r"source and a target vocabulary, expected one joint"):
        check_compatible(loaded, vocabs=Vocabularies.joint(data.vocabs.src))
    bigger = translation_trainer(tiny_model(data, qk_dim=8), data.vocabs, data.train,
                     data.valid, TrainConfig(quiet=True))
    with pytest.raises(CheckpointError, match=r"ckpt does not match this run.*qk_dim"):
        bigger.resume(tmp_path / "ckpt")
    # an inference-only checkpoint cannot be resumed
    save_model_checkpoint(tmp_path / "infer", trainer.model, data.vocabs)
    with pytest.raises(ValueError, match=r"no training or optimizer state \(saved for inference"):
        make_trainer(data).resume(tmp_path / "infer")


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "cosine", "linear", "noam", "constant"])
def test_every_schedule_peaks_at_lr(schedule):
    from npformer.training.trainer import make_schedule
    lrs = [make_schedule(TrainConfig(schedule=schedule, lr=2e-3, warmup_steps=10), 100)(s)
           for s in range(1, 101)]
    assert max(lrs) == pytest.approx(2e-3)
    if schedule != "constant":
        assert lrs[0] < lrs[9] and lrs[-1] < lrs[9]             # warm-up, then decay


def test_progress_bar_is_off_without_a_tty_or_when_quiet():
    import io
    from npformer.training.progress import progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    assert progress_bar(total=3, file=io.StringIO()).disable
    assert progress_bar(total=3, file=Terminal(), quiet=True).disable
    term = Terminal()
    bar = progress_bar(total=3, file=term)
    assert not bar.disable
    bar.set_postfix(loss="1.000", tok_s="99", lr="1e-03")
    bar.update(1)
    bar.close()
    assert "loss=1.000" in term.getvalue()
