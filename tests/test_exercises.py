"""npformer exercises: the files start writes, the checker's verdicts and hints, the bad inputs
of the issue (each a one-line message and a non-zero exit), the backend built from a learner's
pairs, and the --train finale with the reference solutions against npformer toy."""
import json
import re
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from npformer import backend
from npformer.cli.exercises import print_table
from npformer.cli.main import main
from npformer.exercises import EXERCISES, check_exercise, check_folder, find
from npformer.exercises.finale import refuse_unfinished, run_finale
from npformer.exercises.templates import solution_source, start

ROOT = Path(__file__).resolve().parent.parent


def solve(folder, names=None):
    """Put the reference solution into the learner's files (all, or ``names``)."""
    for e in EXERCISES:
        if names is None or e.name in names:
            (Path(folder) / e.file).write_text(solution_source(e))


def write(folder, name, code):
    """The learner's file of exercise ``name``: the reference solution's module, with ``code``
    (a wrong backward, say) defined after it; or, ``code`` a tuple of (old, new) pairs, the
    solution's text with each ``old`` (found once) replaced by ``new``."""
    e = find(name)
    if isinstance(code, tuple):
        text = solution_source(e)
        for old, new in code:
            assert text.count(old) == 1, (name, old)
            text = text.replace(old, new)
    else:
        text = (f"from npformer.exercises.solutions.{e.module} import *\n"
                f"import numpy as np\n" + textwrap.dedent(code))
    (Path(folder) / e.file).write_text(text)


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "ex"
    start(path)
    return path


@pytest.fixture
def solved(folder):
    solve(folder)
    return folder


