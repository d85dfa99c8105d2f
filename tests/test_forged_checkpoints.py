"""Checkpoints re-saved with a valid sha256 after an edit: the loader's own checks must catch
what the hash cannot. A configuration's pad_id must be the vocabularies' own <pad>; a resumed
training state must hold the run's fields, each of the right type and in range. Every refusal
names the field, and nothing is written."""
import json
import math
import shutil

import numpy as np
import pytest

import npformer as nf
from npformer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from npformer.cli.main import main
from npformer.data.vocab import Vocab, Vocabularies
from npformer.decoding.translator import Translator
from npformer.training.checkpointing import load_model_checkpoint, save_model_checkpoint
from npformer.training.translation import TranslationTask

TINY = ["--d-model", "8", "--n-heads", "2", "--d-ff", "8", "--layers", "1", "--quiet"]


def resave(path, edit):
    """Rewrite checkpoint ``path`` with ``edit(meta)`` applied, through save_checkpoint: the
    sha256 and the index stay valid (as test_checkpoint_loading's ``resave``)."""
    arrays, meta = load_checkpoint(path)
    edit(meta)
    save_checkpoint(path, arrays, meta)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """A two-update toy run (npformer train --dataset toy), made once; tests copy it."""
    out = tmp_path_factory.mktemp("toy") / "run"
    assert main(["train", "--dataset", "toy", "--out", str(out), "--max-steps", "2", *TINY]) == 0
    return out


@pytest.fixture
def run(toy_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(toy_run, out)
    return out


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def one_line_error(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# -- a forged pad_id -----------------------------------------------------------------------------
@pytest.mark.parametrize("pad_id, token", [(2, "<eos>"), (1, "<bos>"), (3, "<unk>"), (5, None)])
def test_a_forged_pad_id_is_refused_naming_both(run, capsys, pad_id, token):
    """Before: pad_id 2 (<eos>) translated to full-length garbage with exit 0."""
    last = run / "last"
    resave(last, lambda meta: meta["config"].update(pad_id=pad_id))
    with pytest.raises(CheckpointError) as err:
        load_model_checkpoint(last)
    message = str(err.value)
    word = repr(token) if token else repr(load_model_checkpoint(run / "best").vocabs.src
                                          .id_to_token(pad_id))
    assert f"checkpoint {last}: the model's configuration says pad_id={pad_id}, which is {word}" \
        in message and "pad with id 0 ('<pad>')" in message, message
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(last), "hello world"]) == 1
    assert f"pad_id={pad_id}" in one_line_error(capsys)


def test_the_library_refuses_a_pad_id_that_is_not_the_vocabularies(tmp_path):
    """Wherever a configuration meets a Vocabularies value: the translator, a training task,
    saving (so that what save writes, load reads)."""
    vocabs = Vocabularies(Vocab(list(Vocab.SPECIALS) + ["ein"]), Vocab(list(Vocab.SPECIALS) + ["a"]))
    model = nf.Transformer(5, 5, d_model=8, n_heads=2, d_ff=8, n_encoder_layers=1,
                           n_decoder_layers=1, max_len=8, pad_id=2)
    expected = r"pad_id=2, which is '<eos>' in the src vocabulary; the vocabularies pad with id 0"
    with pytest.raises(ValueError, match=expected):
        Translator(model, vocabs)
    with pytest.raises(ValueError, match=expected):
        TranslationTask(vocabs, [("ein", "a")]).check_model(model)
    with pytest.raises(ValueError, match=expected):
        save_model_checkpoint(tmp_path / "ckpt", model, vocabs)
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"where: the model's configuration says pad_id=7, "
                                         r"which is no token in the joint vocabulary"):
        Vocabularies.check_fits(Vocabularies.joint(vocabs.src), {}, "where", pad_id=7)
    assert Vocabularies.check_fits(vocabs, {"src": 5, "tgt": 5}, pad_id=0) is vocabs


# -- a forged training state ---------------------------------------------------------------------
def resume(run, *extra):
    return main(["train", "--dataset", "toy", "--out", str(run), "--resume", str(run / "last"),
                 "--max-steps", "4", *extra])


