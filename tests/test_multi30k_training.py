"""Multi30k training and evaluation: the trainer's real-data features (token-count batches,
gradient accumulation, step validation, time budget, kept checkpoints), ``npformer train
--dataset multi30k`` and ``npformer eval --dataset multi30k`` on a tiny folder made here, and a
smoke test on the real data (``-k smoke``; skipped where ../shared/data/multi30k is absent).
"""
import gzip
import json
import time

import numpy as np
import pytest

import npformer as nf
from npformer.cli.main import main
from npformer.data.batching import make_batch
from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.metrics import sacrebleu_scores
from npformer.training.metrics_log import read_metrics_log
from npformer.training.multi30k import build_trainer, evaluate_checkpoint, load_multi30k
from npformer.training.toy import toy_data
from npformer.training.trainer import TrainConfig, step_checkpoints
from npformer.training.translation import translation_trainer

# ---------------------------------------------------------------------------------------------
# a tiny Multi30k-shaped folder: the same file names, a few made-up sentences
DE = ["Ein Mann läuft.", "Eine Frau sitzt.", "Ein Hund läuft.", "Ein Kind sitzt.",
      "Ein Mann sitzt.", "Eine Frau läuft.", "Ein Hund sitzt.", "Ein Kind läuft."]
EN = ["A man runs.", "A woman sits.", "A dog runs.", "A child sits.",
      "A man sits.", "A woman runs.", "A dog sits.", "A child runs."]


def write_split(folder, split, de, en, compress=True):
    for lang, lines in (("de", de), ("en", en)):
        data = ("\n".join(lines) + "\n").encode("utf-8")
        if compress:
            (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / f"{split}.{lang}").write_bytes(data)


@pytest.fixture
def mini_dir(tmp_path):
    folder = tmp_path / "m30k"
    folder.mkdir()
    write_split(folder, "train", DE * 4, EN * 4)
    write_split(folder, "val", DE[:4], EN[:4])
    write_split(folder, "test_2016_flickr", DE[4:], EN[4:], compress=False)
    return folder


TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "16", "--layers", "1", "--max-len", "16",
        "--quiet"]


# ---------------------------------------------------------------------------------------------
# trainer features
@pytest.fixture(scope="module")
def toy():
    return toy_data(seed=4, n_train=96, n_heldout=4, n_valid=12)


def toy_trainer(toy, dtype=np.float32, dropout=0.1, **cfg):
    model = nf.Transformer(len(toy.vocabs.src), len(toy.vocabs.tgt), d_model=16, n_heads=2, d_ff=16,
                           n_encoder_layers=1, n_decoder_layers=1, dropout=dropout, max_len=16,
                           dtype=dtype)
    config = TrainConfig(**{"lr": 3e-3, "warmup_steps": 4, "quiet": True, "log_every": 1, **cfg})
    return translation_trainer(model, toy.vocabs, toy.train, toy.valid, config)


def test_accumulated_gradient_equals_the_gradient_of_the_joined_batch(toy):
    trainer = toy_trainer(toy, dtype=np.float64, dropout=0.0, clip_norm=None)
    ids = trainer.task.train_ids
    parts = [ids[:5], ids[5:12]]                        # 2 batches of different lengths and sizes
    batches = [make_batch([s for s, _ in p], [t for _, t in p], 0, 1, 2) for p in parts]
    joined = make_batch([s for s, _ in ids[:12]], [t for _, t in ids[:12]], 0, 1, 2)
    loss_joined = trainer.train_step(joined)
    grads_joined = trainer.model.flat_grads.copy()
    trainer2 = toy_trainer(toy, dtype=np.float64, dropout=0.0, clip_norm=None)
    loss_accum = trainer2.train_step(batches)
    assert loss_accum == pytest.approx(loss_joined, rel=1e-10)
    np.testing.assert_allclose(trainer2.model.flat_grads, grads_joined, rtol=1e-8, atol=1e-12)
    assert np.abs(grads_joined).max() > 0