def alive(pid):
    """The process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def one_line_error(capsys, argv):
    """Run the CLI, expect exit 1 and one line on stderr; return that line."""
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# -- list and start ----------------------------------------------------------------------------

def test_list_names_every_exercise(capsys):
    assert main(["exercises", "list"]) == 0
    out = capsys.readouterr().out
    for e in EXERCISES:
        assert e.name in out and e.file in out
    assert {"linear", "embedding", "dropout", "layernorm", "rmsnorm", "softmax", "swiglu",
            "attention", "multi_head_attention", "residual", "cross_entropy",
            "adam", "layernorm_staged", "rmsnorm_staged", "attention_staged",
            "cross_entropy_staged"} == {e.name for e in EXERCISES}


def test_start_writes_each_exercise_with_its_backward_to_write(folder):
    backprop = (ROOT / "docs" / "backprop.md").read_text()
    headings = {line[3:].strip() for line in backprop.splitlines() if line.startswith("## ")}
    for e in EXERCISES:
        text = (folder / e.file).read_text()
        assert e.derivation in text and e.section in headings
        assert "Shapes" in text or "shape" in text
        assert text.count("raise NotImplementedError") == (0 if e.staged else len(e.writes))
        assert "# --- your code ---" not in text
        compile(text, e.file, "exec")
    assert (folder / "README.md").read_text().count("npformer exercises check") >= 3


def test_a_missing_backward_is_not_done_not_an_error(folder, capsys):
    results = check_folder(folder)
    assert [r.status for r in results] == ["not done"] * len(EXERCISES)
    assert main(["exercises", "check", str(folder)]) == 1
    out = capsys.readouterr().out
    assert f"progress: 0 of {len(EXERCISES)} done" in out
    assert len(re.findall(r"^\s+\d+a?\s+\w+\s+not done\s", out, re.M)) == len(EXERCISES)


def test_the_reference_solutions_pass(solved, capsys):
    results = check_folder(solved)
    assert all(r.status == "done" for r in results), [(r.name, r.status, r.message, r.hints)
                                                      for r in results if r.status != "done"]
    assert all(r.worst is not None and r.worst < 1e-6 for r in results)
    assert main(["exercises", "check", str(solved), "layernorm"]) == 0
    out = capsys.readouterr().out
    assert out.count("gradcheck PASS") == 1 and "likely mistake" not in out
    assert re.search(r"4\s+layernorm\s+done", out)


# -- each documented mistake, with its hint -------------------------------------------------------

# the reference Adam step's last five lines, the bias-corrected update that mistakes replace
ADAM_UPDATE = ("    step_size = lr / (1.0 - beta1 ** t)\n    denom = np.sqrt(v)\n"
               "    denom /= math.sqrt(1.0 - beta2 ** t)\n    denom += eps\n"
               "    p -= step_size * (m / denom)\n")
MISTAKES = {
    "linear: dW = X^T dY (transposed)": ("linear", """
        def linear_backward(dout, cache):
            x2, x_shape, w = cache
            d = dout.reshape(-1, dout.shape[-1])
            return (d @ w).reshape(x_shape), x2.T @ d, d.sum(axis=0)
        """, "transposed"),
    "linear: db summed over the batch axis only": ("linear", """
        def linear_backward(dout, cache):
            x2, x_shape, w = cache
            d = dout.reshape(-1, dout.shape[-1])
            return (d @ w).reshape(x_shape), d.T @ x2, dout.sum(axis=0)
        """, "sum over all the leading axes"),
    "embedding: dw[ids] += dout": ("embedding", (
        ("np.add.at(dw, flat_ids, flat_dout)", "dw[flat_ids] += flat_dout"),), "np.add.at"),
    "embedding: the scale forgotten": ("embedding", (
        ("    if scale != 1.0:\n        dw *= scale\n", ""),), "multiply by the forward's scale"),
    "embedding: the padding row gets a gradient": ("embedding", (
        ("    if padding_idx is not None:\n        dw[padding_idx] = 0\n", ""),),
        "padding row must get no gradient"),
    "dropout: the 1/(1-p) scale forgotten": ("dropout", """
        def dropout_backward(dout, cache):
            if cache is None:
                return dout
            keep, scale = cache
            return dout * keep
        """, "1/(1-p)"),
    "dropout: changes dout in place": ("dropout", """
        def dropout_backward(dout, cache):
            if cache is None:
                return dout
            keep, scale = cache
            dout *= keep * scale
            return dout
        """, "changed dout in place"),
    "layernorm: mu treated as a constant": ("layernorm", """
        def layernorm_backward(dout, cache):
            xhat, rstd, gamma = cache
            g = dout * gamma
            dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
            d = xhat.shape[-1]
            return dx, (dout * xhat).reshape(-1, d).sum(0), dout.reshape(-1, d).sum(0)
        """, "mu was treated as a constant"),
    "layernorm: sigma treated as a constant": ("layernorm", """
        def layernorm_backward(dout, cache):
            xhat, rstd, gamma = cache
            g = dout * gamma
            dx = rstd * (g - g.mean(axis=-1, keepdims=True))
            d = xhat.shape[-1]
            return dx, (dout * xhat).reshape(-1, d).sum(0), dout.reshape(-1, d).sum(0)
        """, "sigma was treated as a constant"),
    "layernorm: mu and sigma both treated as constants": ("layernorm", """
        def layernorm_backward(dout, cache):
            xhat, rstd, gamma = cache
            d = xhat.shape[-1]
            return rstd * dout * gamma, (dout * xhat).reshape(-1, d).sum(0), dout.reshape(-1, d).sum(0)
        """, "mu and sigma were both treated as constants"),
    "softmax: the Jacobian's diagonal only": ("softmax", """
        def softmax_backward(dout, cache):
            p = cache
            return p * dout - p * p * dout
        """, "the Jacobian's diagonal alone"),
    "layernorm: dgamma and dbeta swapped": ("layernorm", """
        def layernorm_backward(dout, cache):
            from npformer.exercises.solutions.layernorm import layernorm_backward as right
            dx, dgamma, dbeta = right(dout, cache)
            return dx, dbeta, dgamma
        """, "swapped"),
    "rmsnorm: r treated as a constant": ("rmsnorm", """
        def rmsnorm_backward(dout, cache):
            xhat, rstd, gamma, dtype = cache
            return rstd * dout * gamma, (dout * xhat).reshape(-1, xhat.shape[-1]).sum(0)
        """, "r was treated as a constant"),
    "rmsnorm: LayerNorm's mean term kept": ("rmsnorm", """
        def rmsnorm_backward(dout, cache):
            xhat, rstd, gamma, dtype = cache
            g = dout * gamma
            dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
            return dx, (dout * xhat).reshape(-1, xhat.shape[-1]).sum(0)
        """, "LayerNorm's - mean(g) term"),
    "softmax: the Jacobian's - p p^T part missing": ("softmax", """
        def softmax_backward(dout, cache):
            return cache * dout
        """, "p p^T part of the Jacobian"),
    "swiglu: silu' taken as sigmoid": ("swiglu", """
        def silu_backward(dout, cache):
            x, s = cache
            return dout * s
        """, "product rule"),
    "swiglu: the halves exchanged": ("swiglu", """
        def swiglu_backward(dout, cache):
            act, up, silu_cache = cache
            return np.concatenate([dout * act, silu_backward(dout * up, silu_cache)], axis=-1)
        """, "exchanged"),
    "attention: the scale forgotten": ("attention", (("    dscores *= scale\n", ""),),
                                       "scale was forgotten"),
    "attention: dv from P before dropout": ("attention", (
        ("probs_d.swapaxes(-1, -2) @ dout", "probs.swapaxes(-1, -2) @ dout"),), "P'^T dout"),
    "softmax: the factor p forgotten (masked entries get a gradient)": ("softmax", """
        def softmax_backward(dout, cache):
            return dout - (dout * cache).sum(axis=-1, keepdims=True)
        """, "masked entries"),
    "linear: dx doubled (a general pattern)": ("linear", """
        from npformer.exercises.solutions.linear import linear_backward as right
        def linear_backward(dout, cache):
            dx, dw, db = right(dout, cache)
            return 2 * dx, dw, db
        """, "2 times the right one"),
    "softmax: the sign flipped (a general pattern)": ("softmax", """
        def softmax_backward(dout, cache):
            return -cache * (dout - (dout * cache).sum(axis=-1, keepdims=True))
        """, "wrong sign"),
    "dropout: zeros returned (a general pattern)": ("dropout", """
        def dropout_backward(dout, cache):
            return np.zeros_like(dout)
        """, "all zeros"),
    "attention: the scale applied twice": ("attention", (
        ("    dscores *= scale\n", "    dscores *= scale * scale\n"),), "once too often"),
    "attention: P' passed to the softmax backward": ("attention", (
        ("softmax_backward(dprobs, probs)", "softmax_backward(dprobs, probs_d)"),),
        "the softmax backward got P'"),
    "multi-head attention: heads merged without the transpose": ("multi_head_attention", """
        def mha_backward(dout, cache):
            in_cache, attn_cache, out_cache, n_heads = cache
            dctx, dw_out, db_out = linear_backward(dout, out_cache)
            dq, dk, dv = attention_backward(split_heads(dctx, n_heads), attn_cache)
            b, h, t, d = dq.shape
            dqkv = np.concatenate([g.reshape(b, t, h * d) for g in (dq, dk, dv)], axis=-1)
            dx, dw_in, db_in = linear_backward(dqkv, in_cache)
            return dx, dw_in, db_in, dw_out, db_out
        """, "merged back to (B, T, D)"),
    "residual: post-norm's identity path carries dout": ("residual", (
        ("return dx + dz,", "return dx + dout,"),), "not dout itself"),
    "cross-entropy: not divided by the count": ("cross_entropy", (
        ("(valid * (dout / count))", "(valid * dout)"),), "divide by their count"),
    "cross-entropy: smoothing's eps / V forgotten": ("cross_entropy", (
        ("    if eps:\n        grad -= eps / vocab\n", ""),), "eps / V on every class"),
    "adam: the corrected moments stored": ("adam", (
        (ADAM_UPDATE, "    m /= 1.0 - beta1 ** t\n    v /= 1.0 - beta2 ** t\n"
                      "    p -= lr * m / (np.sqrt(v) + eps)\n"),), "stored bias-corrected"),
    "adam: the paper's efficient form": ("adam", (
        (ADAM_UPDATE, "    p -= lr * math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t) * m / "
                      "(np.sqrt(v) + eps)\n"),), "efficient"),
    "adam: L2 and decoupled decay swapped": ("adam", """
        from npformer.exercises.solutions.adam import adam_step as right
        def adam_step(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay, decoupled):
            right(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay, not decoupled)
        """, "AdamW (decoupled) shrinks"),
    "residual: the identity path dropped": ("residual", (
        ("return dx + dout,", "return dx,"), ("return dx + dz,", "return dx,")), "identity path"),
    "cross-entropy: divided by all rows, ignored ones included": ("cross_entropy", (
        ("(valid * (dout / count))", "(valid * (dout / n))"),), "divided by every row"),
    "cross-entropy: ignored rows keep a gradient": ("cross_entropy", (
        ("(valid * (dout / count))", "(dout / count + 0 * valid)"),), "ignored rows must get zero"),
    "adam: no bias correction": ("adam", (
        (ADAM_UPDATE, "    p -= lr * m / (np.sqrt(v) + eps)\n"),), "bias correction"),
    "adam: eps inside the square root": ("adam", (
        ("denom = np.sqrt(v)", "denom = np.sqrt(v + eps)"), ("    denom += eps\n", "")),
        "outside the square root"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_documented_mistake_fails_with_its_hint(folder, mistake):
    name, code, hint = MISTAKES[mistake]
    write(folder, name, code)
    result = check_exercise(folder, name)
    assert result.status == "WRONG", (result.status, result.message)
    levels = [[h, *result.more.get(h, [])] for h in result.hints]     # symptom, idea, formula
    assert any(hint in text for level in levels for text in level), levels


@pytest.mark.parametrize("mistake, named, not_named", [
    ("layernorm: mu and sigma both treated as constants", "both treated as constants",
     "mu was treated as a constant"),
    ("softmax: the Jacobian's diagonal only", "diagonal alone", "- p p^T part")])
def test_the_mistakes_once_missed_are_named_alone(folder, mistake, named, not_named):
    """Both LayerNorm constants (once named as mu alone) and softmax's diagonal-only Jacobian
    (once no hint at all) are named, and no neighbouring mistake with them."""
    name, code, _ = MISTAKES[mistake]
    write(folder, name, code)
    result = check_exercise(folder, name)
    ideas = " ".join(" ".join(result.more.get(h, [])) for h in result.hints)
    assert named in " ".join(result.hints) + ideas and not_named not in ideas, result.hints
    assert len(result.hints) == 1, result.hints


def test_every_named_mistake_has_three_levels_each_a_step_further():
    """The symptom and where to look, the idea, the formula: three different texts, and the
    formula not given away before the last."""
    from npformer.exercises.catalogue import ADAM_HINTS, PADDING_ROW, as_mistake
    mistakes = [as_mistake(h) for e in EXERCISES for h in e.hints] + [
        *ADAM_HINTS.values(), PADDING_ROW]
    assert len(mistakes) >= 30
    for m in mistakes:
        assert all(m.levels) and len(set(m.levels)) == 3, m
        assert "look at" in m.symptom and m.formula not in m.symptom + m.idea, m


EMBEDDING_OVERWRITES = """
    def embedding_backward(dout, cache, padding_idx=None):
        ids, w_shape, scale = cache
        dw = np.zeros(w_shape)
        dw[ids] += dout * scale
        if padding_idx is not None:
            dw[padding_idx] = 0
        return dw
    """


def test_check_gives_the_symptom_hint_the_idea_and_hint_2_the_formula(folder, capsys):
    write(folder, "embedding", EMBEDDING_OVERWRITES)
    seen = []
    for extra in ([], ["--hint"], ["--hint", "2"]):
        assert main(["exercises", "check", str(folder), "embedding", *extra]) == 1
        seen.append(capsys.readouterr().out)
    symptom, idea, formula = seen
    assert "likely mistake: only the rows of ids that occur more than once are wrong" in symptom
    assert "idea:" not in symptom and "np.add.at" not in symptom and "more: --hint 1" in symptom
    assert "idea: dw[ids] += dout is dw[ids] = dw[ids] + dout" in idea
    assert "np.add.at" not in idea and "more: --hint 2 gives the formula" in idea
    assert "formula: np.add.at(dw, " in formula and "more: --hint" not in formula


def test_hint_out_of_range_is_a_usage_error_and_a_done_exercise_needs_none(solved, capsys):
    for value in ("7", "0", "x"):
        with pytest.raises(SystemExit) as e:
            main(["exercises", "check", str(solved), "linear", "--hint", value])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, err
        assert "argument --hint: expected 1 (the idea) or 2 (the formula)" in err, err
    assert main(["exercises", "check", str(solved), "linear", "--hint"]) == 0
    assert capsys.readouterr().out == "linear is done: no hint needed\n"
    err = one_line_error(capsys, ["exercises", "check", str(solved), "--hint"])
    assert "--hint: only for one exercise" in err and "NAME --hint" in err


def test_dk_without_the_transpose_fails_by_shape(folder):
    """docs/backprop.md: dK = c dS q runs only when T_q = T_k; the check's T_q != T_k makes it
    fail, naming the function and the line."""
    write(folder, "attention", """
        def attention_backward(dout, cache):
            q, k, v, probs, probs_d, drop, scale = cache
            dv = probs_d.swapaxes(-1, -2) @ dout
            ds = softmax_backward(dropout_backward(dout @ v.swapaxes(-1, -2), drop), probs) * scale
            return ds @ k, ds @ q, dv
        """)
    result = check_exercise(folder, "attention")
    assert result.status == "error"
    assert re.match(r"08_attention.py line \d+: attention_backward raised ValueError", result.message)


def test_adam_with_t_from_zero_says_where_t_starts(folder):
    write(folder, "adam", """
        def adam_step(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay, decoupled):
            m += (1.0 - beta1) * (g - m)
            v *= beta2
            v += (1.0 - beta2) * g * g
            p -= lr / (1.0 - beta1 ** (t - 1)) * m / (np.sqrt(v) + eps)
        """)
    result = check_exercise(folder, "adam")
    assert result.status == "error" and "ZeroDivisionError" in result.message
    assert "t starts at 1" in result.message


def test_a_right_backward_written_differently_passes_without_hints(folder):
    write(folder, "softmax", """
        def softmax_backward(dout, cache):
            p = cache
            s = np.einsum("...k,...k->...", dout, p)[..., None]
            return p * dout - p * s
        """)
    result = check_exercise(folder, "softmax")
    assert result.status == "done" and not result.hints


# -- bad input: one line, non-zero exit -----------------------------------------------------------

def test_start_into_a_non_empty_folder_is_refused_and_never_overwrites(folder, capsys):
    mine = folder / find("linear").file
    mine.write_text("# my own work\n")
    (folder / find("adam").file).unlink()
    err = one_line_error(capsys, ["exercises", "start", str(folder)])
    assert "not empty" in err and "--overwrite" in err
    assert main(["exercises", "start", str(folder), "--overwrite"]) == 0
    assert mine.read_text() == "# my own work\n"                       # kept
    assert (folder / find("adam").file).exists()                       # the missing one, written
    assert "kept" in capsys.readouterr().out
    file = folder.parent / "a_file"
    file.write_text("x")
    assert "is a file" in one_line_error(capsys, ["exercises", "start", str(file)])


def test_check_refuses_a_folder_that_is_not_an_exercise_folder(tmp_path, capsys):
    err = one_line_error(capsys, ["exercises", "check", str(tmp_path)])
    assert "not an exercise folder" in err
    err = one_line_error(capsys, ["exercises", "check", str(tmp_path / "absent")])
    assert "not a folder" in err
    err = one_line_error(capsys, ["exercises", "check", str(tmp_path), "nonsense"])
    assert "NAME" in err


def test_syntax_error_raise_wrong_count_and_loop_each_one_line(folder, capsys):
    linear = folder / find("linear").file
    typo = "return dout +* 2  # a typo\n    raise NotImplementedError"
    linear.write_text(linear.read_text().replace("raise NotImplementedError", typo))
    line = next(i for i, text in enumerate(linear.read_text().splitlines(), 1) if "+*" in text)
    err = one_line_error(capsys, ["exercises", "check", str(folder), "linear"])
    assert f"01_linear.py line {line}: syntax error" in err

    write(folder, "dropout", """
        def dropout_backward(dout, cache):
            return dout / 0 if cache is None else dout[cache]
        """)
    err = one_line_error(capsys, ["exercises", "check", str(folder), "dropout"])
    assert "03_dropout.py line" in err and "dropout_backward raised" in err

    write(folder, "layernorm", """
        def layernorm_backward(dout, cache):
            return dout, dout.sum(0)
        """)
    err = one_line_error(capsys, ["exercises", "check", str(folder), "layernorm"])
    assert "returned 2 values; expected 3 (dx, dgamma, dbeta)" in err

    write(folder, "softmax", """
        def softmax_backward(dout, cache):
            while True:
                pass
        """)
    err = one_line_error(capsys, ["exercises", "check", str(folder), "softmax", "--timeout", "2"])
    assert "still running after 2 s" in err


def test_a_loop_or_a_dead_checker_in_one_exercise_does_not_stop_the_others(folder):
    solve(folder, ["linear"])
    write(folder, "embedding", """
        import time
        def embedding_backward(dout, cache, padding_idx=None):
            time.sleep(60)
        """)
    write(folder, "dropout", """
        import os
        os._exit(3)
        """)
    results = check_folder(folder, ["embedding", "dropout", "linear"], timeout=2)
    assert [r.status for r in results] == ["timed out", "error", "done"]
    assert "ended the checker (exit status 3)" in results[1].message


# -- the limits, held from outside the learner's code ----------------------------------------------

def test_time_limit_and_memory_out_of_range_are_usage_errors(folder, capsys):
    for flag, value, expected in (("--timeout", "1e18", "(0, 86400]"), ("--timeout", "0", "(0, 86400]"),
                                  ("--memory", "0", "[1, 1073741824]"),
                                  ("--memory", str(2 ** 40), "[1, 1073741824]")):
        with pytest.raises(SystemExit) as e:
            main(["exercises", "check", str(folder), flag, value])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, err
        assert f"argument {flag}: expected" in err and expected in err, err
    with pytest.raises(ValueError, match="timeout: expected a finite number in"):
        check_folder(folder, timeout=1e18)
    err = one_line_error(capsys, ["exercises", "check", str(folder), "--train-timeout", "5"])
    assert "--train-timeout: only with --train" in err


def test_a_backward_that_ignores_the_alarm_is_stopped_from_outside(folder):
    """The limit is the parent's: a backward that switches the child's alarm off is killed a
    few seconds past it."""
    write(folder, "linear", """
        import signal, time
        def linear_backward(dout, cache):
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            while True:
                time.sleep(0.05)
        """)
    start_time = time.monotonic()
    result = check_folder(folder, ["linear"], timeout=1)[0]
    assert result.status == "timed out" and "still running after 1 s" in result.message
    assert time.monotonic() - start_time < 20


def test_a_process_the_learner_forks_is_killed_with_the_check(folder, tmp_path):
    pid_file = tmp_path / "pid"
    write(folder, "linear", f"""
        import os, time
        from npformer.exercises.solutions.linear import linear_backward as right
        def linear_backward(dout, cache):
            if not os.path.exists({str(pid_file)!r}):
                pid = os.fork()
                if pid == 0:                       # the forked process: it holds the pipe too
                    time.sleep(40)
                    os._exit(0)
                with open({str(pid_file)!r}, "w") as f:
                    f.write(str(pid))
            return right(dout, cache)
        """)
    start_time = time.monotonic()
    result = check_folder(folder, ["linear"], timeout=5)[0]
    assert result.status == "done"
    assert time.monotonic() - start_time < 20
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_memory_past_the_limit_is_one_line(folder):
    write(folder, "linear", """
        def linear_backward(dout, cache):
            return np.ones(2 ** 26), 0, 0                  # 512 MiB
        """)
    result = check_folder(folder, ["linear"], memory=100)[0]
    assert result.status == "error"
    assert "linear_backward used more than 100 MiB of memory" in result.message, result.message


def test_a_learners_keyboard_interrupt_or_memory_error_is_one_line(folder, capfd):
    write(folder, "linear", """
        def linear_backward(dout, cache):
            raise KeyboardInterrupt
        """)
    write(folder, "dropout", """
        def dropout_backward(dout, cache):
            raise MemoryError("no room")
        """)
    results = check_folder(folder, ["linear", "dropout"])
    assert [r.status for r in results] == ["error", "error"]
    assert re.match(r"01_linear.py line \d+: linear_backward raised KeyboardInterrupt",
                    results[0].message), results[0].message
    assert "dropout_backward used more than" in results[1].message, results[1].message
    assert "Traceback" not in capfd.readouterr().err


# -- a forward that is not the given one -----------------------------------------------------------

FORWARD_CHANGES = {
    "attention: the scale 1 instead of 1/sqrt(d_k) (the backward reads it from the cache)": (
        "attention", (("scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0"),)),
    "linear: the bias left out of the forward, db = 0": ("linear", """
        def linear_forward(x, w, b=None):
            x2 = x.reshape(-1, x.shape[-1])
            return (x2 @ w.T).reshape(*x.shape[:-1], w.shape[0]), (x2, x.shape, w)
        def linear_backward(dout, cache):
            x2, x_shape, w = cache
            d = dout.reshape(-1, dout.shape[-1])
            return (d @ w).reshape(x_shape), d.T @ x2, np.zeros(w.shape[0])
        """),
    "linear: the forward returns 0 * y, the gradients are zeros": ("linear", """
        from npformer.exercises.solutions.linear import linear_forward as given
        def linear_forward(x, w, b=None):
            y, cache = given(x, w, b)
            return 0 * y, cache
        def linear_backward(dout, cache):
            x2, x_shape, w = cache
            return np.zeros(x_shape), np.zeros_like(w), np.zeros(w.shape[0])
        """),
    "dropout: the cache's scale changed, the output kept": ("dropout", """
        from npformer.exercises.solutions.dropout import dropout_forward as given
        def dropout_forward(x, p, rng, training=True):
            y, cache = given(x, p, rng, training)
            return y, None if cache is None else (cache[0], 1.0)
        def dropout_backward(dout, cache):
            return dout if cache is None else dout * cache[0] * cache[1]
        """),
}


def change_forward(folder, change):
    """Write the learner's file of ``change`` (of FORWARD_CHANGES): code after the reference
    solution's, or the solution with one line edited ((old, new),); returns the exercise's name."""
    name, code = FORWARD_CHANGES[change]
    write(folder, name, code)
    return name


@pytest.mark.parametrize("change", sorted(FORWARD_CHANGES))
def test_a_changed_forward_is_reported_before_the_backward_is_judged(folder, change):
    name = change_forward(folder, change)
    result = check_exercise(folder, name)
    assert result.status == "WRONG", (result.status, result.reports)
    assert any(h.startswith("your forward was changed") for h in result.hints), result.hints
    assert any(text.startswith("not checked: your forward was changed") for _, text in result.reports)


def test_a_changed_forward_shows_in_the_table_and_the_finale_refuses_it(folder, capsys):
    result = check_exercise(folder, change_forward(folder, sorted(FORWARD_CHANGES)[0]))
    print_table([result])
    assert re.search(r"8\s+attention\s+WRONG\s+forward", capsys.readouterr().out)
    with pytest.raises(ValueError, match=r"finish attention \(its forward was changed\)"):
        refuse_unfinished([result])


def test_the_table_says_shape_when_no_gradient_had_the_right_shape(folder, capsys):
    write(folder, "softmax", """
        def softmax_backward(dout, cache):
            return dout.sum(axis=-1)
        """)
    print_table([check_exercise(folder, "softmax")])
    assert re.search(r"6\s+softmax\s+WRONG\s+shape\s", capsys.readouterr().out)


# -- odd paths ---------------------------------------------------------------------------------------

def test_start_and_check_refuse_odd_paths_in_one_line(folder, tmp_path, capsys):
    err = one_line_error(capsys, ["exercises", "start", ""])
    assert err.endswith("DIR: expected the path of a folder, got an empty string")
    err = one_line_error(capsys, ["exercises", "check", ""])
    assert err.endswith("DIR: expected the path of a folder, got an empty string")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    err = one_line_error(capsys, ["exercises", "start", str(a_file / "sub")])
    assert f"{a_file} is a file, not a folder" in err and "Errno" not in err
    rmsnorm = folder / find("rmsnorm").file
    rmsnorm.unlink()
    rmsnorm.mkdir()
    err = one_line_error(capsys, ["exercises", "start", str(folder), "--overwrite"])
    assert f"{rmsnorm} is a folder, not the exercise file" in err
    assert rmsnorm.is_dir() and not any(rmsnorm.iterdir())         # nothing else was done
    result = check_exercise(folder, "rmsnorm")
    assert result.status == "error" and "05_rmsnorm.py: is a folder, not a file" in result.message
    rmsnorm.rmdir()
    rmsnorm.write_bytes(b"x = 1\n\0\n")
    result = check_exercise(folder, "rmsnorm")
    assert result.status == "error" and "None" not in result.message
    assert result.message.startswith("05_rmsnorm.py: contains NUL bytes"), result.message


# -- the backend built from a learner's pairs ------------------------------------------------------

def test_using_a_namespace_restores_the_backend_and_falls_back_to_the_reference():
    before = backend.get_backend()
    calls = []

    def my_softmax_forward(scores, mask=None):
        calls.append(1)
        return backend.load("numpy").softmax_forward(scores, mask)
    with backend.using({"softmax_forward": my_softmax_forward}, "exercises") as ops:
        assert backend.get_backend() == "exercises"
        ops.softmax_forward(np.zeros((2, 3)))
        assert ops.layernorm_forward is not None                   # the reference's
        assert backend.ops() is ops
    assert calls == [1] and backend.get_backend() == before
    with pytest.raises(ValueError, match="name"):
        with backend.using({}, "numba"):
            pass


# -- the finale ------------------------------------------------------------------------------------

EPOCHS = "3"


def test_finale_refuses_until_the_trained_exercises_are_done(folder, capsys):
    solve(folder, ["linear", "embedding"])
    err = one_line_error(capsys, ["exercises", "check", str(folder), "--train"])
    assert "finish dropout (not done)" in err


def test_finale_with_the_reference_solutions_matches_npformer_toy(solved, tmp_path, capsys):
    """The learner's namespace composes the fused names as the reference does, so with the
    reference solutions the run is npformer toy's on the NumPy backend, bit for bit."""
    assert main(["exercises", "check", str(solved), "--train", "--epochs", EPOCHS, "--quiet"]) == 0
    out = capsys.readouterr().out
    mine = {k: float(re.search(rf"{k} exact match\s+([0-9.]+)", out).group(1))
            for k in ("train", "held-out")}
    figures = tmp_path / "toy.json"
    before = backend.get_backend()
    backend.set_backend("numpy")
    try:
        assert main(["toy", "--epochs", EPOCHS, "--quiet", "--out", str(tmp_path / "toy"),
                     "--metrics-json", str(figures), "--examples", "0"]) == 0
    finally:
        backend.set_backend(before)
    toy = json.loads(figures.read_text())
    assert mine == {"train": round(toy["train_exact_match"], 4),
                    "held-out": round(toy["heldout_exact_match"], 4)}
    assert mine["train"] > 0.3                                     # it learned (chance is ~0)


