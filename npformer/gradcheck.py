"""Numerical gradient checking by central differences — the test every backward must pass.

Usage, for any forward/backward pair::

    def f(x, w, b):
        out, cache = nf.functional.linear_forward(x, w, b)
        return out, lambda dout: nf.functional.linear_backward(dout, cache)

    result = nf.gradcheck(f, [x, w, b])      # float64 inputs
    assert result, result                    # bool(result) is result.ok

``f`` returns its output and a ``backward(dout)`` closure giving one gradient per input. The
checker takes a probe ``dout`` (drawn from a stream of its own, or the caller's) and compares
the analytic gradients of the scalar ``sum(out * dout)`` with central differences, perturbing
each input entry in place and restoring it. An entry passes when

    |analytic - numeric| <= atol + rtol * |numeric|

(``numpy.testing.assert_allclose``'s form). ``fast=True`` checks a few random directions per
input instead of every entry. The tolerance model, the probe, the fast mode and how to read the
report: docs/backprop.md#gradient-checking.

A gradient of None is a failure unless that input is non-differentiable: integer and boolean
inputs (token ids, masks) are so automatically, floating ones only when listed in ``nondiff``
(a forgotten gradient must never pass as "no gradient"). A check that could not check anything
(a list instead of an array, an empty array, overlapping inputs, a NaN, a zero step) is refused
with a ``ValueError`` naming the argument, never passed.
"""
import math
from dataclasses import dataclass, field

import numpy as np

# The defaults, chosen for float64 central differences (docs/backprop.md#gradient-checking):
EPS = 1e-6      # the step h: round-off ~ 1e-16 |f| / h and truncation ~ h^2 |f'''| / 6 both
                # stay near 1e-10 for inputs and outputs of order one to ten
ATOL = 1e-6     # the absolute floor: a gradient entry that is zero (masked keys, the key bias)
                # comes out of the differences as pure round-off, up to ~1e-8 here
RTOL = 1e-5     # the relative part: a correct entry agrees to ~1e-9 relative; the smallest
                # real bug in docs/backprop.md (mixing the two GELUs) is ~1e-4 off
EXACT = 0.01    # "exact": every entry within 1% of its tolerance
N_DIRECTIONS = 3  # fast mode: random directions per input
REFINE = 16     # a value outside the tolerance is looked at again with a step this much smaller

STATUSES = ("exact", "close", "WRONG", "MISSING", "not differentiable")


@dataclass
class InputReport:
    """One input's verdict.

    ``status``: "exact" (every checked entry within ``EXACT`` of its tolerance), "close" (within
    it), "WRONG", "MISSING" (a floating input whose backward returned None) or "not
    differentiable" (an integer or boolean input, one listed in ``nondiff``, or one whose every
    checked entry sits on a kink). ``index``: the worst entry (a tuple), or in the fast mode
    the worst direction's number; ``analytic`` and ``numeric`` its two values (the directional
    derivatives in the fast mode); ``abs_error`` |a - n|; ``rel_error`` |a - n| / |n|;
    ``tensor_error`` the whole tensor's max|a - n| / max(max|a|, max|n|), a figure of scale (it
    takes no part in the verdict). ``checked``: entries or directions compared; ``kinks``: those
    left out because the function has a kink at the point itself (ReLU at exactly 0), where it
    has no derivative to check (see ``_compare``)."""

    name: str
    status: str
    index: object = None
    analytic: float = None
    numeric: float = None
    abs_error: float = None
    rel_error: float = None
    tensor_error: float = None
    checked: int = 0
    kinks: int = 0

    @property
    def ok(self):
        return self.status in ("exact", "close", "not differentiable")


