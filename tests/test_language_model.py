"""The language-model task and ``npformer lm`` / ``npformer sample --checkpoint``: characters as
tokens, the split, the random windows, the validation loss over the whole split, resuming bit for
bit, weight decay on matrices only, fine-tuning from a checkpoint, and bad input."""
import json

import numpy as np
import pytest

import npformer as nf
from npformer.cli.main import main
from npformer.data.characters import CharTokenizer
from npformer.data.textfile import read_text
from npformer.loss import cross_entropy
from npformer.training.language_model import (LanguageModelTask, LMBatch, lm_trainer,
                                              split_ids)
from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.trainer import TrainConfig

TEXT = "".join(f"{w} the quick brown fox, line {i % 7}.\n" for i, w in
               enumerate(["ROMEO:", "JULIET:", "Nurse:", "Friar:"] * 30))
SMALL = dict(n_layers=1, d_model=16, n_heads=2, d_ff=32, dropout=0.1)


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


# -- characters, the file, the split --------------------------------------------------------------

def test_characters_round_trip_and_unknown_ones_are_named():
    tok = CharTokenizer.from_text(TEXT)
    assert len(tok) == 4 + len(set(TEXT))
    assert tok.vocab.tokens[4:] == sorted(set(TEXT))
    ids = tok.encode("ROMEO: the fox.\n")
    assert ids.dtype == np.int64 and (ids >= 4).all()
    assert tok.decode(ids) == "ROMEO: the fox.\n"
    assert tok.decode([0, 1, 2, 3] + list(ids[:5])) == "ROMEO"      # specials stand for nothing
    with pytest.raises(ValueError, match=r"--prompt: 2 character\(s\) .*'Z', 'é'"):
        tok.encode("éZ fox", "--prompt")


@pytest.mark.parametrize("content, match", [(b"", "is empty"), (b"ab\xffcd", "not valid UTF-8"),
                                            (None, "no such file")])
def test_bad_text_files_are_named(tmp_path, content, match):
    path = tmp_path / "t.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as e:
        read_text(path)
    assert str(path) in str(e.value)


def test_split_is_the_last_tenth_and_refuses_a_text_shorter_than_the_windows():
    ids = np.arange(1000)
    train, valid = split_ids(ids, context=16)
    assert len(valid) == 100 and np.array_equal(np.concatenate([train, valid]), ids)
    with pytest.raises(ValueError, match=r"mine.txt: 1,000 tokens is too short for a context of "
                                         r"128.*validation \(100"):
        split_ids(ids, context=128, name="mine.txt")


# -- the task --------------------------------------------------------------------------------------

def make_task(context=8, batch_size=4, seed=0, valid=None):
    tok = CharTokenizer.from_text(TEXT)
    train, v = split_ids(tok.encode(TEXT), context)
    return LanguageModelTask(train, v if valid is None else valid, context, batch_size, seed,
                             tok, nf.data.Vocabularies.joint(tok.vocab), sample_tokens=20), tok


def test_windows_are_shifted_by_one_seeded_and_resume_where_they_stopped():
    task, _ = make_task()
    first = list(task.batches(0))
    assert len(first) == task.batches_per_epoch() == len(task.train_ids) // (4 * 8)
    b = first[0]
    assert isinstance(b, LMBatch) and b.inputs.shape == b.targets.shape == (4, 8)
    assert np.array_equal(b.inputs[:, 1:], b.targets[:, :-1])
    assert all(np.array_equal(x.inputs, y.inputs) for x, y in zip(first, make_task()[0].batches(0)))
    assert not np.array_equal(first[0].inputs, next(make_task()[0].batches(1)).inputs)
    assert not np.array_equal(first[0].inputs, next(make_task(seed=1)[0].batches(0)).inputs)
    half, _ = make_task()
    it = half.batches(0)
    for _ in range(3):
        next(it)
    again, _ = make_task()
    again.load_state_dict(half.state_dict())
    assert again.batches_done() == 3
    rest = list(again.batches(0))
    assert all(np.array_equal(x.inputs, y.inputs) for x, y in zip(rest, first[3:]))
    assert len(rest) == len(first) - 3


