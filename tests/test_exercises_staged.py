"""npformer exercises, the staged ones (issue 79, "becoming a backprop ninja"): each layer's
forward as a chain of named intermediates, the gradient of every one checked against central
differences, the first wrong step named with the steps that use it."""
import json
import re

import numpy as np
import pytest

from npformer.cli.main import main
from npformer.exercises import EXERCISES, check_exercise, check_folder, find
from npformer.exercises.checker import MARKER
from npformer.exercises.learner import solution
from npformer.exercises.staged import Chain, Step
from npformer.exercises.templates import solution_source, start

STAGED = [e for e in EXERCISES if e.staged]
STEPS = [(e.name, name) for e in STAGED for name in e.chain.order]


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "ex"
    start(path)
    return path


def plant(folder, name, step, new_line):
    """The reference solution of ``name`` in the learner's file, the line of ``d{step}`` made
    ``new_line(expression)``."""
    e = find(name)
    pattern = re.compile(rf"^(\s*)d{step} = (.*?)(\s*#.*)?$", re.M)
    source = solution_source(e)
    assert len(pattern.findall(source)) == 1, step
    (folder / e.file).write_text(pattern.sub(
        lambda m: f"{m.group(1)}d{step} = {new_line(m.group(2))}", source))


def test_the_staged_exercises_come_before_the_fused_ones_and_keep_every_file_name():
    assert [e.name for e in STAGED] == ["layernorm_staged", "rmsnorm_staged", "attention_staged",
                                        "cross_entropy_staged"]
    names = [e.name for e in EXERCISES]
    for e, fused in zip(STAGED, ("layernorm", "rmsnorm", "softmax", "cross_entropy")):
        assert names.index(e.name) == names.index(fused) - 1
        assert e.file == f"{find(fused).number:02d}a_{e.name}.py" and e.key == f"{e.number}a"
        assert not e.trained                                   # the finale never requires them
    # the files of a folder made before the staged exercises keep their names
    assert [e.file for e in EXERCISES if not e.staged] == [
        "01_linear.py", "02_embedding.py", "03_dropout.py", "04_layernorm.py", "05_rmsnorm.py",
        "06_softmax.py", "07_swiglu.py", "08_attention.py", "09_multi_head_attention.py",
        "10_residual.py", "11_cross_entropy.py", "12_adam.py"]


@pytest.mark.parametrize("e", STAGED, ids=lambda e: e.name)
def test_each_chain_is_its_reference_forward(e):
    """The checker differentiates its own chain: it must compute what the forward the learner
    reads computes, value for value."""
    for case in e.cases(np.random.default_rng(0)):
        out, cache = case.forward(solution(e), *[x.copy() for x in case.inputs])
        values = e.chain.values(dict(zip(case.names, case.inputs)))
        assert np.allclose(out, values[e.chain.output], rtol=1e-12, atol=0)
        shared = [n for n in e.chain.order if n in cache]
        assert len(shared) >= len(e.chain.order) - 1
        for n in shared:
            assert np.allclose(cache[n], values[n], rtol=1e-12, atol=1e-300), n