@dataclass
class GradcheckResult:
    """The verdict of :func:`gradcheck`: one :class:`InputReport` per input.

    ``ok`` (and ``bool(result)``): every input exact, close or not differentiable. ``names``,
    ``errors`` (each input's ``tensor_error``, None where nothing was measured), ``missing``
    (indices of MISSING inputs) and ``max_error`` summarise the reports. ``str(result)`` is the
    report a person reads."""

    inputs: list
    atol: float
    rtol: float
    eps: float
    fast: bool = False
    probe: str = "drawn"

    @property
    def ok(self):
        return all(r.ok for r in self.inputs)

    def __bool__(self):
        return self.ok

    @property
    def names(self):
        return [r.name for r in self.inputs]

    @property
    def errors(self):
        return [r.tensor_error for r in self.inputs]

    @property
    def missing(self):
        return [i for i, r in enumerate(self.inputs) if r.status == "MISSING"]

    @property
    def max_error(self):
        """The worst measured ``tensor_error`` (NaN if any is NaN)."""
        measured = [e for e in self.errors if e is not None]
        if any(math.isnan(e) for e in measured):
            return math.nan
        return max(measured, default=0.0)

    @property
    def worst(self):
        """The report of the input furthest from passing (a failing one first), or None."""
        order = {"MISSING": 0, "WRONG": 1, "close": 2, "exact": 3, "not differentiable": 4}
        ranked = sorted(self.inputs, key=lambda r: (order[r.status], -_ratio(r, self)))
        return ranked[0] if ranked else None

    def __str__(self):
        verdict = "PASS" if self.ok else "FAIL"
        mode = f"fast mode, {self._directions()} directions per input" if self.fast else "every entry"
        head = (f"gradcheck {verdict} (|a - n| <= atol + rtol |n|, atol {self.atol:.0e}, "
                f"rtol {self.rtol:.0e}; {mode}; eps {self.eps:.0e})")
        where = "direction" if self.fast else "worst entry"
        width = max([len(r.name) for r in self.inputs] + [5])
        lines = [head, f"  {'input':<{width}s}  {'status':<18s} {where:<14s} {'analytic':>13s} "
                       f"{'numeric':>13s} {'abs err':>8s} {'rel err':>8s} {'tensor rel':>10s}"]
        for r in self.inputs:
            if r.analytic is None:
                row = ""
            else:
                index = str(r.index) if not self.fast else f"#{r.index}"
                row = (f"{index:<14s} {r.analytic:>13.6e} {r.numeric:>13.6e} {r.abs_error:>8.1e} "
                       f"{r.rel_error:>8.1e} {r.tensor_error if r.tensor_error is not None else math.nan:>10.1e}")
            note = ""
            if r.status == "MISSING":
                row = "backward returned None for a floating input"
            elif r.kinks:
                note = f"  ({r.kinks} of {r.checked} at a kink, not judged)"
            lines.append(f"  {r.name:<{width}s}  {r.status:<18s} {row}{note}".rstrip())
        return "\n".join(lines)

    def _directions(self):
        return max((r.checked for r in self.inputs if r.checked), default=0)


def _ratio(report, result):
    """How far the worst entry is from its tolerance (1 = on the edge; inf for NaN)."""
    if report.abs_error is None:
        return 0.0
    if math.isnan(report.abs_error):
        return math.inf
    return report.abs_error / (result.atol + result.rtol * abs(report.numeric))


def relative_error(analytic, numeric):
    """max |a - n| / max(max |a|, max |n|): the worst entry measured against the tensor's scale.
    Reported as ``tensor_error``; the verdict is entry-wise (:func:`gradcheck`)."""
    scale = max(np.abs(analytic).max(initial=0.0), np.abs(numeric).max(initial=0.0))
    if scale == 0.0:
        return 0.0
    return float(np.abs(analytic - numeric).max() / scale)


def numerical_gradient(scalar_fn, x, eps=EPS, indices=None):
    """Central differences (f(x + eps e_i) - f(x - eps e_i)) / (2 eps), entry by entry, in place.

    ``indices``: flat indices to check (all when None); the others are left at 0."""
    grad = np.zeros(x.shape, dtype=np.float64)
    for i in (range(x.size) if indices is None else indices):
        at = np.unravel_index(i, x.shape)
        _, f_plus, f_minus, up, down = _entry_step(scalar_fn, x, at, grad)(eps)
        grad[at] = (f_plus - f_minus) / (up + down)
    return grad