@pytest.mark.parametrize("n_valid", [41, 40, 12, 5, 2])
def test_validation_loss_is_the_mean_over_every_token_of_the_split(backend, n_valid):
    """Every token after the first predicted once, from its window of at most ``context``
    tokens before it: the loss equals a brute-force loop over the windows, one at a time
    (41: full windows only; 40, 12: a shorter tail; 5, 2: no full window at all)."""
    tok = CharTokenizer.from_text(TEXT)
    ids = tok.encode(TEXT)
    task, _ = make_task(valid=ids[:n_valid])
    model = nf.GPT(len(tok), max_len=8, dtype=np.float64, **SMALL).eval()
    got = task.evaluate(model)["val_loss"]
    total, count = 0.0, 0
    for start in range(0, n_valid - 1, 8):
        window = ids[start:min(start + 9, n_valid)]
        loss, _ = cross_entropy(model.forward(window[None, :-1]), window[None, 1:])
        total += loss * (len(window) - 1)
        count += len(window) - 1
    assert count == n_valid - 1
    assert got == pytest.approx(total / count, rel=1e-12)
    assert task.examples() and task.examples()[0].startswith(tok.decode(ids[:1]))


def test_the_default_sample_fills_the_context_once():
    """By default a validation's sample is ``context - 1`` tokens after its one-token prompt:
    it never slides the window (which recomputes every position for each token past it)."""
    tok = CharTokenizer.from_text(TEXT)
    train, valid = split_ids(tok.encode(TEXT), 8)
    decoded = []
    spy = type("Spy", (), {"decode": lambda self, ids: decoded.append(list(ids)) or "text"})()
    task = LanguageModelTask(train, valid, 8, 4, 0, spy, nf.data.Vocabularies.joint(tok.vocab))
    assert task.sample_tokens == 7
    task.evaluate(nf.GPT(len(tok), max_len=8, dtype=np.float64, **SMALL).eval())
    assert task.examples() == ["text"] and len(decoded) == 1
    assert len(decoded[0]) == 8 and decoded[0][0] == valid[0]          # prompt + 7 tokens


def test_the_task_refuses_a_translation_model_and_a_context_beyond_the_model():
    task, tok = make_task(context=16)
    with pytest.raises(ValueError, match="decoder-only"):
        task.check_model(nf.Transformer(10, 10, d_model=16, n_heads=2, d_ff=16,
                                        n_encoder_layers=1, n_decoder_layers=1))
    with pytest.raises(ValueError, match="context: 16 positions, more than the model's max_len=8"):
        task.check_model(nf.GPT(len(tok), max_len=8, **SMALL))
    with pytest.raises(ValueError, match="vocab_size=99"):
        task.check_model(nf.GPT(99, max_len=16, **SMALL))


def test_weight_decay_on_matrices_only_is_a_training_option():
    with pytest.raises(ValueError, match="decay: expected one of"):
        TrainConfig(decay="biases")
    trainer, _ = lm_trainer_from(TEXT, train_kwargs=dict(max_steps=1))
    decayed = {d for _, _, d in trainer.optimizer.segments}
    assert decayed == {True, False} and trainer.config.decay == "matrices"
    assert trainer.config.optimizer == "adamw" and trainer.config.schedule == "cosine"


def lm_trainer_from(text, tmp=None, **kwargs):
    import tempfile
    folder = tmp or tempfile.mkdtemp()
    path = f"{folder}/input.txt"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    kwargs.setdefault("model_kwargs", SMALL)
    kwargs.setdefault("context", 8)
    kwargs["train_kwargs"] = dict(dict(batch_size=4, quiet=True, warmup_steps=2),
                                  **kwargs.get("train_kwargs", {}))
    return lm_trainer(path, sample_tokens=10, **kwargs)


