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
input instead of every entry. The step is widened where the output is so large that round-off
would reach the tolerance; an entry that no step can judge is "ill-conditioned", a kink must be
shown by the one-sided slopes, and an input whose every entry is left out is "not judged": none
of these passes. The tolerance model, the probe, the fast mode and how to read the report:
docs/backprop.md#gradient-checking.

A gradient of None is a failure unless that input is non-differentiable: integer and boolean
inputs (token ids, masks) are so automatically, floating ones only when listed in ``nondiff``
(a forgotten gradient must never pass as "no gradient"). A check that could not check anything
(a list or a masked array instead of an array, an empty array, overlapping inputs, a NaN, a zero
step, an all-zero probe, a function that is not the same from call to call) is refused with a
``ValueError`` naming the argument, never passed.
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
LEVELS = 3      # ... and again, at most this many steps in all (h, h/16, h/256)
NOISE = 8       # every difference is taken with a step whose round-off stays below 1/NOISE of
                # the tolerance (see _roundoff); a smaller step is widened
FULL_LIMIT = 100_000   # the full check refuses more entries than this (2 forward passes each)
                       # unless max_entries says how many to check: fast=True is the way
KINK_PROBES = 256  # fast mode: probes (a few forward passes each) per input to find the entries
                  # at a kink that a direction crossed, about 2 log2(size) per such entry

STATUSES = ("exact", "close", "WRONG", "MISSING", "ill-conditioned", "not judged",
            "not differentiable")
JUDGED, KINK, ILL = 0, 1, 2     # what _compare made of one entry or direction


@dataclass
class InputReport:
    """One input's verdict.

    ``status``: "exact" (every checked entry within ``EXACT`` of its tolerance), "close" (within
    it), "WRONG", "MISSING" (a floating input whose backward returned None), "ill-conditioned"
    (some entry could not be judged: no step keeps both round-off and truncation below the
    tolerance), "not judged" (every checked entry sits on a kink, so nothing was compared) or
    "not differentiable" (an integer or boolean input, or one listed in ``nondiff``). Only
    exact, close and not differentiable pass. ``index``: the worst entry (a tuple), or in the
    fast mode the worst direction's number; ``analytic`` and ``numeric`` its two values (the
    directional derivatives in the fast mode); ``abs_error`` |a - n|; ``rel_error`` |a - n| /
    |n|; ``tensor_error`` the whole tensor's max|a - n| / max(max|a|, max|n|), a figure of scale
    (it takes no part in the verdict). ``checked``: entries or directions compared; ``kinks``:
    those left out because the function has a kink at the point itself (ReLU at exactly 0),
    where it has no derivative to check (see ``_compare``); ``ill``: those that could not be
    judged; ``kink_entries``: in the fast mode, the entries found at a kink and left out of
    every direction; ``note``: why an input could not be judged, where it could not."""

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
    ill: int = 0
    kink_entries: int = 0
    note: str = ""

    @property
    def ok(self):
        return self.status in ("exact", "close", "not differentiable")