def gradcheck(fn, inputs, *, eps=EPS, atol=ATOL, rtol=RTOL, max_entries=None, seed=0,
              names=None, nondiff=(), dout=None, fast=False, n_directions=N_DIRECTIONS,
              raise_on_failure=False, tol=None):
    """Compare the analytic gradients of ``fn`` with central differences, entry by entry.

    Args:
        fn: ``fn(*inputs) -> (out, backward)``, ``backward(dout) -> gradient or tuple of them``
            (one per input, None for a non-differentiable one). ``fn`` must be deterministic
            (re-seed any dropout rng inside it) and must not change its inputs.
        inputs: a list of NumPy arrays, one per argument of ``fn``; floating ones must be
            float64 (float32 differences are round-off noise) and are perturbed in place.
        eps: the finite-difference step.
        atol, rtol: an entry passes when |analytic - numeric| <= atol + rtol |numeric|.
        max_entries: check at most this many randomly chosen entries per input (None: all).
        seed: seeds the probe, the sampled entries and the fast mode's directions, each from
            its own stream spawned from ``seed`` (never the stream of ``default_rng(seed)``, so
            a probe cannot equal inputs drawn by the caller from the same seed).
        names: labels for the report (default ``input0``, ``input1``, ...).
        nondiff: indices of floating inputs that are not differentiated (e.g. a float mask);
            integer and boolean inputs need not be listed.
        dout: the probe (``out``'s shape, finite floats); None draws a standard normal one.
        fast: check ``n_directions`` random unit directions u per input instead of every entry:
            ``<analytic, u>`` against ``(f(x + eps u) - f(x - eps u)) / 2 eps``, with the same
            atol and rtol. Two forward passes per direction, whatever the input's size.
        raise_on_failure: raise AssertionError (with the report) on failure. Off by default
            because the result is a report (``npformer gradcheck`` prints every check);
            ``assert gradcheck(...)`` fails all the same, since ``bool(result)`` is
            ``result.ok``. ``npformer.testing.assert_gradients`` raises.
    Returns a :class:`GradcheckResult`. ValueError, naming the argument, for anything that
    would let the check pass without checking.
    """
    if tol is not None:
        raise ValueError("tol: gradcheck's single relative tolerance is gone; an entry now passes "
                         "when |analytic - numeric| <= atol + rtol |numeric| (pass atol= and rtol=, "
                         f"defaults {ATOL:g} and {RTOL:g})")
    inputs = _check_inputs(inputs)
    eps = _positive_real("eps", eps)
    atol, rtol = _positive_real("atol", atol), _positive_real("rtol", rtol)
    if max_entries is not None:
        max_entries = _positive_int("max_entries", max_entries)
    n_directions = _positive_int("n_directions", n_directions)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if not isinstance(fast, bool):
        raise ValueError(f"fast: expected True or False, got {fast!r}")
    nondiff = _check_nondiff(nondiff, len(inputs))
    if names is None:
        names = [f"input{i}" for i in range(len(inputs))]
    elif isinstance(names, str) or len(names) != len(inputs) or \
            not all(isinstance(n, str) for n in names):
        raise ValueError(f"names: expected one string per input ({len(inputs)}), got {names!r}")
    names = list(names)
    probe_ss, entries_ss, directions_ss = np.random.SeedSequence(int(seed)).spawn(3)

    saved = [x.copy() for x in inputs]
    out, backward = fn(*inputs)
    out = _check_output(out)
    _check_unchanged(inputs, saved, names, "fn")
    again = _check_output(fn(*inputs)[0])
    if not np.array_equal(again, out):
        raise ValueError("fn: two calls with the same inputs gave different outputs; a gradient "
                         "check needs a deterministic function (re-seed any dropout rng inside fn)")
    if dout is None:
        dout, probe = np.random.default_rng(probe_ss).standard_normal(out.shape), "drawn"
    else:
        dout, probe = _check_dout(dout, out.shape), "given"
    analytic = backward(dout)
    if not isinstance(analytic, (tuple, list)):
        analytic = (analytic,)
    if len(analytic) != len(inputs):
        raise ValueError(f"backward: returned {len(analytic)} gradients for {len(inputs)} inputs "
                         f"(one per input, None for a non-differentiable one)")
    _check_unchanged(inputs, saved, names, "backward")
    # copied at once: a module's backward may hand out buffers the next forward overwrites
    analytic = [None if a is None else _check_gradient(a, x, name)
                for a, x, name in zip(analytic, inputs, names)]

    def scalar():
        return float(np.sum(_check_output(fn(*inputs)[0], perturbed=True) * dout))

    f0 = float(np.sum(out * dout))
    entries_rng, directions_rng = np.random.default_rng(entries_ss), np.random.default_rng(directions_ss)
    reports = []
    for i, (x, a, name) in enumerate(zip(inputs, analytic, names)):
        differentiable = x.dtype == np.float64 and i not in nondiff
        if not differentiable:
            reports.append(InputReport(name, "not differentiable"))
        elif a is None:
            reports.append(InputReport(name, "MISSING"))
        elif fast:
            reports.append(_check_directions(scalar, f0, x, a, name, eps, atol, rtol,
                                             directions_rng, n_directions))
        else:
            indices = None
            if max_entries is not None and x.size > max_entries:
                indices = np.sort(entries_rng.choice(x.size, size=max_entries, replace=False))
            reports.append(_check_entries(scalar, f0, x, a, name, eps, atol, rtol, indices))
    _check_unchanged(inputs, saved, names, "fn")
    result = GradcheckResult(reports, atol, rtol, eps, fast, probe)
    if raise_on_failure and not result.ok:
        raise AssertionError(str(result))
    return result