def test_accumulation_counts_updates_and_logs_throughput(toy, tmp_path):
    trainer = toy_trainer(toy, max_tokens=120, accum_steps=3, epochs=1, out_dir=str(tmp_path))
    n_batches = trainer.task.batches_per_epoch()
    summary = trainer.fit()
    assert summary["step"] == -(-n_batches // 3)          # ceil: the last update may be shorter
    train = [r for r in read_metrics_log(tmp_path / "metrics.jsonl") if r["event"] == "train"]
    assert len(train) == summary["step"]
    assert all(r["padded_tokens_per_s"] > r["tokens_per_s"] > 0 for r in train)


def test_resume_with_token_batches_and_accumulation_is_bit_for_bit(toy, tmp_path):
    cfg = dict(max_tokens=100, accum_steps=2, epochs=5)
    straight = toy_trainer(toy, max_steps=9, **cfg)
    straight.fit()
    first = toy_trainer(toy, max_steps=4, **cfg)
    first.fit()
    first.save(tmp_path / "ckpt")
    resumed = toy_trainer(toy, max_steps=9, **cfg)
    resumed.resume(tmp_path / "ckpt")
    assert resumed.step == 4 and resumed.seconds_before > 0
    resumed.fit()
    np.testing.assert_array_equal(resumed.model.flat_params, straight.model.flat_params)
    assert resumed.task.state_dict() == straight.task.state_dict()


def test_step_validation_keeps_the_last_n_checkpoints(toy, tmp_path):
    trainer = toy_trainer(toy, batch_size=16, epochs=3, eval_every_steps=4, keep_last=2,
                          out_dir=str(tmp_path), stop_metric="bleu")
    summary = trainer.fit()
    steps = [r["step"] for r in summary["history"]]
    # every 4 updates, plus the final weights (3 epochs of 6 batches = 18 updates)
    assert steps == [4, 8, 12, 16, 18]
    assert [p.rsplit("_", 1)[1] for p in step_checkpoints(tmp_path)] == ["16", "18"]
    assert all("seconds" in r and "bleu" in r for r in summary["history"])
    assert (tmp_path / "best.npz").exists() and (tmp_path / "last.npz").exists()


def test_time_budget_stops_the_run(toy):
    trainer = toy_trainer(toy, batch_size=8, epochs=1000, time_budget=0.5)
    start = time.perf_counter()
    summary = trainer.fit()
    assert summary["stop_reason"] == "time_budget"
    assert time.perf_counter() - start < 0.5 + 5          # one more update, no more epochs
    assert summary["epoch"] < 1000


def test_new_config_values_are_checked():
    for bad in (dict(max_tokens=0), dict(accum_steps=0), dict(eval_every_steps=-1),
                dict(keep_last=1.5), dict(time_budget=0)):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=name):
            TrainConfig(**bad)


# ---------------------------------------------------------------------------------------------
# the recipe, the CLI and the metrics JSON
def test_recipe_builds_vocabularies_on_train_with_min_freq(mini_dir):
    data = load_multi30k(mini_dir, "en", "de", min_freq=2, subset=7)
    assert len(data.train) == 7 and len(data.valid) == 4
    assert "dog" in data.vocabs.src and "child" not in data.vocabs.src   # child: once in 7 pairs
    assert "hund" in data.vocabs.tgt and "Hund" not in data.vocabs.tgt    # lowercased
    cased = load_multi30k(mini_dir, "de", "en", lowercase=False, min_freq=1)
    assert "Hund" in cased.vocabs.src
    with pytest.raises(ValueError, match="subset"):
        load_multi30k(mini_dir, subset=0)