@dataclass
class GradcheckResult:
    """The verdict of :func:`gradcheck`: one :class:`InputReport` per input.

    ``ok`` (and ``bool(result)``): every input exact, close or not differentiable. ``names``,
    ``errors`` (each input's ``tensor_error``, None where nothing was measured), ``missing``
    (indices of MISSING inputs) and ``max_error`` summarise the reports. ``eps`` is the step
    asked for, ``step`` the one taken (wider where the output's round-off needs it).
    ``str(result)`` is the report a person reads."""

    inputs: list
    atol: float
    rtol: float
    eps: float
    fast: bool = False
    probe: str = "drawn"
    n_directions: int = N_DIRECTIONS
    step: float = None

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
        order = {"MISSING": 0, "WRONG": 1, "ill-conditioned": 2, "not judged": 3, "close": 4,
                 "exact": 5, "not differentiable": 6}
        ranked = sorted(self.inputs, key=lambda r: (order[r.status], -_ratio(r, self)))
        return ranked[0] if ranked else None

    def __str__(self):
        verdict = "PASS" if self.ok else "FAIL"
        mode = f"fast mode, {self.n_directions} directions per input" if self.fast else "every entry"
        head = (f"gradcheck {verdict} (|a - n| <= atol + rtol |n|, atol {self.atol:.0e}, "
                f"rtol {self.rtol:.0e}; {mode}; eps {self.eps:.0e}{self._widened()})")
        where = "direction" if self.fast else "worst entry"
        width = max([len(r.name) for r in self.inputs] + [5])
        lines = [head, f"  {'input':<{width}s}  {'status':<18s} {where:<14s} {'analytic':>13s} "
                       f"{'numeric':>13s} {'abs err':>8s} {'rel err':>8s} {'tensor rel':>10s}"]
        for r in self.inputs:
            if r.analytic is None:
                row = ""
            else:
                index = f"#{r.index}" if isinstance(r.index, int) else str(r.index)
                row = (f"{index:<14s} {r.analytic:>13.6e} {r.numeric:>13.6e} {r.abs_error:>8.1e} "
                       f"{relative_text(r, self.atol):>8s} "
                       f"{r.tensor_error if r.tensor_error is not None else math.nan:>10.1e}")
            if r.status == "MISSING":
                row = "backward returned None for a floating input"
            lines.append(f"  {r.name:<{width}s}  {r.status:<18s} {row}{_notes(r)}".rstrip())
        return "\n".join(lines)


    def _widened(self):
        """The header's remark on the step taken, where it shows as other than eps."""
        if self.step is None or f"{self.step:.2g}" == f"{self.eps:.2g}":
            return ""
        return f", widened to {self.step:.2g} above the output's round-off"


def relative_text(report, atol):
    """``report.rel_error`` for a table, or "-" where the entry is within the absolute tolerance
    (a relative error to a numeric value that is round-off says nothing)."""
    if report.abs_error is None or report.abs_error <= atol:
        return "-"
    return f"{report.rel_error:.1e}"