def test_resuming_continues_bit_for_bit(tmp_path, backend):
    """4 updates straight, or 2, a checkpoint, and 2 more from it: the same weights, bits and all
    (dropout on, AdamW with decay on matrices, warm-up and cosine)."""
    straight, _ = lm_trainer_from(TEXT, str(tmp_path), train_kwargs=dict(max_steps=4))
    straight.fit()
    first, _ = lm_trainer_from(TEXT, str(tmp_path), train_kwargs=dict(
        max_steps=2, out_dir=str(tmp_path / "run")))
    first.fit()
    again, _ = lm_trainer_from(TEXT, str(tmp_path), train_kwargs=dict(
        max_steps=4, out_dir=str(tmp_path / "run")))
    again.resume(str(tmp_path / "run" / "last"))
    again.fit()
    assert np.array_equal(again.model.flat_params, straight.model.flat_params)


def test_fine_tuning_starts_from_a_gpt_checkpoint_and_keeps_its_characters(tmp_path):
    base, _ = lm_trainer_from(TEXT, str(tmp_path), train_kwargs=dict(
        max_steps=2, out_dir=str(tmp_path / "base")))
    base.fit()
    tuned, data = lm_trainer_from("ROMEO: the fox.\n" * 40, str(tmp_path),
                                  model_kwargs={}, init_from=str(tmp_path / "base"),
                                  train_kwargs=dict(max_steps=1))
    assert data.tokenizer.vocab == base.task.vocabs.tgt               # the checkpoint's characters
    saved = load_model_checkpoint(str(tmp_path / "base" / "best"))
    assert np.array_equal(tuned.model.flat_params, saved.model.flat_params)
    with pytest.raises(ValueError, match="n_layers cannot be set"):
        lm_trainer_from(TEXT, str(tmp_path), model_kwargs={"n_layers": 2},
                        init_from=str(tmp_path / "base"))
    with pytest.raises(ValueError, match=r"1 character\(s\) the model's vocabulary lacks \('Z'\)"):
        lm_trainer_from("Z" + TEXT, str(tmp_path), model_kwargs={},
                        init_from=str(tmp_path / "base"))


# -- the command line ------------------------------------------------------------------------------

TINY = ["--layers", "1", "--d-model", "16", "--n-heads", "2", "--context", "16",
        "--batch-size", "4", "--warmup-steps", "2", "--sample-tokens", "12", "--quiet"]


def test_lm_trains_logs_val_loss_and_sample_continues_the_best(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--max-steps", "4",
                 "--eval-every", "2", *TINY]) == 0
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(np.isfinite(r["val_loss"]) and r["examples"] for r in evals)
    assert "best val loss" in capsys.readouterr().out
    assert main(["sample", "--checkpoint", str(out / "best"), "--prompt", "ROMEO:",
                 "--max-new-tokens", "10", "--temperature", "0.8", "--seed", "3"]) == 0
    first = capsys.readouterr().out
    # 10 tokens, each a character (an untrained model may draw a special token: no character)
    assert first.startswith("ROMEO:") and len("ROMEO:") + 1 < len(first) <= len("ROMEO:") + 11
    assert main(["sample", "--checkpoint", str(out), "--prompt", "ROMEO:",
                 "--max-new-tokens", "10", "--temperature", "0.8", "--seed", "3"]) == 0
    assert capsys.readouterr().out == first                           # same seed, same text


def test_lm_resume_keeps_the_options_and_continues_bit_for_bit(text_file, tmp_path, capsys):
    straight = tmp_path / "straight"
    assert main(["lm", "--data", str(text_file), "--out", str(straight), "--max-steps", "4",
                 "--dropout", "0.1", *TINY]) == 0
    out = tmp_path / "run"
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--max-steps", "2",
                 "--dropout", "0.1", *TINY]) == 0
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--resume",
                 str(out / "last"), "--max-steps", "4", "--quiet"]) == 0
    assert np.array_equal(load_model_checkpoint(str(out / "last")).model.flat_params,
                          load_model_checkpoint(str(straight / "last")).model.flat_params)
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--resume",
                 str(out / "last"), "--max-steps", "5", "--lr", "0.5"]) == 1
    assert "cannot change --lr: --lr 0.003 in the checkpoint, 0.5 given" in capsys.readouterr().err


