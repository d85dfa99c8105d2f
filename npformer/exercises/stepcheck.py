"""Checking a staged exercise (:mod:`.staged`): the gradient of every named intermediate against
central differences, in the backward's order, and the first step that goes wrong.

For an intermediate v the checker differentiates the output as a function of v alone, every
value computed from v recomputed by the exercise's :class:`~.staged.Chain` and every other one
held (``Chain.suffix``): the central differences of that function are dL/dv in total, the
gradient the learner's line for v must give. The values are judged in the backward's order, each
after every value computed from it, so the first wrong one is the wrong line: the gradients it
is computed from were judged right before it. The values it feeds (``Chain.needs``) are named
as depending on it.
"""
import math
import numbers
from itertools import combinations

import numpy as np

from ..gradcheck import GradcheckResult, gradcheck, numerical_gradient
from .catalogue import close, factor
from .learner import ExerciseResult, LearnerError, NotDone, call_learner, forward_changed, solution


def check_staged(module, exercise, path, seed):
    """The :class:`~.checker.ExerciseResult` of a staged ``exercise`` on the learner's module."""
    chain, fname = exercise.chain, exercise.writes[0]
    reference = solution(exercise)
    reports, hints, worst, note = [], [], None, ""
    wrong, unwritten = False, set()
    for k, case in enumerate(exercise.cases(np.random.default_rng(seed))):
        inputs = [x.copy() for x in case.inputs]
        seen = {"forward": call_learner(path, fname.replace("backward", "forward"), case.forward,
                                 module, *inputs)}
        changed = forward_changed(case, reference, seen, fname)
        if changed is not None:
            wrong, note = True, "forward"
            _add(hints, f"your forward was changed: {fname.replace('backward', 'forward')} does "
                        f"not return what the given one returns; the steps are judged against "
                        f"the given chain, so put it back as it was")
            reports.append((case.label, "not checked: " + changed))
            continue
        out, cache = seen["forward"]
        dout = np.random.default_rng([seed, k]).standard_normal(np.shape(out))
        given = dout.copy()
        grads = _gradients(call_learner(path, fname, case.backward, module, given, cache), chain,
                           fname, path)
        if not np.array_equal(given, dout):
            wrong = True
            _add(hints, f"{fname} changed dout in place: in a model the same dout also reaches "
                        f"other layers, so work on a copy")
            reports.append((case.label, "not checked: dout was changed in place"))
            continue
        values = chain.values(dict(zip(case.names, case.inputs)))
        shapes = {name: _shape_problem(name, grads[name], values[name], path, fname)
                  for name in chain.order if grads[name] is not None}
        shapes = {name: text for name, text in shapes.items() if text}
        if shapes:
            note = note or "shape"
        results = {name: _judge(chain, name, values, grads[name], dout, seed, path, fname)
                   for name in chain.order if grads[name] is not None and name not in shapes}
        unwritten |= {name for name in chain.order if grads[name] is None}
        measured = [r.inputs[0].tensor_error for r in results.values()
                    if r.inputs[0].tensor_error is not None]
        if measured:
            worst = math.nan if any(math.isnan(e) for e in measured) else max([worst or 0.0,
                                                                               *measured])
        first = next((name for name in chain.order
                      if name in shapes or (name in results and not results[name].ok)), None)
        reports.append((case.label, _report(chain, results, shapes, first, grads)))
        if first is not None:
            wrong = True
            _add(hints, _first_wrong(chain, first, results, shapes))
            for text in shapes.values():
                _add(hints, text)
            if first in results:
                ref = case.backward(reference, dout.copy(), case.forward(
                    reference, *[x.copy() for x in case.inputs])[1])
                pattern = (_pattern(grads[first], ref[first])
                           or _some_uses_only(chain, first, values, grads[first], ref, dout))
                if pattern:
                    _add(hints, f"d{first} {pattern}")
    if wrong:
        return ExerciseResult(exercise.name, "WRONG", "", reports, hints, worst, note)
    if unwritten:
        left = [name for name in chain.order if name in unwritten]
        if len(left) == len(chain.order):
            raise NotDone(f"{fname}: no step written yet (every gradient is None; start with "
                          f"d{left[0]})")
        return ExerciseResult(exercise.name, "not done",
                              f"{len(chain.order) - len(left)} of {len(chain.order)} steps "
                              f"written and right; still None: "
                              + ", ".join(f"d{n}" for n in left), reports, hints, worst)
    return ExerciseResult(exercise.name, "done", "", reports, hints, worst)


def _add(hints, text):
    if text not in hints:
        hints.append(text)


def _gradients(raw, chain, fname, path):
    """The learner's {name: gradient or None}, one for each value of ``chain.order``."""
    if not isinstance(raw, dict):
        raise LearnerError(f"{path.name}: {fname} returned a {type(raw).__name__}; expected a "
                           f"dict of the gradients by name ({', '.join(chain.order)})")
    missing = [n for n in chain.order if n not in raw]
    extra = [n for n in raw if n not in chain.order]
    if missing or extra:
        raise LearnerError(f"{path.name}: {fname} returned a dict "
                           + (f"without {', '.join(map(repr, missing))}" if missing else "")
                           + (" and " if missing and extra else "")
                           + (f"with {', '.join(map(repr, extra))}, which is no step" if extra
                              else "")
                           + f"; expected the keys {', '.join(chain.order)}")
    return raw


