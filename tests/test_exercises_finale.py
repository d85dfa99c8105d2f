"""The finales never lie (issue 79): before training, every learner function a finale trains
with runs on a real training batch beside the reference's, on the same inputs; the verdict
blames the first wrong function in the order the step ran, never counts a function that did
not run as trained, and says the success line only when every function that ran agreed."""
import argparse
import re

import pytest

from npformer.cli.exercises import report_toy, run_train
from npformer.exercises import find
from npformer.exercises.child import MEMORY
from npformer.exercises.finale import FinaleResult, ToySummary, modules_of, preflight
from npformer.exercises import gpt_finale
from npformer.exercises.learner import LearnerError
from npformer.exercises.gpt import Text
from npformer.exercises.namespace import FINALES
from npformer.exercises.templates import solution_source
from test_exercises import MISTAKES, folder, solved, write  # noqa: F401  (the fixtures)
from test_exercises_gpt import SHAKESPEARE, TINY

DIAGONAL_SOFTMAX = """
    def softmax_backward(dout, cache):
        p = cache
        return p * dout - p * p * dout                  # the Jacobian's diagonal only
    """


def finale(folder, capsys):
    """The toy finale's verdict on ``folder`` as the command line prints it, for a training that
    reached 1.000 / 1.000 (as the issue's wrong backward passes did): the exit status and the
    output. The real batch's run (preflight) is the child's, in this process."""
    findings, usage = preflight(modules_of(folder), 0, None, None)
    fitted = ToySummary(1.0, 1.0, 3000, 300, 1.0, 658, "epochs", [])
    code = report_toy(FinaleResult([], findings, usage, fitted))
    return code, capsys.readouterr().out


def inline_softmax_attention(folder):
    """The attention file as the learner writes it after reading the attention derivation: the
    softmax backward written out inline, softmax_backward never called."""
    write(folder, "attention", (("    dscores = softmax_backward(dprobs, probs)\n",
                                 "    dscores = probs * (dprobs - (dprobs * probs).sum(-1, "
                                 "keepdims=True))\n"),))


def used(out, status):
    """The function names the usage block lists under ``status``."""
    block = re.search(rf"^  {status}\s+(.*?)(?=^  \S|^$)", out, re.M | re.S)
    return set(re.findall(r"(\w+) \(\d+\s+calls?\)", block.group(1))) if block else set()


def test_embedding_that_loses_duplicates_is_blamed_and_the_fit_explained(solved, capsys):
    write(solved, "embedding", """
        def embedding_backward(dout, cache, padding_idx=None):
            ids, w_shape, scale = cache
            dw = np.zeros(w_shape, dtype=dout.dtype)
            dw[ids] += dout * scale                       # repeated ids: only one kept
            if padding_idx is not None:
                dw[padding_idx] = 0
            return dw
        """)
    code, out = finale(solved, capsys)
    assert code == 1, out
    assert re.search(r"look at \S*embed\S*: your embedding_backward disagrees", out), out
    assert "a wrong gradient can still lower the loss" in out
    assert "embedding_backward" in used(out, "wrong")
    assert "embedding_backward" not in used(out, "agreed")


def test_layernorm_without_the_mean_path_is_blamed(solved, capsys):
    write(solved, "layernorm", (                                   # no d(mu) path
        ("g - g.mean(axis=-1, keepdims=True)\n                 - xhat", "g - xhat"),))
    code, out = finale(solved, capsys)
    assert code == 1, out
    assert re.search(r"look at \S*norm\S*: your layernorm_backward disagrees", out), out
    assert "your own backward passes trained" not in out


def test_a_wrong_softmax_called_by_a_right_attention_is_blamed_not_the_attention(solved, capsys):
    write(solved, "softmax", DIAGONAL_SOFTMAX)
    code, out = finale(solved, capsys)
    assert code == 1, out
    assert re.search(r"look at \S*attn: your softmax_backward disagrees", out), out
    assert "attention_backward" in used(out, "agreed")
    assert used(out, "wrong") == {"softmax_backward"}
    assert "your own backward passes trained" not in out


def test_an_inline_softmax_leaves_softmax_backward_unused_and_untrained(solved, capsys):
    inline_softmax_attention(solved)
    code, out = finale(solved, capsys)
    assert code == 0, out
    assert ("softmax_backward: your attention_backward computes the softmax backward itself "
            "(it never calls softmax_backward); not trained with") in out
    assert "softmax_backward" not in used(out, "agreed") | used(out, "wrong")
    assert {"attention_backward", "softmax_forward", "adam_step"} <= used(out, "agreed")
    assert "Not trained with (not used by your other code): softmax_backward." in out


