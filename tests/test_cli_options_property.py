"""Property: whatever value a numeric option of toy/train/translate/eval/gradcheck is given, main()
either accepts a value inside the option's documented range or ends in one line on stderr naming
the option (exit 2 from argparse, or 1 from the checks after parsing), never a traceback.

The commands' run functions are replaced by their checking layer: for toy/train the conversion to
model and training settings, a tiny model built from them and run forward once, and the training
configuration and learning-rate schedule; for translate/eval their option checks. Nothing is
trained or decoded."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer.cli import common, evaluate, gradcheck, toy, train, translate
from npformer.cli.common import model_kwargs, train_kwargs
from npformer.cli.main import main
from npformer.training.trainer import TrainConfig, make_schedule

MODEL_TRAIN = ["--d-model", "--n-heads", "--d-ff", "--layers", "--dropout", "--max-len",
               "--epochs", "--max-steps", "--batch-size", "--lr", "--warmup-steps", "--min-lr",
               "--label-smoothing", "--weight-decay", "--clip-norm", "--patience", "--target",
               "--seed"]
OPTIONS = ([("toy", o) for o in MODEL_TRAIN] + [("train", o) for o in MODEL_TRAIN]
           + [("translate", o) for o in ("--beam", "--length-penalty", "--temperature", "--top-k",
                                         "--seed", "--batch-size")]
           + [("eval", o) for o in ("--beam", "--length-penalty")]
           + [("gradcheck", "--max-entries"), ("gradcheck", "--blas-threads")])
VALUES = ["0", "-1", "-2", "1", "2", "3", str(10**9), str(10**12), "9" * 5000, "nan", "inf",
          "-inf", "1e-300", "1e300", "0.5", "-0.5", "0.999", "abc", "", " ", "1e3", "0x10", "-0",
          "1_000"]


def _positive_int(v):
    return isinstance(v, int) and v >= 1


def _non_negative_int(v):
    return isinstance(v, int) and v >= 0


# what an accepted value must be (the options' help and issue 16)
DOMAIN = {
    **dict.fromkeys(["--d-model", "--n-heads", "--d-ff", "--layers", "--max-len", "--epochs",
                     "--max-steps", "--batch-size", "--patience", "--beam", "--top-k",
                     "--blas-threads"], _positive_int),
    **dict.fromkeys(["--warmup-steps", "--seed", "--max-entries"], _non_negative_int),
    **dict.fromkeys(["--dropout", "--label-smoothing"], lambda v: math.isfinite(v) and 0 <= v < 1),
    **dict.fromkeys(["--lr", "--temperature"], lambda v: math.isfinite(v) and v > 0),
    **dict.fromkeys(["--min-lr", "--weight-decay", "--clip-norm", "--length-penalty"],
                    lambda v: math.isfinite(v) and v >= 0),
    "--target": math.isfinite,
}
accepted = []                                    # the parsed arguments of the last accepted run


def _check_model_and_training(args):
    model = nf.Transformer(10, 10, **model_kwargs(args))
    model.forward(np.array([[3]]), np.array([[1]]))
    config = TrainConfig(**train_kwargs(args))
    make_schedule(config, 10)(1)


def _check_toy(args):
    _check_model_and_training(args)
    accepted.append(args)
    return 0


def _check_train(args):
    train.fill_defaults(args, train.dataset_name(args))
    _check_model_and_training(args)
    accepted.append(args)
    return 0


def _check_translate(args):
    translate.check_options(args)
    accepted.append(args)
    return 0


def _check_eval(args):
    evaluate.check_options(args)
    accepted.append(args)
    return 0


def _gradcheck(args):
    accepted.append(args)
    return 0


@pytest.fixture
def checking_only(monkeypatch):
    # the size check compares with this machine's memory: pin it, so a value such as
    # --max-len 10**9 is refused on any host, never allocated on a large one
    monkeypatch.setattr(common, "physical_memory", lambda: 8 << 30)
    for module, check in ((toy, _check_toy), (train, _check_train), (translate, _check_translate),
                          (evaluate, _check_eval), (gradcheck, _gradcheck)):
        monkeypatch.setattr(module, "run", check)


def argv_for(command, option, value, tmp):
    pair = [option, value]
    if command == "toy":
        return ["toy", "--out", tmp, *pair]
    if command == "train":
        return ["train", "--dataset", "toy", "--out", tmp, *pair]
    if command == "translate":
        method = (["--sample"] if option in ("--temperature", "--top-k", "--seed") else
                  ["--beam", "2"] if option == "--length-penalty" else [])
        return ["translate", "--checkpoint", "ckpt", *method, *pair, "a sentence"]
    if command == "eval":
        beam = ["--beam", "2"] if option == "--length-penalty" else []
        return ["eval", "--checkpoint", "ckpt", "--src", "s", "--ref", "r", *beam, *pair]
    if option == "--blas-threads":                   # a top-level option
        return [*pair, "gradcheck"]
    return ["gradcheck", *pair]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choice=st.sampled_from(OPTIONS), value=st.sampled_from(VALUES))
def test_numeric_options_never_end_in_a_traceback(checking_only, capsys, tmp_path, choice, value):
    command, option = choice
    capsys.readouterr()
    accepted.clear()
    try:
        code = main(argv_for(command, option, value, str(tmp_path / "run")))
    except SystemExit as e:
        code = e.code
        assert code == 2, (option, value, code)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, (option, value, err)
    if code == 0:
        [args] = accepted
        parsed = getattr(args, option.lstrip("-").replace("-", "_"))
        assert DOMAIN[option](parsed), (option, value, parsed)
        return
    assert code in (1, 2), (option, value, code)
    lines = err.strip().splitlines()
    assert len(lines) == 1, (option, value, err)
    # the model's own checks (d_model a multiple of n_heads) name its parameter: fine
    names = (option, option.lstrip("-").replace("-", "_"))
    assert any(name in lines[0] for name in names), (option, value, lines[0])