def test_cli_train_and_eval_write_metrics_json(mini_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--src", "en",
                 "--tgt", "de", "--max-steps", "6", "--max-tokens", "60", "--eval-every", "2",
                 "--average-last", "2", "--out", str(run), "--min-freq", "1"] + TINY) == 0
    out = capsys.readouterr().out
    assert "multi30k en->de: 32 training pairs" in out and "averaged 2 checkpoints" in out
    assert len(step_checkpoints(run)) == 2
    loaded = load_model_checkpoint(run / "averaged")
    assert loaded.meta["extra"]["src_lang"] == "en" and loaded.meta["extra"]["tgt_lang"] == "de"

    for beam in ([], ["--beam", "2"]):
        metrics, hyps = tmp_path / "m.json", tmp_path / "hyp.txt"
        assert main(["eval", "--checkpoint", str(run), "--dataset", "multi30k", "--data-dir",
                     str(mini_dir), "--metrics-json", str(metrics), "--out", str(hyps)] + beam) == 0
        figures = json.loads(metrics.read_text(encoding="utf-8"))
        assert figures["sentences"] == 4 and figures["split"] == "test_2016_flickr"
        assert figures["src"] == "en" and figures["tgt"] == "de"
        assert figures["signature"].startswith("nrefs:1|case:lc|") and "tok:13a" in figures["signature"]
        assert "case:mixed" in figures["signature_cased"]
        assert 0 <= figures["bleu"] <= 100 and 0 <= figures["bleu_cased"] <= 100
        assert figures["seconds"] > 0 and figures["method"] == ("beam2" if beam else "greedy")
        lines = hyps.read_text(encoding="utf-8").split("\n")[:-1]
        assert len(lines) == 4
        # the figures are sacrebleu's on these very lines against the raw references
        assert figures["bleu"] == pytest.approx(sacrebleu_scores(lines, DE[4:])["bleu"])
    printed = capsys.readouterr().out
    assert "BLEU (lowercased)" in printed and "BLEU (cased)" in printed


def test_eval_scores_raw_references_not_tokenised_ones(mini_dir, tmp_path):
    trainer = build_trainer(load_multi30k(mini_dir, min_freq=1),
                            dict(d_model=16, n_heads=2, d_ff=16, n_encoder_layers=1,
                                 n_decoder_layers=1, max_len=16),
                            dict(max_steps=1, quiet=True, eval_every_steps=None))
    trainer.save(tmp_path / "ckpt")
    loaded = load_model_checkpoint(tmp_path / "ckpt")
    result = evaluate_checkpoint(loaded, mini_dir, "test_2016_flickr")
    assert result["references"] == EN[4:]                 # raw, cased, punctuation attached
    assert result["sources"] == DE[4:]


def test_loader_errors_reach_the_cli_naming_the_file(mini_dir, tmp_path, capsys):
    common = ["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--max-steps", "1",
              "--out", str(tmp_path / "run")] + TINY
    (mini_dir / "val.en.gz").write_bytes(b"not gzip at all")
    assert main(common) == 1
    err = capsys.readouterr().err
    assert "val.en.gz" in err and "gzip" in err
    write_split(mini_dir, "val", DE[:4], EN[:3])
    assert main(common) == 1
    err = capsys.readouterr().err
    assert "val.de.gz has 4 lines" in err and "val.en.gz has 3" in err
    assert main(common[:3] + ["--data-dir", str(tmp_path / "nowhere")] + common[5:]) == 1
    assert "nowhere" in capsys.readouterr().err
    # eval: a split that is not there, a checkpoint that is not a Multi30k model
    write_split(mini_dir, "val", DE[:4], EN[:4])
    assert main(common) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "last"), "--dataset", "multi30k",
                 "--data-dir", str(mini_dir), "--split", "test_2017_flickr"]) == 1
    assert "test_2017_flickr" in capsys.readouterr().err
    assert main(["train", "--dataset", "multi30k", "--src-file", "x", "--out", str(tmp_path)]) == 1
    assert "--src-file" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# smoke test on the real data (run it alone: pytest tests/test_multi30k_training.py -k smoke)