def test_a_wrong_function_never_called_is_neither_blamed_nor_trained(solved, capsys):
    """The issue's third case: the diagonal-only softmax, which the inline attention never
    calls, ended with 'your own backward passes trained the translator.' and no word of it."""
    write(solved, "softmax", DIAGONAL_SOFTMAX)
    inline_softmax_attention(solved)
    code, out = finale(solved, capsys)
    assert "softmax_backward: your attention_backward computes the softmax backward itself" in out
    assert "softmax_backward" not in used(out, "agreed") and "look at" not in out
    assert "Not trained with (not used by your other code): softmax_backward." in out
    assert code == 0, out


def test_the_command_line_finale_blames_the_wrong_softmax_after_training(solved, capsys):
    """The whole path: the child's preflight and training, the command line's verdict."""
    write(solved, "softmax", DIAGONAL_SOFTMAX)
    args = argparse.Namespace(dir=str(solved), seed=0, epochs=1, quiet=True, timeout=60.0,
                              train_timeout=None, memory=MEMORY)
    assert run_train(args, []) == 1
    out = capsys.readouterr().out
    assert "train exact match" in out
    assert re.search(r"look at \S*attn: your softmax_backward disagrees", out), out
    assert "attention_backward" in used(out, "agreed")


def test_the_optimizer_runs_the_learners_adam_step(solved, capsys):
    """Adam's update is the learner's adam_step in the finale, not chosen by the backend's name."""
    write(solved, "adam", """
        def adam_step(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay, decoupled):
            m += (1.0 - beta1) * (g - m)
            v *= beta2
            v += (1.0 - beta2) * g * g
            p -= lr * m / (np.sqrt(v) + eps)              # no bias correction
        """)
    code, out = finale(solved, capsys)
    assert code == 1, out
    assert "look at the optimizer: your adam_step disagrees" in out, out
    assert used(out, "wrong") == {"adam_step"}


# The planted mistakes (test_exercises.MISTAKES) that a finale's model never exercises: on every
# input it gives the function, the mistaken one computes the right thing, so it agrees there and
# only the check finds it.
UNSEEN = {            # the mistake: the finales that never exercise it, and why
    "adam: L2 and decoupled decay swapped": ({"toy", "gpt"}, "no weight decay"),
    "cross-entropy: divided by all rows, ignored ones included":
        ({"toy", "gpt"}, "no ignored target reaches the loss"),
    "cross-entropy: ignored rows keep a gradient": ({"toy", "gpt"}, "the same"),
    "cross-entropy: smoothing's eps / V forgotten": ({"gpt"}, "no label smoothing"),
    "embedding: the padding row gets a gradient": ({"toy", "gpt"}, "no gradient reaches it"),
    "embedding: the scale forgotten": ({"gpt"}, "scale 1"),
    "residual: post-norm's identity path carries dout": ({"gpt"}, "pre-norm only"),
}
PLANTED = [(m, f) for m in sorted(MISTAKES) for f in FINALES if MISTAKES[m][0] in FINALES[f]]


def mistaken(exercise, code):
    """The functions of ``exercise.writes`` that a MISTAKES entry's ``code`` plants a mistake in:
    those it defines, or (edits of the solution) those whose text an edit changes."""
    if isinstance(code, str):
        return set(re.findall(r"def (\w+)\(", code)) & set(exercise.writes)
    text = solution_source(exercise)
    return {re.findall(r"^def (\w+)\(", text[:text.index(old)], re.M)[-1] for old, _ in code} & \
        set(exercise.writes)


@pytest.mark.parametrize("mistake,finale", PLANTED)
def test_no_planted_mistake_is_counted_as_trained_and_blame_names_it(solved, mistake, finale):
    name, code, _ = MISTAKES[mistake]
    if finale == "gpt" and not SHAKESPEARE.is_file():
        pytest.skip(f"tiny Shakespeare is not at {SHAKESPEARE}")
    write(solved, name, code)
    exercise = find(name)
    planted = mistaken(exercise, code)
    try:
        if finale == "toy":
            findings, usage = preflight(modules_of(solved), 0, None, None)
        else:
            findings, usage = gpt_finale.preflight(modules_of(solved, "gpt"),
                                                   Text.read(SHAKESPEARE), TINY, 0)
    except LearnerError as e:                   # a gradient of the wrong shape: named, not run
        assert re.match(rf"your ({'|'.join(planted)}) gave \w+ of shape", str(e)), e
        return
    status = {u.function: u.status for u in usage}
    if finale in UNSEEN.get(mistake, ((),))[0]:
        assert not findings and all(status[f] == "agreed" for f in planted), status
        return
    assert planted and all(status[f] in ("wrong", "not used") for f in planted), status
    assert not findings or findings[0].function in planted, findings[0]
    assert findings or all(status[f] == "not used" for f in planted)