def _notes(report):
    """The report line's remarks: entries left out, and why that is or is not a pass."""
    notes = [report.note] if report.note else []
    if report.status == "not judged" and not report.note:
        notes.append(f"every one of {report.checked} at a kink: nothing judged, not a pass; "
                     f"check at points away from the kink")
    elif report.kinks:
        notes.append(f"{report.kinks} of {report.checked} at a kink, not judged")
    if report.kink_entries:
        k = report.kink_entries
        notes.append(f"{k} entr{'y' if k == 1 else 'ies'} at a kink, left out of every "
                     f"direction and not judged")
    if report.ill:
        notes.append(f"{report.ill} of {report.checked} ill-conditioned: no step keeps round-off "
                     f"(from the output's size) and truncation below the tolerance, not a pass")
    return "".join(f"  ({n})" for n in notes)


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
            (re-seed any dropout rng inside it) and must not change its inputs; ``backward``
            must change neither the inputs, nor ``dout``, nor anything the forward reads. fn is
            called at the unperturbed inputs three times (first, after the backward ran, after
            the last difference), and each output must equal the first bit for bit.
        inputs: a list of plain NumPy arrays (no ``numpy.ma``), one per argument of ``fn``;
            floating ones must be float64 (float32 differences are round-off noise) and are
            perturbed in place.
        eps: the finite-difference step, the smallest one used: where the output is large, the
            round-off of a difference, eps_machine * sum|out * dout| / h, would reach the
            tolerance, so the step is widened until it is below 1/NOISE of ``atol`` (the report's
            header gives the step taken).
        atol, rtol: an entry passes when |analytic - numeric| <= atol + rtol |numeric|.
        max_entries: check at most this many randomly chosen entries per input (None: all;
            refused above ``FULL_LIMIT`` entries in all, two forward passes each, rather than
            left to run for hours: pass ``fast=True``, or a ``max_entries``).
        seed: seeds the probe, the sampled entries and the fast mode's directions, each from
            its own stream spawned from ``seed`` (never the stream of ``default_rng(seed)``, so
            a probe cannot equal inputs drawn by the caller from the same seed).
        names: labels for the report (default ``input0``, ``input1``, ...).
        nondiff: indices of floating inputs that are not differentiated (e.g. a float mask);
            integer and boolean inputs need not be listed.
        dout: the probe (``out``'s shape, finite floats, not all zero); None draws a standard
            normal one.
        fast: check ``n_directions`` random unit directions u per input instead of every entry:
            ``<analytic, u>`` against ``(f(x + eps u) - f(x - eps u)) / 2 eps``, with the same
            atol and rtol. Two forward passes per direction, whatever the input's size. A
            direction that crosses a kink (ReLU at exactly 0) has the kink's entries found (by
            bisection, at most ``KINK_PROBES`` probes per input, else the input is not judged)
            and left out, so the rest of the input is still judged in full.
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
    inputs, names = _check_inputs(inputs, names)
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
    differentiable = [x.dtype == np.float64 and i not in nondiff for i, x in enumerate(inputs)]
    _check_size(inputs, differentiable, fast, max_entries)
    probe_ss, entries_ss, directions_ss = np.random.SeedSequence(int(seed)).spawn(3)

    saved = [x.copy() for x in inputs]
    out, backward = fn(*inputs)
    out = _check_output(out)
    _check_unchanged(inputs, saved, names, "fn")
    if dout is None:
        dout, probe = np.random.default_rng(probe_ss).standard_normal(out.shape), "drawn"
    else:
        dout, probe = _check_dout(dout, out.shape), "given"
    given = dout.copy()
    analytic = backward(dout)
    if not isinstance(analytic, (tuple, list)):
        analytic = (analytic,)
    if len(analytic) != len(inputs):
        raise ValueError(f"backward: returned {len(analytic)} gradients for {len(inputs)} inputs "
                         f"(one per input, None for a non-differentiable one)")
    _check_unchanged(inputs, saved, names, "backward")
    if not np.array_equal(dout, given):
        raise ValueError("backward: changed dout (the probe) in place; the checker compares with "
                         "sum(out * dout) for the dout it passed, and in a model the same dout "
                         "also reaches other layers: work on a copy (d = d * s, not d *= s)")
    # copied at once: a module's backward may hand out buffers the next forward overwrites
    analytic = [None if a is None else _check_gradient(a, x, name)
                for a, x, name in zip(analytic, inputs, names)]
    _check_same(fn, inputs, out, "fn: two calls with the same inputs gave different outputs (the "
                                 "second after backward ran)")

    def scalar():
        return float(np.sum(_check_output(fn(*inputs)[0], perturbed=True) * dout))

    f0, roundoff = float(np.sum(out * dout)), _roundoff(out, dout)
    step = max(eps, NOISE * roundoff / atol)        # widened where the output is large
    entries_rng, directions_rng = np.random.default_rng(entries_ss), np.random.default_rng(directions_ss)
    reports = []
    for i, (x, a, name) in enumerate(zip(inputs, analytic, names)):
        check = _Check(scalar, f0, x, a, name, step, roundoff, atol, rtol)
        if not differentiable[i]:
            reports.append(InputReport(name, "not differentiable"))
        elif a is None:
            reports.append(InputReport(name, "MISSING"))
        elif fast:
            reports.append(check.directions(directions_rng, n_directions))
        else:
            indices = None
            if max_entries is not None and x.size > max_entries:
                indices = np.sort(entries_rng.choice(x.size, size=max_entries, replace=False))
            reports.append(check.entries(indices))
    _check_unchanged(inputs, saved, names, "fn")
    _check_same(fn, inputs, out, "fn: a later call with the same inputs gave a different output "
                                 "from the first")
    result = GradcheckResult(reports, atol, rtol, eps, fast, probe, n_directions, step)
    if raise_on_failure and not result.ok:
        raise AssertionError(str(result))
    return result