SMOKE_STEPS = 300
SMOKE_MIN_BLEU = 3.0


@pytest.mark.smoke
def test_smoke_multi30k_subset_learns(multi30k_dir, tmp_path):
    """A small model on 2,000 training pairs for 300 updates: the loss falls and BLEU on 300
    validation sentences rises above a low bar. Measured (2 busy cores, load ~2.5): 18-20 s of
    training, loss 7.07 -> 3.64, BLEU 6.40; an untrained model scores ~0.0. The bars leave
    about half of that as margin for changes in the kernels' rounding."""
    data = load_multi30k(multi30k_dir, "de", "en", subset=2000, valid_subset=300)
    trainer = build_trainer(
        data, dict(d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2, n_decoder_layers=2,
                   max_len=64),
        dict(max_steps=SMOKE_STEPS, max_tokens=1500, lr=3e-3, warmup_steps=40, eval_every_steps=None,
             epochs=1000, quiet=True, log_every=10, out_dir=str(tmp_path)))
    start = time.perf_counter()
    summary = trainer.fit()
    train = [r for r in read_metrics_log(tmp_path / "metrics.jsonl") if r["event"] == "train"]
    first, last = train[0]["loss"], train[-1]["loss"]
    bleu = trainer.evaluate()["bleu"]          # on data.valid
    print(f"smoke: {summary['step']} updates in {time.perf_counter() - start:.1f} s, "
          f"loss {first:.2f} -> {last:.2f}, val BLEU {bleu:.2f}")
    assert summary["step"] == SMOKE_STEPS
    assert last < 0.6 * first
    assert bleu > SMOKE_MIN_BLEU



def test_plot_draws_bleu_against_wall_time(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from npformer.training.metrics_log import MetricsLog
    with MetricsLog(tmp_path / "metrics.jsonl") as log:
        log.log("train", step=10, loss=6.0)
        for step, seconds, bleu in ((60, 135.0, 0.1), (120, 250.0, 2.9), (180, 353.0, 6.9)):
            log.log("eval", step=step, loss=4.0, bleu=bleu, seconds=seconds)
    assert main(["plot", "--metrics", str(tmp_path / "metrics.jsonl"), "--out", str(tmp_path)]) == 0
    written = capsys.readouterr().out.split()
    assert str(tmp_path / "bleu_vs_time.png") in written
    assert (tmp_path / "bleu_vs_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_reports_a_language_swap_and_keeps_the_checkpoints_languages(mini_dir, tmp_path, capsys):
    run = tmp_path / "run"
    common = ["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--min-freq", "1",
              "--max-tokens", "80", "--out", str(run)]
    assert main(common + ["--max-steps", "2"] + TINY) == 0
    capsys.readouterr()
    assert main(common + ["--max-steps", "4", "--src", "en", "--tgt", "de", "--resume",
                          str(run / "last")]) == 1
    err = capsys.readouterr().err
    assert "the checkpoint translates de->en; it cannot go on as en->de" in err
    assert "--src de in the checkpoint, en given" in err and "--cased" not in err
    # left out, the languages, the model and the recipe come from the checkpoint
    assert main(common + ["--max-steps", "4", "--resume", str(run / "last"), "--quiet"]) == 0
    assert "multi30k de->en" in capsys.readouterr().out
    assert load_model_checkpoint(run / "last").meta["training"]["step"] == 4


def test_empty_validation_is_refused(mini_dir, tmp_path, capsys):
    common = ["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--min-freq", "1",
              "--max-steps", "1", "--out", str(tmp_path / "run")] + TINY
    with pytest.raises(SystemExit):
        main(common + ["--valid-subset", "0"])
    assert "--valid-subset: expected a positive integer" in capsys.readouterr().err
    for lang in ("de", "en"):                     # a val split without a single line
        (mini_dir / f"val.{lang}.gz").write_bytes(gzip.compress(b""))
    assert main(common) == 1
    assert "val split holds no sentences" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
