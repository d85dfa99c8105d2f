"""Numerical gradient checking by central differences — the test every backward must pass.

Usage, for any forward/backward pair::

    def f(x, w, b):
        out, cache = nf.functional.linear_forward(x, w, b)
        return out, lambda dout: nf.functional.linear_backward(dout, cache)

    result = nf.gradcheck(f, [x, w, b])      # float64 inputs
    assert result.ok, result

``f`` returns its output and a ``backward(dout)`` closure giving one gradient per input. The
checker draws a random ``dout`` and compares the analytic gradients with central differences of
the scalar ``sum(out * dout)``, perturbing each input entry in place and restoring it. See
docs/backprop.md#gradient-checking.

A gradient of None is a failure unless that input is non-differentiable: integer and boolean
inputs (token ids, masks) are so automatically, floating ones only when listed in ``nondiff``
(a forgotten gradient must never pass as "no gradient"). ``bool(result)`` is ``result.ok``, so
``assert nf.gradcheck(f, [x])`` fails on a wrong gradient.
"""
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class GradcheckResult:
    """``errors[i]``: the relative error of input i, or None where none was measured (a
    non-differentiable input, or a gradient that is ``missing``).

    ``missing`` lists the differentiable inputs whose backward returned None: each fails the check.
    """

    errors: list
    tol: float
    names: list = field(default_factory=list)
    missing: list = field(default_factory=list)

    @property
    def max_error(self):
        """The worst measured relative error (NaN if any error is NaN)."""
        measured = [e for e in self.errors if e is not None]
        if any(math.isnan(e) for e in measured):
            return math.nan
        return max(measured, default=0.0)

    @property
    def ok(self):
        # written as e <= tol so that a NaN error fails (NaN <= tol is False)
        return not self.missing and all(e <= self.tol for e in self.errors if e is not None)

    def __bool__(self):
        return self.ok

    def __str__(self):
        def row(i, name, e):
            if i in self.missing:
                return "MISSING gradient (backward returned None)"
            return "not differentiable" if e is None else f"rel. error {e:.2e}"
        rows = [f"{name:>12s}: {row(i, name, e)}"
                for i, (name, e) in enumerate(zip(self.names, self.errors))]
        verdict = "PASS" if self.ok else "FAIL"
        return f"gradcheck {verdict} (max {self.max_error:.2e}, tol {self.tol:.0e})\n" + "\n".join(rows)


def relative_error(analytic, numeric):
    """max |a - n| / max(max |a|, max |n|): the worst entry, measured against the tensor's scale
    (entry-wise ratios blow up on entries that are zero up to round-off)."""
    scale = max(np.abs(analytic).max(initial=0.0), np.abs(numeric).max(initial=0.0))
    if scale == 0.0:
        return 0.0
    return float(np.abs(analytic - numeric).max() / scale)


def numerical_gradient(scalar_fn, x, eps=1e-6, indices=None):
    """Central differences (f(x + eps e_i) - f(x - eps e_i)) / (2 eps), entry by entry, in place.

    ``indices``: flat indices to check (all when None); the others are left at 0.
    """
    grad = np.zeros_like(x, dtype=np.float64)
    flat_x, flat_g = x.reshape(-1), grad.reshape(-1)
    if not np.shares_memory(flat_x, x):
        raise ValueError("numerical_gradient: x must be contiguous so it can be perturbed in place")
    for i in (range(x.size) if indices is None else indices):
        old = flat_x[i]
        flat_x[i] = old + eps
        f_plus = scalar_fn()
        flat_x[i] = old - eps
        f_minus = scalar_fn()
        flat_x[i] = old
        flat_g[i] = (f_plus - f_minus) / (2.0 * eps)
    return grad


def gradcheck(fn, inputs, *, eps=1e-6, tol=1e-6, max_entries=None, seed=0, names=None,
              nondiff=(), raise_on_failure=False):
    """Compare the analytic gradients of ``fn`` with central differences.

    Args:
        fn: ``fn(*inputs) -> (out, backward)``, ``backward(dout) -> gradient or tuple of them``
            (one per input, None for a non-differentiable one).
        inputs: arrays; floating ones must be float64 (float32 differences are round-off noise).
        eps: the finite-difference step.
        tol: the largest accepted relative error (see :func:`relative_error`).
        max_entries: check at most this many randomly chosen entries per input (None: all).
        names: labels for the report (default ``input0``, ``input1``, ...).
        nondiff: indices of floating inputs that are not differentiated (e.g. a float mask);
            integer and boolean inputs need not be listed.
        raise_on_failure: raise AssertionError (with the report) on failure. Off by default
            because the result is a report: ``npformer gradcheck`` prints a table of every
            check, failing ones included, and a learner wants to see each error, not stop at
            the first. ``assert gradcheck(...)`` fails all the same, since
            ``bool(result)`` is ``result.ok``.
    Returns a :class:`GradcheckResult`.
    """
    inputs = list(inputs)
    nondiff = _check_nondiff(nondiff, len(inputs))
    for i, x in enumerate(inputs):
        if isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating) and x.dtype != np.float64:
            raise ValueError(f"gradcheck: input {i} expected float64 (float32 finite differences are "
                             f"round-off noise), got {x.dtype}")
    if names is not None and len(names) != len(inputs):
        raise ValueError(f"gradcheck: names has {len(names)} entries for {len(inputs)} inputs")
    rng = np.random.default_rng(seed)
    out, backward = fn(*inputs)
    dout = rng.standard_normal(np.shape(out))
    analytic = backward(dout)
    if not isinstance(analytic, (tuple, list)):
        analytic = (analytic,)
    if len(analytic) != len(inputs):
        raise ValueError(f"gradcheck: backward returned {len(analytic)} gradients for "
                         f"{len(inputs)} inputs")

    def scalar():
        return float(np.sum(fn(*inputs)[0] * dout))

    errors, missing = [], []
    for i, (x, a) in enumerate(zip(inputs, analytic)):
        differentiable = _is_float_array(x) and i not in nondiff
        if a is None:
            if differentiable:
                missing.append(i)
            errors.append(None)
            continue
        if not _is_float_array(x):
            if i in nondiff or not isinstance(x, np.ndarray) or x.dtype.kind in "biu":
                errors.append(None)          # an integer/boolean input: nothing to perturb
                continue
            raise ValueError(f"gradcheck: input {i} has dtype {x.dtype}; a gradient can be "
                             f"checked only for a float64 array")
        if np.shape(a) != np.shape(x):
            raise ValueError(f"gradcheck: gradient of shape {np.shape(a)} for an input of shape "
                             f"{np.shape(x)}")
        indices = None
        if max_entries is not None and x.size > max_entries:
            indices = rng.choice(x.size, size=max_entries, replace=False)
        numeric = numerical_gradient(scalar, x, eps, indices)
        a = np.asarray(a, dtype=np.float64)
        if indices is not None:
            a, numeric = a.reshape(-1)[indices], numeric.reshape(-1)[indices]
        errors.append(relative_error(a, numeric))
    result = GradcheckResult(errors, tol, list(names) if names is not None
                             else [f"input{i}" for i in range(len(inputs))], missing)
    if raise_on_failure and not result.ok:
        raise AssertionError(str(result))
    return result


def _is_float_array(x):
    return isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating)


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