def _roundoff(out, dout):
    """The round-off of one evaluation of f = sum(out * dout): machine epsilon times the size of
    the summed terms, sum |out * dout| (not |f|, which cancellation can make small). A central
    difference with step h carries about roundoff / h of it, a one-sided one twice that."""
    return float(np.finfo(np.float64).eps * np.sum(np.abs(out * dout)))


@dataclass
class _Check:
    """One input's comparison: its entries or random directions, each through ``_compare``."""

    scalar: object
    f0: float
    x: np.ndarray
    a: np.ndarray
    name: str
    step: float
    roundoff: float
    atol: float
    rtol: float

    def entries(self, indices=None, note=""):
        """Every entry (or ``indices``) by central differences."""
        flat = range(self.x.size) if indices is None else indices
        n = len(flat)
        analytic, numeric, verdict = np.empty(n), np.empty(n), np.zeros(n, dtype=int)
        where = []
        for j, i in enumerate(flat):
            at = np.unravel_index(int(i), self.x.shape)
            analytic[j], numeric[j], verdict[j] = self._compare(
                _entry_step(self.scalar, self.x, at, self.a), subgradient=True)
            where.append(at)
        return self._report(analytic, numeric, verdict, where, note)

    def directions(self, rng, n_directions):
        """``n_directions`` random unit directions u: <a, u> against the central difference of f
        along u. A direction that crosses a kink (a ReLU input at exactly 0: every direction
        crosses all of them) judges nothing, so the kink's entries are found (``_kink_entries``)
        and left out of every direction, which then judges the rest of the input in full. When
        finding them would take more than ``KINK_PROBES`` probes, the input is not judged."""
        analytic, numeric = np.empty(n_directions), np.empty(n_directions)
        verdict = np.zeros(n_directions, dtype=int)
        kinks = np.zeros(self.x.shape, dtype=bool)         # entries found at a kink
        budget = [KINK_PROBES]
        for d in range(n_directions):
            u = rng.standard_normal(self.x.shape)
            analytic[d], numeric[d], verdict[d] = self._along(u, kinks)
            if verdict[d] == KINK and not kinks.all():
                found = self._kink_entries(np.where(kinks, 0.0, u), budget)
                if found is None:
                    return InputReport(self.name, "not judged", checked=n_directions, note=(
                        f"every direction crosses a kink, and finding the kink's entries would "
                        f"take more than {KINK_PROBES} probes: check with fast=False (and "
                        f"max_entries=K for a large input), or at a point away from the kink"))
                kinks.flat[found] = True
                if found:
                    analytic[d], numeric[d], verdict[d] = self._along(u, kinks)
        report = self._report(analytic, numeric, verdict, list(range(n_directions)))
        report.kink_entries = int(kinks.sum())
        return report

    def _along(self, u, kinks):
        """(analytic, numeric, verdict) along u with the ``kinks`` entries left out, as a unit
        direction; KINK when nothing is left."""
        u = np.where(kinks, 0.0, u)
        norm = np.linalg.norm(u)
        if norm == 0.0:
            return 0.0, 0.0, KINK
        return self._compare(_direction_step(self.scalar, self.x, self.x.copy(), u / norm, self.a),
                             subgradient=False)

    def _kink_entries(self, u, budget):
        """The flat indices of u's entries at a kink, by bisection: a group of entries holds one
        when f along u restricted to the group shows a kink (``_compare``'s test, the analytic
        side aside); a group that does is halved, down to single entries. Each probe costs a
        few forward passes and ``budget[0]`` of them are left: None when they run out."""
        u = u / np.linalg.norm(u)
        found, groups, whole = [], [np.flatnonzero(u)], True   # u as a whole crossed a kink
        while groups:
            group = groups.pop()
            if not whole:
                if budget[0] == 0:
                    return None
                budget[0] -= 1
                v = np.zeros_like(u)
                v.flat[group] = u.flat[group]
                step = _direction_step(self.scalar, self.x, self.x.copy(), v, self.a)
                if self._compare(step, subgradient=False, judge=False)[2] != KINK:
                    continue
            whole = False
            if len(group) == 1:
                found.append(int(group[0]))
            else:
                groups += [group[:len(group) // 2], group[len(group) // 2:]]
        return found

    def _compare(self, step, subgradient, judge=True):
        """(analytic, numeric, verdict) for one entry or direction; verdict JUDGED, KINK or ILL.
        With ``judge=False`` the analytic side is set aside: KINK says whether f has a kink
        along the step.

        The first difference is taken at ``self.step`` (eps, or wider where the output is so
        large that round-off would reach the tolerance). A value outside the tolerance is looked
        at again with steps ``REFINE`` times smaller, as long as their round-off stays below
        1/NOISE of the tolerance (else with steps twice as large), ``LEVELS`` steps at most,
        and the two finest steps decide:
        - the finer difference agrees: the first step was too coarse (a kink between the two
          steps, or a large third derivative) and the finer one is judged;
        - a kink at the point itself (ReLU at exactly 0): the one-sided slopes (f(x+h)-f(x))/h
          and (f(x)-f(x-h))/h are each stable from one step to the other (within 1/8 of their
          jump) and jump by more than twice the tolerance. On a smooth function the jump is
          h |f''| and each side moves by half of it, so a smooth function never qualifies.
          For an entry, the analytic value must also lie between the two slopes (a subgradient,
          as ReLU's 0 or 1 at 0): else it is judged, and WRONG;
        - the differences move with the step as a smooth function's do: the gap between the
          one-sided slopes (h f'') shrinks in proportion to h, and the central differences
          agree within a quarter of the tolerance, or, over three steps, change as truncation
          does (n* + c h^2, see ``_like_truncation``) and leave the finest within a quarter of
          it: the difference is trustworthy and the entry is judged (WRONG). Round-off that the
          output's size does not show (a forward that cancels large numbers inside) grows as
          1/h instead, and is never taken for a wrong gradient;
        - else the next step, or, with none left, the entry is ILL (ill-conditioned): no step
          is both above the round-off and below the curvature, which is not a pass."""
        levels = [_slopes(step, self.f0, self.step)]
        a, n = levels[0][1], levels[0][2]
        if judge and (not math.isfinite(a) or abs(a - n) <= self.atol + self.rtol * abs(n)):
            return a, n, JUDGED                            # a NaN gradient is WRONG at once
        while len(levels) < LEVELS:
            finest = levels[-1]
            if finest[0] is None:
                return a, n, ILL                           # a step below the input's grid
            floor = 2 * NOISE * self.roundoff / (self.atol + self.rtol * abs(finest[2]))
            if finest[0] / REFINE >= floor:                # one-sided round-off <= tol / NOISE
                levels.append(_slopes(step, self.f0, finest[0] / REFINE))
            else:                                          # no finer step: a coarser one
                levels.insert(0, _slopes(step, self.f0, 2 * levels[0][0]))
            (hc, _, nc, rc, lc), (hf, a, n, r, l) = levels[-2:]
            if hc is None or hf is None:
                return a, n, ILL                           # a step below the input's grid
            tol = self.atol + self.rtol * abs(n)
            if judge and abs(a - n) <= tol:
                return a, n, JUDGED
            jump = abs(r - l)
            if jump > 2 * tol and max(abs(rc - r), abs(lc - l)) <= jump / 8:
                between = min(r, l) - tol <= a <= max(r, l) + tol
                return a, n, KINK if between or not subgradient else JUDGED
            smooth = abs((r - l) - (rc - lc) * hf / hc) <= tol / 2   # r - l ~ h f'' shrinks with h
            if smooth and (abs(nc - n) <= tol / 4 or
                           (len(levels) == LEVELS and _like_truncation(levels, tol))):
                return a, n, JUDGED
        return a, n, ILL

    def _report(self, analytic, numeric, verdict, where, note=""):
        diff = np.abs(analytic - numeric)
        allowed = self.atol + self.rtol * np.abs(numeric)
        ratio = np.where(np.isnan(diff), np.inf, diff / allowed)
        judged = verdict == JUDGED
        tensor = relative_error(analytic, numeric) if not np.isnan(diff).any() else math.nan
        counts = dict(checked=len(where), kinks=int((verdict == KINK).sum()),
                      ill=int((verdict == ILL).sum()), note=note)
        if judged.any() and ratio[judged].max() > 1:
            status = "WRONG"
        elif counts["ill"]:
            status = "ill-conditioned"
        elif not judged.any():                             # a kink's figures mean nothing
            return InputReport(self.name, "not judged", **counts)
        elif ratio[judged].max() <= EXACT:
            status = "exact"
        else:
            status = "close"
        # the worst entry: among the judged ones, else among the ill-conditioned, else any
        rank = np.where(judged, ratio, np.where(verdict == ILL, -1.0, -2.0))
        worst = int(np.argmax(rank))
        n = numeric[worst]
        rel = diff[worst] / abs(n) if n != 0 else (0.0 if diff[worst] == 0 else math.inf)
        index = where[worst]
        return InputReport(self.name, status, tuple(int(v) for v in index)
                           if isinstance(index, tuple) else index, float(analytic[worst]),
                           float(n), float(diff[worst]), float(rel), tensor, **counts)


def _like_truncation(levels, tol):
    """Whether three central differences (coarse to fine) move with the step as truncation does,
    n(h) = n* + c h^2, to within a quarter of the tolerance, and leave the finest within a quarter
    of it. Round-off the output's size does not show (a forward that cancels large numbers
    inside, (x*x + 1e7) - 1e7) grows as 1/h instead, and fails this."""
    (h0, _, n0, _, _), (h1, _, n1, _, _), (h2, _, n2, _, _) = levels
    if h0 is None or h1 is None or h2 is None:
        return False
    c = (n0 - n1) / (h0 ** 2 - h1 ** 2)
    return abs(n1 - n2 - c * (h1 ** 2 - h2 ** 2)) <= tol / 4 and abs(c) * h2 ** 2 <= tol / 4


def _slopes(step, f0, h):
    """(h, analytic, central, right, left) differences at the step h; (None, analytic, NaN, ...)
    when x +- h rounds back to x (a step below the input's grid)."""
    a, f_plus, f_minus, up, down = step(h)
    if up <= 0 or down <= 0:
        return None, a, math.nan, math.nan, math.nan
    return h, a, (f_plus - f_minus) / (up + down), (f_plus - f0) / up, (f0 - f_minus) / down


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


# -- argument checks: a check that could not check must never pass ---------------------------

def _check_inputs(inputs, names):
    """(inputs as a list, names as a list) or a ValueError naming the input: by the name given in
    ``names`` and its place (``x (inputs[0])``), or by its place alone."""
    if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple)):
        raise ValueError(f"inputs: expected a list of NumPy arrays, one per argument of fn, got "
                         f"{type(inputs).__name__}" + (" (wrap a single array as [x])"
                                                       if isinstance(inputs, np.ndarray) else ""))
    inputs = list(inputs)
    if not inputs:
        raise ValueError("inputs: expected at least one array, got an empty list")
    if names is not None and (isinstance(names, str) or len(names) != len(inputs) or
                              not all(isinstance(n, str) for n in names)):
        raise ValueError(f"names: expected one string per input ({len(inputs)}), got {names!r}")
    labels = [f"inputs[{i}]" if names is None else f"{names[i]} (inputs[{i}])"
              for i in range(len(inputs))]
    for x, label in zip(inputs, labels):
        if isinstance(x, np.ma.MaskedArray):
            raise ValueError(f"{label}: expected a plain NumPy array, got a masked array "
                             f"(numpy.ma), whose mask the differences would ignore; pass its "
                             f"data (x.filled(...)) and the mask as a boolean input")
        if not isinstance(x, np.ndarray):
            raise ValueError(f"{label}: expected a NumPy array, got {type(x).__name__} "
                             f"(gradcheck perturbs arrays in place: pass np.array(...))")
        if x.size == 0:
            raise ValueError(f"{label}: expected a non-empty array, got shape {x.shape}: "
                             f"nothing to check")
        if x.dtype.kind == "f":
            if x.dtype != np.float64:
                raise ValueError(f"{label}: expected float64 (float32 finite differences are "
                                 f"round-off noise), got {x.dtype}")
            if not np.isfinite(x).all():
                raise ValueError(f"{label}: expected finite values, got NaN or inf")
            if not x.flags.writeable:
                raise ValueError(f"{label}: expected a writeable array (it is perturbed in "
                                 f"place), got a read-only one")
        elif x.dtype.kind not in "biu":
            raise ValueError(f"{label}: expected float64, integer or boolean, got {x.dtype}")
    for i, x in enumerate(inputs):
        for j in range(i + 1, len(inputs)):
            y = inputs[j]
            if (x.dtype.kind == "f" or y.dtype.kind == "f") and np.shares_memory(x, y):
                raise ValueError(f"{labels[i]} and {labels[j]}: share memory, so perturbing one "
                                 f"moves the other; pass separate arrays (or one of them)")
    names = [f"input{i}" for i in range(len(inputs))] if names is None else list(names)
    return inputs, names