def test_lm_schedule_is_an_option_a_resume_keeps(text_file, tmp_path, monkeypatch, capsys):
    """--schedule linear reaches the trainer and the checkpoint; a resume without it keeps the
    checkpoint's; a run recorded before the option existed resumes with its cosine."""
    def run(out, *args):
        assert main(["lm", "--data", str(text_file), "--out", str(out), *args]) == 0
        return load_model_checkpoint(str(out / "last"))

    straight = run(tmp_path / "straight", "--max-steps", "6", "--schedule", "linear", *TINY)
    assert straight.meta["extra"]["options"]["schedule"] == "linear"
    assert straight.meta["training"]["config"]["schedule"] == "linear"
    part = run(tmp_path / "run", "--max-steps", "6", "--schedule", "linear", "--time-budget",
               "1e-9", *TINY)                    # stops after its first update
    assert part.meta["training"]["step"] == 1
    resumed = run(tmp_path / "run", "--resume", str(tmp_path / "run" / "last"), "--quiet",
                  "--time-budget", "100")
    assert resumed.meta["training"]["config"]["schedule"] == "linear"
    assert np.array_equal(resumed.model.flat_params, straight.model.flat_params)
    cosine = run(tmp_path / "cosine", "--max-steps", "6", "--schedule", "cosine", *TINY)
    assert not np.array_equal(cosine.model.flat_params, straight.model.flat_params)
    import npformer.cli.lm as lm_cli
    old = tuple(d for d in lm_cli.LM_RECORDED if d != "schedule")
    monkeypatch.setattr(lm_cli, "LM_RECORDED", old)        # a checkpoint without the option
    assert run(tmp_path / "old", "--max-steps", "6", "--schedule", "cosine", "--time-budget",
               "1e-9", *TINY).meta["training"]["step"] == 1
    monkeypatch.undo()
    monkeypatch.setitem(lm_cli.LM_TRAIN, "schedule", "linear")   # whatever the default becomes
    again = run(tmp_path / "old", "--resume", str(tmp_path / "old" / "last"), "--quiet",
                "--time-budget", "100")
    assert again.meta["training"]["config"]["schedule"] == "cosine"
    assert np.array_equal(again.model.flat_params, cosine.model.flat_params)
    # ... and refuses another schedule, as for any option the checkpoint recorded
    assert main(["lm", "--data", str(text_file), "--out", str(tmp_path / "old"), "--resume",
                 str(tmp_path / "old" / "last"), "--schedule", "linear", "--max-steps", "8"]) == 1
    assert ("cannot change --schedule: --schedule cosine in the checkpoint, linear given"
            in capsys.readouterr().err)


