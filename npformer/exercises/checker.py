"""Checking a learner's exercise files: each exercise's cases through the gradient checker (the
Adam step against npformer's own update), a verdict, and the likely mistake where the error's
pattern shows it.

The learner's code runs in a child process (:mod:`npformer.exercises.runner`), each exercise
under a time limit, so that a file that loops, exits or crashes costs one line of the report
and nothing else. :func:`check_exercise` is what runs there; :func:`check_folder` starts the
child and reads its verdicts.
"""
import importlib
import importlib.util
import json
import math
import signal
from pathlib import Path

import numpy as np

from ..gradcheck import gradcheck
from .catalogue import ADAM_HINTS, ADAM_ZERO_DIVISION, EXERCISES, Context, as_mistake, factor, find
from .child import GRACE, MEMORY, STARTUP, TIMEOUT, check_limits, memory_message, run
from .learner import (ExerciseResult, LearnerError, NotDone, Timeout, call_learner, first_line,
                      forward_changed, learner_error, relative_error, solution)

MARKER = ".npformer-exercises"        # written by start: what makes a folder an exercise folder
ADAM_RTOL = 1e-12
STATUSES = ("done", "not done", "WRONG", "error", "timed out")


# -- the exercise folder ---------------------------------------------------------------------------

def check_path_given(folder):
    """ValueError for an empty DIR (which Path would take as the current folder)."""
    if str(folder) == "":
        raise ValueError("DIR: expected the path of a folder, got an empty string")


def check_folder_marker(folder):
    """ValueError unless ``folder`` is a folder ``npformer exercises start`` wrote."""
    check_path_given(folder)
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"DIR: {folder} is not a folder (make one with: npformer exercises "
                         f"start {folder})")
    if not (path / MARKER).is_file():
        raise ValueError(f"DIR: {folder} is not an exercise folder (it has no {MARKER}; make "
                         f"one with: npformer exercises start DIR)")


def learner_file(path):
    """The file to read for the exercise file ``path`` (``NN_name.py``): the notebook beside it
    (``NN_name.ipynb``, from ``start --notebook``) where that was saved after it, as Jupyter
    without jupytext's pairing saves the notebook alone; else ``path`` itself."""
    path = Path(path)
    notebook = path.with_suffix(".ipynb")
    if path.suffix != ".py" or not notebook.is_file() or path.is_dir():
        return path
    if path.is_file() and notebook.stat().st_mtime_ns <= path.stat().st_mtime_ns:
        return path
    return notebook


def notebook_code(path):
    """The Python code of the notebook ``path``: through jupytext where it is installed (its
    Markdown cells as comments, its magics commented out), else its code cells as they are."""
    try:
        import jupytext
    except ImportError:
        jupytext = None
    try:
        if jupytext is not None:
            return jupytext.writes(jupytext.read(str(path)), fmt="py:light")
        with open(path, encoding="utf-8") as f:
            cells = json.load(f)["cells"]
        return "\n\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                            for c in cells if c.get("cell_type") == "code")
    except Exception as e:           # not JSON, not a notebook: whatever the reader says
        raise LearnerError(f"{path.name}: cannot be read as a notebook: {first_line(e)}") from None