def _check_entries(scalar, f0, x, a, name, eps, atol, rtol, indices):
    """Every entry (or ``indices``) of one input, by central differences."""
    flat = range(x.size) if indices is None else indices
    n = len(flat)
    analytic, numeric, kink = np.empty(n), np.empty(n), np.zeros(n, dtype=bool)
    where = []
    for j, i in enumerate(flat):
        at = np.unravel_index(int(i), x.shape)
        analytic[j], numeric[j], kink[j] = _compare(_entry_step(scalar, x, at, a), f0, eps,
                                                    atol, rtol)
        where.append(at)
    return _report(name, analytic, numeric, kink, where, atol, rtol)


def _check_directions(scalar, f0, x, a, name, eps, atol, rtol, rng, n_directions):
    """``n_directions`` random unit directions u of one input: <a, u> against the central
    difference of f along u."""
    analytic, numeric = np.empty(n_directions), np.empty(n_directions)
    kink = np.zeros(n_directions, dtype=bool)
    old = x.copy()
    for d in range(n_directions):
        u = rng.standard_normal(x.shape)
        u /= np.linalg.norm(u)
        analytic[d], numeric[d], kink[d] = _compare(_direction_step(scalar, x, old, u, a), f0,
                                                    eps, atol, rtol)
    return _report(name, analytic, numeric, kink, list(range(n_directions)), atol, rtol)


def _entry_step(scalar, x, at, a):
    """step(h) -> (analytic, f(x + h e), f(x - h e), up, down) for the entry ``at``; up and down
    are the steps actually taken (x +- h is rounded to the input's grid). x is restored bit for
    bit."""
    def step(h):
        old = x[at]
        x[at] = old + h
        up = float(x[at]) - float(old)
        f_plus = scalar()
        x[at] = old - h
        down = float(old) - float(x[at])
        f_minus = scalar()
        x[at] = old
        return float(a[at]), f_plus, f_minus, up, down
    return step


def _direction_step(scalar, x, old, u, a):
    """step(h) -> (analytic, f(x + h u), f(x - h u), h, h) along the direction ``u``; the
    analytic side <a, u> is taken along the steps actually made (x +- h u rounded to the input's
    grid), so rounding the perturbation costs nothing. x is restored bit for bit."""
    def step(h):
        x[...] = old + h * u
        up = x - old
        f_plus = scalar()
        x[...] = old - h * u
        down = old - x
        f_minus = scalar()
        x[...] = old
        return float(np.sum(a * (up + down))) / (2 * h), f_plus, f_minus, h, h
    return step


def _compare(step, f0, eps, atol, rtol):
    """(analytic, numeric, at a kink) for one entry or direction.

    A value outside the tolerance is looked at again with a step ``REFINE`` times smaller:
    - if it agrees there, the first step was too coarse (a kink between the two steps, or a large
      third derivative) and the finer difference is the one judged;
    - else, if the one-sided differences still jump by more than the tolerance and the jump did
      not shrink with the step, the function has a kink at the point itself (ReLU at exactly 0):
      it has no derivative to check there, so the entry is reported at a kink, not judged. On a
      smooth function the jump is ~ h |f''| and shrinks with h, so a wrong gradient is never
      excused as a kink."""
    a, f_plus, f_minus, up, down = step(eps)
    n = (f_plus - f_minus) / (up + down)
    if abs(a - n) <= atol + rtol * abs(n):
        return a, n, False
    jump = abs((f_plus - f0) / up - (f0 - f_minus) / down)
    a_fine, f_plus, f_minus, up, down = step(eps / REFINE)
    n_fine = (f_plus - f_minus) / (up + down)
    if abs(a_fine - n_fine) <= atol + rtol * abs(n_fine):
        return a_fine, n_fine, False
    jump_fine = abs((f_plus - f0) / up - (f0 - f_minus) / down)
    return a, n, bool(jump_fine > atol + rtol * abs(n_fine) and jump_fine >= jump / 4)