def test_each_staged_exercise_is_solved_by_its_reference_chain(folder, capsys):
    for e in STAGED:
        (folder / e.file).write_text(solution_source(e))
    results = check_folder(folder, [e.name for e in STAGED])
    assert [r.status for r in results] == ["done"] * len(STAGED), [r.hints for r in results]
    assert all(r.worst < 1e-6 and not r.hints for r in results)
    assert main(["exercises", "check", str(folder), "layernorm_staged"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"4a\s+layernorm_staged\s+done", out)
    rows = re.findall(r"^\s+d(\w+)\s+exact\s", out, re.M)
    assert rows == list(find("layernorm_staged").chain.order)     # every step, in order


@pytest.mark.parametrize("name, step", STEPS, ids=[f"{n}-d{s}" for n, s in STEPS])
def test_a_mistake_planted_in_one_step_is_named_at_that_step(folder, name, step):
    e = find(name)
    plant(folder, name, step, lambda expression: f"({expression}) * 1.5")
    r = check_exercise(folder, name)
    assert r.status == "WRONG"
    after = e.chain.needs(step)
    first = f"first wrong step: d{step}" + (
        f"; the steps that use it: {', '.join(f'd{n}' for n in after)}" if after else "")
    assert first in r.reports[0][1].splitlines()
    assert r.hints[0].startswith(f"the first wrong step is d{step}: ")
    assert any(h.startswith(f"d{step} is 1.5 times the right one") for h in r.hints)


# (exercise, step, the step's wrong line, what the hint on that step says); ids below
CLASSIC = [
    ("layernorm_staged", "xc", 'dxhat * c["rstd"]', "through xhat only: xc is used by var"),
    ("layernorm_staged", "x", "dxc", "through xc only: x is used by mu"),
    ("rmsnorm_staged", "x", 'dxhat * c["rstd"]', "through xhat only: x is used by sq"),
    ("attention_staged", "e", "dz + 0 * dp", "through z only: e is used by p"),
    ("attention_staged", "e", 'dp / c["z"]', "through p only: e is used by z"),
    ("attention_staged", "q", 'dscores @ c["k"]', "is 2 times the right one"),
    ("cross_entropy_staged", "per_token", 'dout * c["valid"] / len(c["valid"])',
     "is 0.666667 times the right one"),
    ("cross_entropy_staged", "logp", '-dnll[:, None] * np.eye(vocab)[c["targets"]]',
     "through nll only: logp is used by smooth"),
    ("cross_entropy_staged", "logits", "dlogp", "through logp only: logits is used by e"),
]
CLASSIC_IDS = ["layernorm: dxc without the path through var", "layernorm: mu taken as a constant",
               "rmsnorm: dx without the path through sq", "attention: de through z only",
               "attention: the softmax's -p p^T part missing", "attention: the scale forgotten",
               "cross-entropy: divided by every row, not the real targets",
               "cross-entropy: smoothing's share left out",
               "cross-entropy: dlogits without the path through e"]


@pytest.mark.parametrize("name, step, line, hint", CLASSIC, ids=CLASSIC_IDS)
def test_a_classic_mistake_is_named_at_its_step(folder, name, step, line, hint):
    plant(folder, name, step, lambda _: line)
    r = check_exercise(folder, name)
    assert r.status == "WRONG" and r.hints[0].startswith(f"the first wrong step is d{step}: ")
    assert any(h.startswith(f"d{step} ") and hint in h for h in r.hints[1:]), r.hints


def test_a_step_of_the_wrong_shape_names_the_step_and_both_shapes(folder, capsys):
    plant(folder, "rmsnorm_staged", "sq", lambda _: 'dms / D')      # (2, 3, 1), not broadcast
    assert main(["exercises", "check", str(folder), "rmsnorm_staged"]) == 1
    out = capsys.readouterr().out
    assert "step sq: your dsq has shape (2, 3, 1); sq has shape (2, 3, 6)" in out
    assert "first wrong step: dsq; the steps that use it: dx" in out
    assert re.search(r"dgamma\s+exact", out) and re.search(r"dms\s+exact", out)


def test_steps_left_none_are_not_done_and_the_ones_written_are_checked(folder, capsys):
    r = check_exercise(folder, "layernorm_staged")           # the template: every step None
    assert r.status == "not done" and "no step written yet" in r.message and "dbeta" in r.message
    e = find("layernorm_staged")
    source = solution_source(e)
    for step in ("xc", "mu", "x"):
        source = re.sub(rf"^(\s*)d{step} = .*$", rf"\1d{step} = None", source, flags=re.M)
    (folder / e.file).write_text(source)
    r = check_exercise(folder, "layernorm_staged")
    assert r.status == "not done" and r.hints == []
    assert r.message == "5 of 8 steps written and right; still None: dxc, dmu, dx"
    assert "not written yet (None): dxc, dmu, dx" in r.reports[0][1]


def test_a_changed_forward_or_a_wrong_return_is_said_in_one_line(folder, capsys):
    e = find("layernorm_staged")
    path = folder / e.file
    path.write_text(solution_source(e).replace("(xc ** 2).mean(", "(xc ** 2).sum("))
    r = check_exercise(folder, "layernorm_staged")
    assert r.status == "WRONG" and r.note == "forward"
    assert "layernorm_staged_forward's output differs from the given forward's" in r.reports[0][1]
    path.write_text(solution_source(e).replace("dict(x=x, mu=mu,", "dict(x=x, mu=2 * mu,"))
    r = check_exercise(folder, "layernorm_staged")
    assert r.status == "WRONG" and r.note == "forward"
    assert "cache['mu'] differs from the given forward's" in r.reports[0][1]
    path.write_text(solution_source(e).replace("return dict(beta=dbeta, ", "return dict("))
    r = check_exercise(folder, "layernorm_staged")
    assert r.status == "error" and "without 'beta'" in r.message
    path.write_text(solution_source(e).replace("return dict(beta=dbeta,", "return [dbeta], dict("))
    r = check_exercise(folder, "layernorm_staged")
    assert r.status == "error" and "expected a dict of the gradients by name" in r.message
    for given, said in (('"text"', "returned a str for dbeta; expected an array"),
                        ("dbeta.astype(int)", "step beta: backward: the gradient of dbeta is int")):
        path.write_text(solution_source(e).replace("dict(beta=dbeta,", f"dict(beta={given},"))
        r = check_exercise(folder, "layernorm_staged")
        assert r.status == "error" and said in r.message, r.message


def test_a_folder_made_before_the_staged_exercises_keeps_working(folder, capsys):
    marker = folder / MARKER
    older = [e.file for e in EXERCISES if not e.staged]
    marker.write_text(json.dumps({"npformer_exercises": 1, "files": older}))
    for e in STAGED:
        (folder / e.file).unlink()
    (folder / "04_layernorm.py").write_text(solution_source(find("layernorm")))
    results = {r.name: r for r in check_folder(folder)}
    assert results["layernorm"].status == "done"
    for e in STAGED:
        assert results[e.name].status == "not done"
        assert "--overwrite adds it and keeps your files" in results[e.name].message
    assert main(["exercises", "start", str(folder), "--overwrite"]) == 0
    assert all((folder / e.file).is_file() for e in STAGED)
    assert (folder / "04_layernorm.py").read_text() == solution_source(find("layernorm"))


def test_a_chain_whose_order_is_not_the_backwards_is_refused():
    steps = (Step("h", ("x",), lambda x: 2 * x), Step("y", ("h",), lambda h: h * h))
    assert Chain(("x",), steps, ("h", "x")).check()
    with pytest.raises(ValueError, match=r"order: x comes before \['h'\]"):
        Chain(("x",), steps, ("x", "h")).check()
    with pytest.raises(ValueError, match="order: expected"):
        Chain(("x",), steps, ("x",)).check()


def test_the_fused_exercises_ask_to_simplify_their_staged_chain(folder):
    for e, fused in zip(STAGED, ("layernorm", "rmsnorm", "softmax", "cross_entropy")):
        assert f"Simplify (after {e.key}, {e.name}" in (folder / find(fused).file).read_text()
    assert "Simplify (after 6a, attention_staged" in (folder / find("attention").file).read_text()