def _shape_problem(name, g, value, path, fname):
    """None, or the line naming the step whose gradient is not shaped as its value."""
    if not isinstance(g, (np.ndarray, numbers.Real)):
        raise LearnerError(f"{path.name}: {fname} returned a {type(g).__name__} for d{name}; "
                           f"expected an array (or None, for a step not written yet)")
    got, want = np.shape(g), np.shape(value)
    if got == want:
        return None
    return (f"step {name}: your d{name} has shape {got}; {name} has shape {want} (a gradient "
            f"has the shape of its value" + (": sum over the axes that broadcasting added"
                                             if len(got) > len(want) else "") + ")")


def _judge(chain, name, values, g, dout, seed, path, fname):
    """gradcheck's verdict on the learner's dL/d(name) ``g``: the output as a function of the
    value of ``name`` alone, everything computed from it recomputed."""
    suffix = chain.suffix(name, values)

    def fn(v):
        return suffix(v), lambda d: (g,)
    try:
        return gradcheck(fn, [np.array(values[name], dtype=np.float64)], names=[f"d{name}"],
                         dout=dout, seed=seed)
    except ValueError as e:                      # a gradient gradcheck cannot take (integers)
        raise LearnerError(f"{path.name}: {fname}: step {name}: {e}") from None


def _report(chain, results, shapes, first, grads):
    """The case's report: one gradcheck row per step written, in the backward's order, the
    steps whose gradient has the wrong shape, the first wrong step and the steps that use it,
    and the steps not written yet."""
    done = list(results.values())
    lines = []
    if done:
        merged = GradcheckResult([r.inputs[0] for r in done], done[0].atol, done[0].rtol,
                                 done[0].eps, probe=done[0].probe,
                                 step=max(r.step or r.eps for r in done))
        lines.append(str(merged).replace("  input ", "  step  ", 1))
    lines += [f"not checked: {text}" for text in shapes.values()]
    if first is not None:
        after = chain.needs(first)
        lines.append(f"first wrong step: d{first}" + (
            f"; the steps that use it: {', '.join(f'd{n}' for n in after)}" if after else ""))
    left = [n for n in chain.order if grads[n] is None]
    if left:
        lines.append("not written yet (None): " + ", ".join(f"d{n}" for n in left))
    return "\n".join(lines)


def _first_wrong(chain, name, results, shapes):
    """The hint for the first wrong step: its own line is wrong, and what follows from that."""
    sources = [("dout" if s.name == chain.output else f"d{s.name}")
               for s in chain.steps if name in s.args and not s.constant]
    after = chain.needs(name)
    text = (f"the first wrong step is d{name}: {', '.join(sources)}, which it is computed from, "
            f"{'is' if len(sources) == 1 else 'are'} right, so the mistake is in the line of "
            f"d{name}")
    if after:
        wrong_after = [f"d{n}" for n in after
                       if n in shapes or (n in results and not results[n].ok)]
        text += (f"; {', '.join(f'd{n}' for n in after)} use it" + (
            f" ({', '.join(wrong_after)} wrong too, maybe only because of it)" if wrong_after
            else "") + ": fix it first")
    return text


def _some_uses_only(chain, name, values, mine, ref, dout):
    """For a value used by several steps: the phrase saying which uses the learner's gradient
    holds when it is the sum over some of them only (the fan-out rule forgotten), else None."""
    users = [s for s in chain.steps if name in s.args and not s.constant]
    if len(users) < 2:
        return None
    paths = {s.name: _through(s, name, values, dout if s.name == chain.output else ref[s.name])
             for s in users}
    for size in range(1, len(paths)):
        for some in combinations(paths, size):
            if close(mine, sum(paths[n] for n in some), rtol=1e-5):
                rest = [n for n in paths if n not in some]
                return (f"holds the gradient through {', '.join(some)} only: {name} is used by "
                        f"{', '.join(rest)} too, and a value used by several steps gets the sum "
                        f"of the gradients from each")
    return None


def _through(step, name, values, upstream):
    """dL/d(name) through ``step`` alone: central differences of sum(upstream * step), the
    other arguments held."""
    args = [values[a] for a in step.args]
    at = step.args.index(name)
    args[at] = np.array(args[at], dtype=np.float64)
    return numerical_gradient(lambda: float(np.sum(upstream * step.fn(*args))), args[at])


def _pattern(mine, right):
    """How the learner's gradient differs from the right one, where a general pattern shows it."""
    a = np.asarray(mine, dtype=np.float64)
    if not np.isfinite(a).all():
        return "holds NaN or inf"
    if not a.any():
        return "is all zeros"
    c = factor(a, right)
    if c is not None and abs(c + 1) < 1e-6:
        return "has the wrong sign"
    if c is not None:
        return f"is {c:.6g} times the right one: a constant factor is missing or extra"
    return None