def _report(name, analytic, numeric, kink, where, atol, rtol):
    diff = np.abs(analytic - numeric)
    allowed = atol + rtol * np.abs(numeric)
    ratio = np.where(np.isnan(diff), np.inf, diff / allowed)
    judged = ~kink
    tensor = relative_error(analytic, numeric) if not np.isnan(diff).any() else math.nan
    if not judged.any():
        return InputReport(name, "not differentiable", tensor_error=tensor, checked=len(where),
                           kinks=int(kink.sum()))
    worst = int(np.argmax(np.where(judged, ratio, -1.0)))
    if ratio[judged].max() > 1:
        status = "WRONG"
    elif ratio[judged].max() <= EXACT:
        status = "exact"
    else:
        status = "close"
    n = numeric[worst]
    rel = diff[worst] / abs(n) if n != 0 else (0.0 if diff[worst] == 0 else math.inf)
    return InputReport(name, status, tuple(int(v) for v in where[worst])
                       if isinstance(where[worst], tuple) else where[worst],
                       float(analytic[worst]), float(n), float(diff[worst]), float(rel), tensor,
                       len(where), int(kink.sum()))


# -- argument checks: a check that could not check must never pass ---------------------------

def _check_inputs(inputs):
    if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple)):
        raise ValueError(f"inputs: expected a list of NumPy arrays, one per argument of fn, got "
                         f"{type(inputs).__name__}" + (" (wrap a single array as [x])"
                                                       if isinstance(inputs, np.ndarray) else ""))
    inputs = list(inputs)
    if not inputs:
        raise ValueError("inputs: expected at least one array, got an empty list")
    for i, x in enumerate(inputs):
        if not isinstance(x, np.ndarray):
            raise ValueError(f"inputs[{i}]: expected a NumPy array, got {type(x).__name__} "
                             f"(gradcheck perturbs arrays in place: pass np.array(...))")
        if x.size == 0:
            raise ValueError(f"inputs[{i}]: expected a non-empty array, got shape {x.shape}: "
                             f"nothing to check")
        if x.dtype.kind == "f":
            if x.dtype != np.float64:
                raise ValueError(f"inputs[{i}]: expected float64 (float32 finite differences are "
                                 f"round-off noise), got {x.dtype}")
            if not np.isfinite(x).all():
                raise ValueError(f"inputs[{i}]: expected finite values, got NaN or inf")
            if not x.flags.writeable:
                raise ValueError(f"inputs[{i}]: expected a writeable array (it is perturbed in "
                                 f"place), got a read-only one")
        elif x.dtype.kind not in "biu":
            raise ValueError(f"inputs[{i}]: expected float64, integer or boolean, got {x.dtype}")
    for i, x in enumerate(inputs):
        for j in range(i + 1, len(inputs)):
            y = inputs[j]
            if (x.dtype.kind == "f" or y.dtype.kind == "f") and np.shares_memory(x, y):
                raise ValueError(f"inputs[{i}] and inputs[{j}]: share memory, so perturbing one "
                                 f"moves the other; pass separate arrays (or one of them)")
    return inputs


def _check_output(out, perturbed=False):
    out = np.asarray(out)
    if out.dtype.kind != "f":
        raise ValueError(f"fn: expected a floating output, got {out.dtype}")
    if not perturbed and not np.isfinite(out).all():
        raise ValueError("fn: its output holds NaN or inf at the given inputs; a gradient check "
                         "needs a finite output")
    return out


def _check_dout(dout, shape):
    dout = np.asarray(dout)
    if dout.dtype.kind != "f" or dout.shape != shape:
        raise ValueError(f"dout: expected a float array of the output's shape {shape}, got "
                         f"{dout.dtype} of shape {dout.shape}")
    if not np.isfinite(dout).all():
        raise ValueError("dout: expected finite values, got NaN or inf")
    return dout.astype(np.float64)


def _check_gradient(a, x, name):
    a = np.asarray(a)
    if a.dtype.kind != "f":
        raise ValueError(f"backward: the gradient of {name} is {a.dtype}; expected a floating array")
    if a.shape != x.shape:
        raise ValueError(f"backward: the gradient of {name} has shape {a.shape}; expected its "
                         f"input's shape {x.shape}")
    return np.array(a, dtype=np.float64)


def _check_unchanged(inputs, saved, names, who):
    for x, s, name in zip(inputs, saved, names):
        if not np.array_equal(x, s):
            raise ValueError(f"{who}: changed the input {name} in place; gradcheck perturbs the "
                             f"inputs itself and needs fn and backward to leave them as they are "
                             f"(work on a copy)")


def _positive_real(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}")
    return float(value)


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def _check_nondiff(nondiff, n_inputs):
    """The set of indices in ``nondiff``; each must be an int naming an input."""
    bad = ValueError(f"gradcheck: nondiff expected indices of inputs in [0, {n_inputs}), got {nondiff!r}")
    try:
        items = list(nondiff)
    except TypeError:
        raise bad from None
    for i in items:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not 0 <= i < n_inputs:
            raise bad
    return {int(i) for i in items}
