"""Messages that named the wrong thing or nothing (issue 66, "smaller ones"): an --out under a
file, a training line longer than the model holds, an optimizer given no parameters."""
import time

import pytest

import npformer as nf
from npformer.cli.main import main
from npformer.nn.module import Module


def one_line_error(capsys, *names):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "Errno" not in err, err
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    return lines[0]


@pytest.mark.parametrize("command", ["toy", "train", "lm", "export", "average", "eval",
                                     "calibrate", "plot"])
def test_an_out_under_a_file_names_the_file(run_dir, tmp_path, capsys, command):
    """"[Errno 17] File exists" or "[Errno 20] Not a directory" before."""
    run, data = run_dir
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    src = tmp_path / "src.txt"
    src.write_text("".join(zh + "\n" for zh, _ in data.train[:3]), encoding="utf-8")
    out = str(notes / "sub" / "out")
    argv = {"toy": ["toy", "--epochs", "1"],
            "train": ["train", "--dataset", "toy", "--epochs", "1", "--quiet"],
            "lm": ["lm", "--data", str(src), "--max-steps", "1"],
            "export": ["export", "--checkpoint", str(run / "best"), "--format", "ctranslate2"],
            "average": ["average", str(run / "best"), str(run / "last")],
            "eval": ["eval", "--checkpoint", str(run / "best"), "--src", str(src),
                     "--ref", str(src)],
            "calibrate": ["calibrate"],
            "plot": ["plot", "--metrics", str(run / "metrics.jsonl")]}[command]
    assert main(argv + ["--out", out]) == 1
    one_line_error(capsys, f"--out {out}", f"{notes} is a file, not a folder")
    assert notes.read_text() == "mine\n"


def test_a_training_line_longer_than_the_model_names_the_file_the_line_and_max_len(tmp_path,
                                                                                  capsys):
    """It named "train_pairs[2]" before, after building the vocabularies and the model."""
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    src.write_text("a b c\nd e\n" + " ".join(["x"] * 10 ** 6) + "\nf g\n")
    tgt.write_text("A B\nD E\nX\nF G\n")
    start = time.monotonic()
    assert main(["train", "--src-file", str(src), "--tgt-file", str(tgt), "--out",
                 str(tmp_path / "run"), "--max-len", "16", "--epochs", "1", "--quiet"]) == 1
    one_line_error(capsys, f"line 3 of {src}", "1,000,000 tokens", "max_len=16", "--max-len")
    assert time.monotonic() - start < 10
    tgt.write_text("A B\nD E\n" + " ".join(["X"] * 16) + "\nF G\n")     # 16 + <eos> > 16
    src.write_text("a b c\nd e\nx\nf g\n")
    assert main(["train", "--src-file", str(src), "--tgt-file", str(tgt), "--out",
                 str(tmp_path / "run"), "--max-len", "16", "--epochs", "1", "--quiet"]) == 1
    one_line_error(capsys, f"line 3 of {tgt}", "16 tokens", "<eos>", "max_len=16")
    assert not (tmp_path / "run").exists()


class NoParameters(Module):
    pass


@pytest.mark.parametrize("make", [lambda: nf.Adam([]), lambda: nf.AdamW([]),
                                  lambda: nf.Adam(NoParameters()),
                                  lambda: nf.AdamW(NoParameters(), weight_decay=0.1),
                                  lambda: nf.optim.clip_grad_norm(NoParameters(), 1.0),
                                  lambda: nf.optim.grad_norm([])])
def test_an_optimizer_without_parameters_says_so(make):
    """An AttributeError ('list' object has no attribute 'flat_params') or "expected one dtype
    for all parameters, got set()" before."""
    with pytest.raises(ValueError, match=r"^model: .*no parameters to (optimise|clip)"):
        make()


def test_an_optimizer_of_something_else_names_what_it_got():
    with pytest.raises(ValueError, match=r"^model: expected an npformer model .* got a str$"):
        nf.Adam("model")