def load_learner(path):
    """The learner's file as a module (or the notebook beside it, where :func:`learner_file`
    picks it). LearnerError naming the file and line for a syntax error, the exception for
    one raised on import."""
    path = learner_file(path)
    if path.is_dir():
        raise LearnerError(f"{path.name}: is a folder, not a file (move it away, then "
                           f"npformer exercises start {path.parent} --overwrite writes the file)")
    if not path.is_file():
        raise LearnerError(f"{path.name}: missing (npformer exercises start "
                           f"{path.parent} --overwrite writes the missing files again)")
    name = f"npformer_exercise_{path.stem}"
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(path))
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    try:
        source = notebook_code(path) if path.suffix == ".ipynb" else path.read_text(encoding="utf-8")
        if "\0" in source:
            raise LearnerError(f"{path.name}: contains NUL bytes, so it cannot be parsed as "
                               f"Python source (was it saved as text?)")
        code = compile(source, str(path), "exec")
    except SyntaxError as e:
        where = f" line {e.lineno}" if e.lineno else ""
        raise LearnerError(f"{path.name}{where}: syntax error: {e.msg}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise LearnerError(f"{path.name}: cannot be read as Python source: {e}") from None
    try:
        exec(code, module.__dict__)
    except Timeout:
        raise
    except BaseException as e:
        raise learner_error(e, path, "", " on import") from None
    return module


# -- one exercise ----------------------------------------------------------------------------------

def check_exercise(folder, name, seed=0):
    """The :class:`ExerciseResult` of exercise ``name`` in ``folder`` (run in the child)."""
    exercise = find(name)
    path = learner_file(Path(folder) / exercise.file)
    read = "" if path.name == exercise.file else f"{path.name}, saved after {exercise.file}"
    result = _check_file(exercise, path, seed)
    result.read = read
    return result


def _check_file(exercise, path, seed):
    name = exercise.name
    try:
        if exercise.staged and not path.exists():
            raise NotDone(f"{exercise.file}: missing (a folder made before the staged exercises "
                          f"has none; npformer exercises start {path.parent} --overwrite adds it and "
                          f"keeps your files)")
        module = load_learner(path)
        needed = [*exercise.writes, *(f.replace("_backward", "_forward") for f in exercise.writes
                                      if f.endswith("_backward"))]
        missing = [f for f in needed if not callable(getattr(module, f, None))]
        if missing:
            raise LearnerError(f"{exercise.file}: defines no function {missing[0]} (the checker "
                               f"calls it by that name)")
        if exercise.cases is None:
            return _check_adam(module, exercise, path)
        if exercise.staged:
            from .stepcheck import check_staged
            return check_staged(module, exercise, path, seed)
        return _check_cases(module, exercise, path, seed)
    except NotDone as e:
        return ExerciseResult(name, "not done", str(e))
    except LearnerError as e:
        return ExerciseResult(name, "error", str(e))


def _expect(raw, case, fname, path):
    """The learner's return value as a tuple of ``case.returns`` values."""
    n = case.returns
    if n == 1:
        if isinstance(raw, (tuple, list)):
            if len(raw) != 1:
                raise LearnerError(f"{path.name}: {fname} returned {len(raw)} values; expected "
                                   f"one array ({case.labels[0]})")
            raw = raw[0]
        return (raw,)
    if not isinstance(raw, (tuple, list)):
        raise LearnerError(f"{path.name}: {fname} returned one value; expected {n} "
                           f"({', '.join(case.labels)})")
    if len(raw) != n:
        raise LearnerError(f"{path.name}: {fname} returned {len(raw)} values; expected {n} "
                           f"({', '.join(case.labels)})")
    return tuple(raw)


def _case_function(module, case, path, fname, checked=True):
    """gradcheck's fn for ``case`` on ``module`` (the learner's, or the reference solution);
    ``fn.seen["forward"]``: what its forward returned last, (out, cache); ``fn.seen["raw"]``:
    the values its backward returned last, before ``case.extra["view"]``."""
    seen = {}

    def fn(*xs):
        out, cache = (call_learner(path, fname.replace("backward", "forward"), case.forward, module, *xs)
                      if checked else case.forward(module, *xs))
        seen["forward"] = (out, cache)

        def back(dout):
            raw = (call_learner(path, fname, case.backward, module, dout, cache) if checked
                   else case.backward(module, dout, cache))
            values = _expect(raw, case, fname, path) if checked else tuple(
                raw if isinstance(raw, (tuple, list)) else (raw,))
            seen["raw"] = values
            if "view" in case.extra:                 # the gradients of the inputs checked
                values = case.extra["view"](values)
            full = [None] * len(xs)
            for i, g in zip(case.grads, values):
                if i is not None:
                    full[i] = g
            return tuple(full)
        return np.asarray(out, dtype=np.float64), back
    fn.seen = seen
    return fn


def _shape_hint(name, got, want):
    if len(got) == 2 and got == want[::-1] and got != want:
        return (f"the gradient of {name} has shape {got}, {name}'s transposed: a parameter's "
                f"gradient has its shape {want}")
    if len(got) > len(want) and got[len(got) - len(want):] == want:
        return (f"the gradient of {name} has shape {got}: {name} is used by every row, so sum "
                f"over all the leading axes (flatten them first) to get {want}")
    return f"the gradient of {name} has shape {got}; expected {want}"


def _check_cases(module, exercise, path, seed):
    reference = solution(exercise)
    fname = exercise.writes[-1] if len(exercise.writes) == 1 else None
    reports, hints, worst, note = [], [], None, ""
    named = ExerciseResult(exercise.name, "done")       # the catalogue's mistakes, by level
    status = "done"
    for k, case in enumerate(exercise.cases(np.random.default_rng(seed))):
        name_here = fname or _case_function_name(case, exercise)
        fn = _case_function(module, case, path, name_here)
        inputs = [x.copy() for x in case.inputs]
        out, back = fn(*inputs)
        changed = forward_changed(case, reference, fn.seen, name_here)
        if changed is not None:
            status, note = "WRONG", "forward"
            hint = (f"your forward was changed: {name_here.replace('backward', 'forward')} does "
                    f"not return what the given one returns; the backward is judged against "
                    f"the given forward, so put it back as it was")
            if hint not in hints:
                hints.append(hint)
            reports.append((case.label, "not checked: " + changed))
            continue
        dout = np.asarray(np.random.default_rng([seed, k]).standard_normal(out.shape))
        given = dout.copy()
        mine = back(given)
        problems, shapes = [], []
        require = case.extra.get("require")
        missing = require(fn.seen["raw"]) if require is not None else None
        if missing:                                      # a Mistake, or a text of one level
            missing = as_mistake((missing, None)) if isinstance(missing, str) else missing
            named.add_mistake(missing)
            problems.append(missing.symptom)
        dout_changed = not np.array_equal(given, dout)   # gradcheck would refuse it
        if dout_changed:
            problems.append(f"{name_here} changed dout in place: in the model the same dout also "
                            f"reaches other layers (the residual's identity path), so work on a copy")
        for i, (x, g) in enumerate(zip(inputs, mine)):
            if g is None:
                continue
            if not isinstance(g, np.ndarray) and not np.isscalar(g):
                raise LearnerError(f"{path.name}: {name_here} returned a {type(g).__name__} for "
                                   f"{case.names[i]}; expected an array")
            if np.shape(g) != x.shape:
                shapes.append(_shape_hint(case.names[i], np.shape(g), x.shape))
        for problem in problems + shapes:
            status = "WRONG"
            if problem not in hints:
                hints.append(problem)
        if shapes:
            note = note or "shape"
        if shapes or dout_changed:
            reports.append((case.label, "not checked: " + (shapes[0] if shapes else problems[-1])))
            continue
        try:
            result = gradcheck(fn, inputs, names=list(case.names), dout=dout, seed=seed)
        except ValueError as e:
            raise LearnerError(f"{path.name}: {name_here}: {e}") from None
        reports.append((case.label, str(result)))
        measured = [e for e in result.errors if e is not None]
        worst = (max([0.0 if worst is None else worst, *measured])
                 if not any(math.isnan(e) for e in measured) else math.nan)
        if not result.ok:
            status = "WRONG"
            for mistake in _hints(exercise, case, reference, path, name_here, inputs, dout, mine,
                                  result):
                named.add_mistake(mistake)
                if mistake.symptom not in hints:
                    hints.append(mistake.symptom)
    return ExerciseResult(exercise.name, status, "", reports, hints,
                          None if worst is None else float(worst), note, named.more)


def _case_function_name(case, exercise):
    """The function a case of a several-function exercise (swiglu) checks."""
    for f in exercise.writes:
        if case.label.startswith(f.replace("_backward", "")):
            return f
    return exercise.writes[-1]


def _hints(exercise, case, reference, path, fname, inputs, dout, mine, result):
    """The likely mistakes (:class:`Mistake`): the exercise's detectors, else the general
    patterns (one level each)."""
    fn = _case_function(reference, case, path, fname, checked=False)
    ref = fn(*[x.copy() for x in inputs])[1](dout.copy())
    names = list(case.names)
    ctx = Context(case, dict(zip(names, mine)), dict(zip(names, ref)),
                  {r.name for r in result.inputs if not r.ok}, dout)
    found = []
    for mistake in map(as_mistake, exercise.hints):
        try:
            if mistake.detector(ctx):
                found.append(mistake)
        except Exception:                 # a detector that cannot read this pattern says nothing
            continue
    if found:
        return found
    return [as_mistake((text, None)) for text in _general_patterns(names, ctx)]


def _general_patterns(names, ctx):
    """What any wrong gradient may show: NaN, zeros, the wrong sign, a constant factor."""
    found = []
    for name in names:                    # the general patterns
        if name not in ctx.wrong or ctx.mine.get(name) is None:
            continue
        a = np.asarray(ctx.mine[name], dtype=np.float64)
        if not np.isfinite(a).all():
            found.append(f"the gradient of {name} holds NaN or inf")
        elif not a.any():
            found.append(f"the gradient of {name} is all zeros")
        else:
            c = factor(a, ctx.ref[name])
            if c is not None and abs(c + 1) < 1e-6:
                found.append(f"the gradient of {name} has the wrong sign")
            elif c is not None:
                found.append(f"the gradient of {name} is {c:.6g} times the right one: a constant "
                             f"factor is missing or extra")
    return found


# -- Adam ------------------------------------------------------------------------------------------

ADAM_CONFIGS = (("Adam, no weight decay", 0.0, False), ("Adam, L2 weight decay 0.1", 0.1, False),
                ("AdamW, decoupled weight decay 0.1", 0.1, True))
ADAM_ARGS = dict(lr=1e-2, beta1=0.9, beta2=0.98, eps=1e-6)
ADAM_STEPS = 4


def _adam_variants():
    """The documented wrong updates, as (hint key, update function)."""
    def make(corrected=True, store=False, eps_inside=False, efficient=False):
        def update(p, g, m, v, t, lr, beta1, beta2, eps, wd, decoupled):
            if wd:
                if decoupled:
                    p *= 1.0 - lr * wd
                else:
                    g = g + wd * p
            m += (1.0 - beta1) * (g - m)
            v *= beta2
            v += (1.0 - beta2) * g * g
            c1, c2 = (1.0 - beta1 ** t, 1.0 - beta2 ** t) if corrected else (1.0, 1.0)
            if efficient:
                p -= lr * math.sqrt(c2) / c1 * m / (np.sqrt(v) + eps)
                return
            if store:
                m /= c1
                v /= c2
                p -= lr * m / (np.sqrt(v) + eps)
                return
            denom = np.sqrt(v + eps) / math.sqrt(c2) if eps_inside else np.sqrt(v) / math.sqrt(c2) + eps
            p -= lr / c1 * (m / denom)
        return update
    return (("no_bias_correction", make(corrected=False)), ("corrected_state", make(store=True)),
            ("eps_inside", make(eps_inside=True)), ("efficient_form", make(efficient=True)))


def _run_adam(update, state, grads, wd, decoupled, path=None):
    p, m, v = (a.copy() for a in state)
    for t, g in enumerate(grads, start=1):
        g_given = g.copy()
        if path is None:
            update(p, g_given, m, v, t, ADAM_ARGS["lr"], ADAM_ARGS["beta1"], ADAM_ARGS["beta2"],
                   ADAM_ARGS["eps"], wd, decoupled)
        else:
            call_learner(path, "adam_step", update, p, g_given, m, v, t, ADAM_ARGS["lr"],
                  ADAM_ARGS["beta1"], ADAM_ARGS["beta2"], ADAM_ARGS["eps"], wd, decoupled,
                  hints={ZeroDivisionError: ADAM_ZERO_DIVISION})
            if not np.array_equal(g_given, g):
                raise LearnerError(f"{path.name}: adam_step changed g in place: the gradient is "
                                   f"the model's buffer; put the L2 term into a copy "
                                   f"(g = g + wd * p)")
    return p, m, v


def _check_adam(module, exercise, path):
    from ..optim.adam import _adam_update
    rng = np.random.default_rng(0)
    state = (rng.standard_normal(7), np.zeros(7), np.zeros(7))
    grads = [rng.standard_normal(7) * 10.0 ** rng.uniform(-2, 1, size=7) for _ in range(ADAM_STEPS)]
    result = ExerciseResult(exercise.name, "done", worst=0.0)
    for label, wd, decoupled in ADAM_CONFIGS:
        want = _run_adam(_adam_update, state, grads, wd, decoupled)
        got = _run_adam(module.adam_step, state, grads, wd, decoupled, path)
        for a in got:
            if not isinstance(a, np.ndarray) or a.shape != (7,):
                raise LearnerError(f"{path.name}: adam_step must update p, m and v in place")
        errors = [relative_error(a, b) for a, b in zip(got, want)]
        ok = all(e <= ADAM_RTOL for e in errors)
        result.worst = max(result.worst, *errors)
        result.reports.append((label, f"adam {'PASS' if ok else 'FAIL'} after {ADAM_STEPS} steps "
                               f"(max |mine - npformer's| / max |npformer's| <= {ADAM_RTOL:.0e}): "
                        + ", ".join(f"{n} {e:.1e}" for n, e in zip("pmv", errors))))
        if ok:
            continue
        result.status = "WRONG"
        found = [key for key, update in _adam_variants()
                 if all(relative_error(a, b) <= 1e-9 for a, b in
                        zip(got, _run_adam(update, state, grads, wd, decoupled)))]
        if not found and not all(np.isfinite(a).all() for a in got):
            found = ["nan"]
        if not found and wd:                 # right without weight decay: the decay is wrong
            mine = _run_adam(module.adam_step, state, grads, 0.0, False, path)
            plain = _run_adam(_adam_update, state, grads, 0.0, False)
            if all(relative_error(a, b) <= ADAM_RTOL for a, b in zip(mine, plain)):
                found = ["decay"]
        for key in found:
            result.add_mistake(ADAM_HINTS[key])
    return result


# -- the child and its parent ----------------------------------------------------------------------



def run_child(folder, names, timeout, out):
    """Check ``names`` one after the other, each under ``timeout`` seconds, writing one JSON
    line per exercise to ``out`` (a "started" line before each, so that the parent knows which
    one a kill interrupted). The alarm here lets the next exercise run in the same child; the
    parent's kill, ``GRACE`` seconds later, is the limit."""
    def expire(signum, frame):
        raise Timeout()
    signal.signal(signal.SIGALRM, expire)
    for name in names:
        out.write(json.dumps({"started": name}) + "\n")
        out.flush()
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            result = check_exercise(folder, name)
        except Timeout:
            result = ExerciseResult(name, "timed out", _timed_out(name, timeout))
        except MemoryError:
            result = ExerciseResult(name, "error", f"{find(name).file}: {memory_message()}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        out.write(result.to_json() + "\n")
        out.flush()


def _timed_out(name, timeout):
    return f"{find(name).file}: still running after {timeout:g} s (an endless loop?)"


def check_folder(folder, names=None, timeout=TIMEOUT, memory=MEMORY):
    """The :class:`ExerciseResult` of each exercise ``names`` (all by default) of ``folder``,
    checked in a child process, each exercise under ``timeout`` seconds and ``memory`` MiB; a
    child that dies (or runs past its limit, then killed with its whole process group) costs
    the exercise it was checking, and a new one checks the rest. ValueError if ``folder`` is
    not an exercise folder or a limit is out of range."""
    timeout, memory = check_limits(timeout, memory)
    check_folder_marker(folder)
    names = [e.name for e in EXERCISES] if names is None else [find(n).name for n in names]
    results = {}
    while len(results) < len(names):
        left = [n for n in names if n not in results]
        got, started, code = _run_child(folder, left, timeout, memory)
        results.update(got)
        if started is not None and started not in results:
            results[started] = (ExerciseResult(started, "timed out", _timed_out(started, timeout))
                                if code is None else ExerciseResult(
                started, "error", f"{find(started).file}: ended the checker (exit status {code})"))
        elif not got:                             # the child never got to an exercise
            why = (f"did not start within {STARTUP:.0f} s (a machine this busy, or an "
                   f"import that hangs)" if code is None else f"could not start (exit status "
                                                              f"{code})")
            for n in left:
                results[n] = ExerciseResult(n, "error", f"the checker {why}")
    return [results[n] for n in names]


def _run_child(folder, names, timeout, memory):
    """({name: ExerciseResult}, the exercise it was on when it ended or None, exit status or
    None if killed) of one child checking ``names``."""
    results, started = {}, [None]

    def on_record(record):
        if "started" in record:
            started[0] = record["started"]
            return timeout + GRACE
        if "status" in record:
            results[record["name"]] = ExerciseResult.from_record(record)
            return GRACE
        return None
    code = run(["check", "--timeout", repr(float(timeout)), "--memory", str(memory), "--",
                str(folder), *names], on_record)
    return results, started[0], code