def test_lm_positions_is_a_model_option_a_resume_keeps(text_file, tmp_path, monkeypatch, capsys):
    """--positions rotary builds a rotary GPT and is recorded; a resume keeps it and refuses
    another; a run recorded before the option existed has its model's positions; --init-from
    brings its own."""
    out = tmp_path / "run"
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--max-steps", "2",
                 "--positions", "rotary", *TINY]) == 0
    ckpt = load_model_checkpoint(str(out / "last"))
    assert ckpt.model.config.positions == "rotary" and ckpt.model.pos_embed is None
    assert ckpt.meta["extra"]["options"]["positions"] == "rotary"
    capsys.readouterr()
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--resume", str(out / "last"),
                 "--max-steps", "3", "--positions", "learned"]) == 1
    assert ("cannot change --positions: --positions rotary in the checkpoint, learned given"
            in capsys.readouterr().err)
    assert main(["lm", "--data", str(text_file), "--out", str(tmp_path / "x"),
                 "--init-from", str(out), "--positions", "learned"]) == 1
    assert "--positions: the model of --init-from" in capsys.readouterr().err
    import npformer.cli.lm as lm_cli
    monkeypatch.setattr(lm_cli, "LM_RECORDED", tuple(d for d in lm_cli.LM_RECORDED
                                                     if d != "positions"))
    old = tmp_path / "old"
    assert main(["lm", "--data", str(text_file), "--out", str(old), "--max-steps", "2",
                 "--positions", "learned", *TINY]) == 0                 # not the default
    monkeypatch.undo()
    meta = load_model_checkpoint(str(old / "last")).meta
    assert "positions" not in meta["extra"]["options"]
    assert lm_cli.recorded_lm_options(meta)["positions"] == "learned"
    assert main(["lm", "--data", str(text_file), "--out", str(old), "--resume", str(old / "last"),
                 "--max-steps", "3", "--positions", "rotary"]) == 1
    assert "--positions learned in the checkpoint, rotary given" in capsys.readouterr().err


def test_the_recipes_blocks_have_one_size_and_record_their_family():
    """--arch gpt2 and --arch llama are the same shape and training with another block: the
    SwiGLU's width makes its three matrices hold the MLP's two's weights. Each configuration
    records its family (nothing is read off its fields); "gpt" is gpt2's earlier name."""
    from npformer.training.language_model import lm_d_ff, lm_model, migrate_arch
    gpt, llama = (nf.GPTConfig(vocab_size=65, **lm_model(a)) for a in ("gpt2", "llama"))
    assert (llama.norm, llama.ffn, llama.activation, llama.qkv_bias, llama.proj_bias) == \
        ("rmsnorm", "gated", "silu", False, False)
    assert 3 * llama.d_ff == 2 * gpt.d_ff                   # 512 and 768 at d_model 192
    assert abs(llama.parameter_count() / gpt.parameter_count() - 1) < 0.01   # (biases, shifts)
    assert (gpt.family, llama.family) == ("gpt2", "llama")
    assert lm_model("gpt") == lm_model("gpt2")
    assert nf.GPTConfig(vocab_size=65, **lm_model("qwen2")).qkv_bias
    assert [migrate_arch(r) for r in ({}, {"arch": "gpt"}, {"arch": "llama"})] == \
        ["gpt2", "gpt2", "llama"]
    assert [lm_d_ff("llama", d) for d in (16, 96, 192, 200)] == [64, 256, 512, 544]
    with pytest.raises(ValueError, match=f"arch: expected one of "
                                         f"{', '.join(nf.families.names())}, got 'nosuch'"):
        lm_model("nosuch")