def test_finale_with_a_subtle_bug_names_the_layer_to_look_at(solved, capsys):
    write(solved, "layernorm", (                                   # the variance term forgotten
        ("\n                 - xhat * (g * xhat).mean(axis=-1, keepdims=True))", ")"),))
    assert main(["exercises", "check", str(solved), "--train", "--epochs", "1", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "training anyway, although layernorm fails its checks" in out
    assert re.search(r"look at (en|de)coder\.\S*norm\S*: your layernorm_backward disagrees", out), out


FINALE_FAULTS = {
    "loops": ("while True:\n                    pass", "still running after 2 s"),
    "os._exit(0)": ("os._exit(0)", "your code ended the training process (exit status 0)"),
}


def linear_that_ends_on_a_training_batch(folder, code):
    """A linear_backward right on the checks' small batches that runs ``code`` on a training
    batch (more than 64 rows)."""
    write(folder, "linear", f"""
        import os, sys
        from npformer.exercises.solutions.linear import linear_backward as right
        def linear_backward(dout, cache):
            if dout.reshape(-1, dout.shape[-1]).shape[0] > 64:
                {code}
            return right(dout, cache)
        """)


@pytest.mark.parametrize("fault", sorted(FINALE_FAULTS))
def test_finale_runs_the_learners_code_in_a_child_with_a_time_limit(solved, fault, tmp_path,
                                                                     monkeypatch):
    """...and a child killed at its limit, or exiting at once, leaves no folder behind (the
    toy's run went into a temporary folder the child made, which a kill left)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))     # this process's temporary folders
    monkeypatch.setenv("TMPDIR", str(scratch))                 # and the child's
    code, expected = FINALE_FAULTS[fault]
    linear_that_ends_on_a_training_batch(solved, code)
    start_time = time.monotonic()
    result = run_finale(solved, epochs=1, train_timeout=2, checks=[])
    assert result.error.startswith(expected) and result.toy is None, result.error
    assert time.monotonic() - start_time < 30
    assert sorted(p.name for p in scratch.iterdir()) == []


def test_a_finale_killed_during_training_leaves_no_folder_behind(solved, tmp_path, monkeypatch):
    """A right linear backward that stops answering once training is under way (past the
    finale's first, verified step): the child is killed at --train-timeout inside the toy's
    run, whose folder the parent made and removes (one the child made itself stayed)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("TMPDIR", str(scratch))
    write(solved, "linear", """
        import itertools
        from npformer.exercises.solutions.linear import linear_backward as right
        calls = itertools.count()
        def linear_backward(dout, cache):
            if next(calls) > 300:          # well into training: stop answering
                while True:
                    pass
            return right(dout, cache)
        """)
    result = run_finale(solved, epochs=1, train_timeout=8, checks=[])
    assert result.error.startswith("still running after 8 s"), result.error
    assert sorted(p.name for p in scratch.iterdir()) == []


def test_finale_a_sys_exit_in_the_learners_code_is_a_failure(solved, capsys):
    linear_that_ends_on_a_training_batch(solved, "sys.exit(0)")
    assert main(["exercises", "check", str(solved), "--train", "--epochs", "1", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"training stopped: your code raised SystemExit: 0 \(01_linear.py line \d+",
                     out), out