def refused_on_resume(run, capsys, edit, expected):
    """``edit`` (of the checkpoint's meta) made to run/last: the resume fails in one line,
    ``checkpoint .../last: expected``, and changes no file of the run."""
    resave(run / "last", edit)
    before = snapshot(run)
    capsys.readouterr()
    assert resume(run) == 1
    err = one_line_error(capsys)
    assert f"checkpoint {run / 'last'}: {expected}" in err, err
    assert snapshot(run) == before


def test_a_negative_step_is_refused(run, capsys):
    """Before: the run resumed at step -5 and ran the updates up to --max-steps from there."""
    refused_on_resume(run, capsys, lambda meta: meta["training"].update(step=-5),
                      "training.step: expected a non-negative integer, got -5")


def test_a_training_state_without_its_config_is_refused(run, capsys):
    """Before: the run resumed with the default schedule instead of its own."""
    refused_on_resume(run, capsys, lambda meta: meta["training"].pop("config"),
                      "training.config: missing")


def _set(key, value):
    """An edit of ``meta["training"]``: ``key`` "a.b" sets training["a"]["b"]; a value of
    ``_set.DROP`` removes the key."""
    def edit(meta):
        *groups, field = key.split(".")
        target = meta["training"]
        for group in groups:
            target = target.setdefault(group, {})
        if value is _set.DROP:
            del target[field]
        else:
            target[field] = value
    return edit


_set.DROP = object()
PLATEAU = {"lr": 0.001, "best": None, "bad": 0, "cooldown_left": 0}
FORGED = [
    ("step", 2.5, "training.step: expected a non-negative integer, got 2.5"),
    ("step", "2", "training.step: expected a non-negative integer, got '2'"),
    ("step", True, "training.step: expected a non-negative integer, got True"),
    ("step", _set.DROP, "training.step: missing"),
    ("epoch", -1, "training.epoch: expected a non-negative integer, got -1"),
    ("sampler", _set.DROP, "training.sampler: missing"),
    ("seconds", math.nan, "training.seconds: expected a finite number >= 0, got nan"),
    ("seconds", -1.0, "training.seconds: expected a finite number >= 0, got -1.0"),
    ("best_value", math.inf, "training.best_value: expected a finite number or None, got inf"),
    ("world_size", 0, "training.world_size: expected a positive integer, got 0"),
    ("total_steps", -4, "training.total_steps: expected a positive integer, got -4"),
    ("data_crc32", "x", "training.data_crc32: expected a non-negative integer or None, got 'x'"),
    ("early_stopping", [], "training.early_stopping: expected a dict, got []"),
    ("early_stopping.bad_evals", -2,
     "training.early_stopping.bad_evals: expected a non-negative integer, got -2"),
    ("early_stopping.best", math.nan, "training.early_stopping.best: expected a finite number"),
    ("schedule_warps", [[2, 0.0]], "training.schedule_warps[0][1]: expected a finite positive"),
    ("schedule_warps", [[-1, 1.0]], "training.schedule_warps[0][0]: expected a non-negative"),
    ("schedule_warps", {"2": 1.0}, "training.schedule_warps: expected a list of [step, factor]"),
    ("schedule", {**PLATEAU, "lr": math.nan}, "training.schedule.lr: expected a finite number"),
    ("schedule", {**PLATEAU, "bad": -1}, "training.schedule.bad: expected a non-negative"),
    ("schedule", {"lr": 0.001}, "training.schedule.bad: expected a non-negative integer, got None"),
    ("config", "cosine", "training.config: expected a dict, got 'cosine'"),
    ("config.lr", -1, "training.config: lr: expected a finite positive number, got -1"),
    ("config.max_steps", 0, "training.config: max_steps: expected a positive integer or None"),
]


@pytest.mark.parametrize("key, value, expected", FORGED,
                         ids=[f"{k}={v if v is not _set.DROP else 'missing'}" for k, v, _ in FORGED])
def test_each_field_of_the_training_state_is_checked_on_resume(run, capsys, key, value, expected):
    refused_on_resume(run, capsys, _set(key, value), expected)


def test_the_unforged_run_resumes(run, capsys):
    """The checks pass what Trainer.save writes (a plateau schedule's state included)."""
    from npformer.training.trainer import check_training_state
    assert resume(run) == 0
    training = load_checkpoint(run / "last")[1]["training"]
    assert training["step"] == 4
    assert check_training_state({**training, "schedule": PLATEAU}, "x")["step"] == 4
    assert json.loads(json.dumps(training)) == training
    assert np.isfinite(training["seconds"])