def test_lm_arch_llama_trains_llamas_block_and_a_resume_keeps_it(text_file, tmp_path, capsys):
    """--arch llama: RMSNorm, SwiGLU, no biases, recorded; --n-kv-heads groups the heads; a
    resume continues bit for bit and refuses another --arch; --init-from brings its own."""
    args = ["--arch", "llama", "--n-kv-heads", "1", "--dropout", "0.1", *TINY]
    straight = tmp_path / "straight"
    assert main(["lm", "--data", str(text_file), "--out", str(straight), "--max-steps", "3",
                 *args]) == 0
    assert "a GPT with Llama's block of" in capsys.readouterr().out
    ckpt = load_model_checkpoint(str(straight / "last"))
    config = ckpt.model.config
    assert (config.norm, config.ffn, config.activation, config.qkv_bias, config.proj_bias,
            config.n_kv_heads, config.n_heads, config.d_ff) == ("rmsnorm", "gated", "silu", False,
                                                                False, 1, 2, 64)
    assert ckpt.meta["extra"]["options"]["arch"] == "llama" and config.family == "llama"
    assert ckpt.meta["extra"]["options"]["n_kv_heads"] == 1
    out = tmp_path / "run"
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--max-steps", "3",
                 "--time-budget", "1e-9", *args]) == 0             # stops after one update
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--resume",
                 str(out / "last"), "--quiet", "--time-budget", "100"]) == 0
    assert np.array_equal(load_model_checkpoint(str(out / "last")).model.flat_params,
                          ckpt.model.flat_params)
    capsys.readouterr()
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--resume",
                 str(out / "last"), "--max-steps", "4", "--arch", "gpt"]) == 1
    assert ("cannot change --arch: --arch llama in the checkpoint, gpt2 given"
            in capsys.readouterr().err)
    for flag, value in (("--arch", "llama"), ("--n-kv-heads", "1")):
        assert main(["lm", "--data", str(text_file), "--out", str(tmp_path / "x"),
                     "--init-from", str(straight), flag, value]) == 1
        assert f"{flag}: the model of --init-from" in capsys.readouterr().err
    assert main(["lm", "--data", str(text_file), "--out", str(tmp_path / "y"), "--n-heads", "2",
                 "--n-kv-heads", "3", *TINY[:2], "--d-model", "16", "--quiet"]) == 1
    assert "n_kv_heads: expected a divisor of n_heads=2" in capsys.readouterr().err


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_lm_min_lr_above_lr_is_one_line_naming_both(text_file, tmp_path, capsys, schedule):
    assert main(["lm", "--data", str(text_file), "--out", str(tmp_path / "run"), *TINY,
                 "--schedule", schedule, "--lr", "0.001", "--min-lr", "0.01"]) == 1
    err = capsys.readouterr().err
    assert (f"--min-lr 0.01: expected at most --lr 0.001 (the {schedule} schedule falls"
            in err and len(err.strip().splitlines()) == 1)
    assert not (tmp_path / "run").exists()                             # nothing was written


@pytest.mark.parametrize("content, match", [
    (b"", "is empty, expected UTF-8 text"),
    (b"caf\xe9 au lait\n" * 200, "not valid UTF-8"),
    (b"short text\n" * 10, "too short for a context of 16"),
])
def test_lm_bad_text_is_one_line_naming_the_file(tmp_path, capsys, content, match):
    path = tmp_path / "data.txt"
    path.write_bytes(content)
    assert main(["lm", "--data", str(path), "--out", str(tmp_path / "run"), *TINY]) == 1
    err = capsys.readouterr().err
    assert match in err and str(path) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()                             # nothing was written


def test_sample_bad_prompts_are_one_line(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--max-steps", "1", *TINY]) == 0
    capsys.readouterr()
    for prompt, match in (("ROMEO€", "--prompt: 1 character(s) the model's vocabulary lacks ('€')"),
                          ("ROMEO " * 4, "--prompt: 24 tokens, longer than the model's context "
                                         "of 16")):
        assert main(["sample", "--checkpoint", str(out), "--prompt", prompt]) == 1
        err = capsys.readouterr().err
        assert match in err and len(err.strip().splitlines()) == 1
    assert main(["lm", "--data", str(text_file), "--out", str(tmp_path / "x"),
                 "--init-from", str(out), "--layers", "2"]) == 1
    assert "--layers: the model of --init-from" in capsys.readouterr().err
    assert main(["lm", "--data", str(text_file), "--out", str(tmp_path / "x"),
                 "--init-from", str(tmp_path / "missing")]) == 1
    assert "missing: no such checkpoint or folder" in capsys.readouterr().err
    assert main(["lm", "--data", str(text_file), "--out", str(out), "--overwrite",
                 "--init-from", str(out)]) == 1                    # would delete its own input
    assert "is in --out" in capsys.readouterr().err and (out / "best.npz").exists()
    assert main(["train", "--dataset", "toy", "--out", str(tmp_path / "t"), "--resume",
                 str(out / "last")]) == 1
    assert "was written by npformer lm" in capsys.readouterr().err