def _check_size(inputs, differentiable, fast, max_entries):
    """The full check of every entry costs two forward passes an entry: above ``FULL_LIMIT``
    entries, with no ``max_entries`` to say how many, it is refused rather than left to run for
    hours."""
    total = sum(x.size for x, d in zip(inputs, differentiable) if d)
    if not fast and max_entries is None and total > FULL_LIMIT:
        raise ValueError(f"inputs: the full check would compare all {total:,} entries, two "
                         f"forward passes each (more than {FULL_LIMIT:,}); pass fast=True (two "
                         f"passes per random direction, whatever the size), or max_entries=K to "
                         f"sample K entries per input (max_entries=x.size checks them all)")


def _check_same(fn, inputs, out, what):
    """fn at the unperturbed inputs again: its output must equal the first bit for bit."""
    if not np.array_equal(_check_output(fn(*inputs)[0], perturbed=True), out):
        raise ValueError(f"{what}; a gradient check needs a deterministic function (re-seed any "
                         f"dropout rng inside fn) whose backward leaves alone what the forward "
                         f"reads (a global, a module's attribute)")


def _check_output(out, perturbed=False):
    out = np.asarray(out)
    if out.dtype.kind != "f":
        raise ValueError(f"fn: expected a floating output, got {out.dtype}")
    if not perturbed and not np.isfinite(out).all():
        raise ValueError("fn: its output holds NaN or inf at the given inputs; a gradient check "
                         "needs a finite output")
    return out


def _check_dout(dout, shape):
    if isinstance(dout, np.ma.MaskedArray):
        raise ValueError("dout: expected a plain NumPy array, got a masked array (numpy.ma), "
                         "whose mask the check would ignore")
    dout = np.asarray(dout)
    if dout.dtype.kind != "f" or dout.shape != shape:
        raise ValueError(f"dout: expected a float array of the output's shape {shape}, got "
                         f"{dout.dtype} of shape {dout.shape}")
    if not np.isfinite(dout).all():
        raise ValueError("dout: expected finite values, got NaN or inf")
    if not dout.any():
        raise ValueError("dout: expected a probe with a non-zero entry, got all zeros: "
                         "sum(out * dout) is then 0 whatever the inputs, and any backward would "
                         "pass")
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
