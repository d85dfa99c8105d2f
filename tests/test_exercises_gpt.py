"""``npformer exercises check DIR --train gpt`` (issue 79, "every exercise trains something"): a
character model of tiny Shakespeare trained with the learner's RMSNorm, SwiGLU, multi-head
attention, residual block, embedding, linear, cross-entropy and Adam, beside the same run with
the reference's; the same verification as the toy's, and the one download command when the
text is not there."""
import argparse
import re
from pathlib import Path

import pytest

from npformer.cli.exercises import run_gpt
from npformer.exercises.child import MEMORY
from npformer.exercises.finale import modules_of
from npformer.exercises.gpt import CONFIG, Text
from npformer.exercises.gpt_finale import preflight
from test_exercises import folder, one_line_error, solved, write  # noqa: F401  (the fixtures)

SHAKESPEARE = (Path(__file__).resolve().parent.parent.parent
               / "shared/data/tinyshakespeare/input.txt")
needs_text = pytest.mark.skipif(not SHAKESPEARE.is_file(),
                                reason=f"tiny Shakespeare is not at {SHAKESPEARE} (the local "
                                       f"mirror of npformer download tinyshakespeare)")
TINY = dict(CONFIG, d_model=16, n_heads=2, n_layers=1, d_ff=16, context=16, batch_size=4)


def usage_of(folder):
    """The findings and {function: Usage} of the learner's functions on a real step of a tiny
    model (the child's preflight, in this process)."""
    findings, usage = preflight(modules_of(folder, "gpt"), Text.read(SHAKESPEARE), TINY, 0)
    return findings, {u.function: u for u in usage}


def test_train_gpt_without_the_text_says_the_download_command(solved, tmp_path, monkeypatch,
                                                              capsys):
    monkeypatch.setenv("NPFORMER_DATA", str(tmp_path / "no-data"))
    err = one_line_error(capsys, ["exercises", "check", str(solved), "--train", "gpt"])
    assert "`npformer download tinyshakespeare`" in err and "not downloaded" in err
    assert capsys.readouterr().out == ""                       # nothing checked, nothing trained


def test_steps_and_epochs_belong_to_their_own_finale(solved, capsys):
    err = one_line_error(capsys, ["exercises", "check", str(solved), "--steps", "5"])
    assert "--steps: only with --train gpt" in err
    err = one_line_error(capsys, ["exercises", "check", str(solved), "--train", "gpt",
                                  "--epochs", "1"])
    assert "--epochs: only with --train (toy)" in err


@needs_text
def test_the_reference_passes_train_the_character_model_as_the_reference_run(solved, capsys):
    """With the reference solutions both runs are the same run, bit for bit, and the
    validation loss falls from the start's."""
    args = argparse.Namespace(dir=str(solved), seed=0, quiet=True, timeout=60.0,
                              train_timeout=None, memory=MEMORY, steps=20)
    assert run_gpt(args, [], SHAKESPEARE) == 0
    out = capsys.readouterr().out
    before, yours, ref = map(float, re.search(
        r"validation loss before training ([0-9.]+); after 20 steps: yours ([0-9.]+), the "
        r"reference's ([0-9.]+)", out).groups())
    assert yours == ref and yours < before - 0.5, out
    samples = re.findall(r"--- sample (after, your passes|after, the reference passes) ---\n"
                         r"(.*?)\n(?=---)", out, re.S)
    assert len(samples) == 2 and samples[0][1] == samples[1][1]
    assert "your own passes trained the character model." in out
    for name in ("rmsnorm_backward", "swiglu_backward", "mha_backward", "residual_backward",
                 "embedding_backward", "cross_entropy_backward", "adam_step"):
        assert re.search(rf"{name} \(\d+\s+calls?\)", out), name


@needs_text
def test_a_wrong_rmsnorm_is_blamed_where_it_runs(solved):
    write(solved, "rmsnorm", """
        def rmsnorm_backward(dout, cache):
            xhat, rstd, gamma, dtype = cache
            d = xhat.shape[-1]
            dx = rstd * dout * gamma                          # r treated as a constant
            return dx.astype(dtype), (dout * xhat).reshape(-1, d).sum(0).astype(gamma.dtype)
        """)
    findings, usage = usage_of(solved)
    assert findings[0].function == "rmsnorm_backward" and findings[0].layer == "head", findings
    assert usage["rmsnorm_backward"].status == "wrong"
    assert usage["mha_backward"].status == usage["residual_backward"].status == "agreed"


@needs_text
def test_a_wrong_linear_inside_a_right_mha_blames_the_linear(solved):
    write(solved, "linear", """
        from npformer.exercises.solutions.linear import linear_backward as right
        def linear_backward(dout, cache):
            dx, dw, db = right(dout, cache)
            return dx, 2 * dw, db                                   # dw twice too large
        """)
    findings, usage = usage_of(solved)
    assert {f.function for f in findings} == {"linear_backward"}, findings
    assert usage["mha_backward"].status == usage["residual_backward"].status == "agreed"


@needs_text
def test_an_inline_silu_leaves_silu_backward_unused(solved):
    write(solved, "swiglu", (("silu_backward(dout * up, silu_cache)", "(lambda g, c: g * (c[1] "
                              "* (1.0 + c[0] * (1.0 - c[1]))))(dout * up, silu_cache)"),))
    findings, usage = usage_of(solved)
    assert not findings
    assert usage["silu_backward"].status == "not used"
    assert usage["silu_backward"].reason == ("your swiglu_backward computes the silu backward "
                                             "itself (it never calls silu_backward)")
