"""Numerical gradient checking by central differences — the test every backward must pass.

Usage, for any forward/backward pair::

    def f(x, w, b):
        out, cache = nf.functional.linear_forward(x, w, b)
        return out, lambda dout: nf.functional.linear_backward(dout, cache)

    result = nf.gradcheck(f, [x, w, b])      # float64 inputs
    assert result.ok, result

``f`` returns its output and a ``backward(dout)`` closure giving one gradient per input (None for
inputs without one, such as token ids or masks). The checker draws a random ``dout`` and compares
the analytic gradients with central differences of the scalar ``sum(out * dout)``, perturbing each
input entry in place and restoring it. See docs/backprop.md#gradient-checking.
"""
from dataclasses import dataclass, field

import numpy as np


@dataclass
class GradcheckResult:
    """``errors[i]`` is the relative error of input i (None if it has no gradient)."""

    errors: list
    tol: float
    names: list = field(default_factory=list)

    @property
    def max_error(self):
        return max((e for e in self.errors if e is not None), default=0.0)

    @property
    def ok(self):
        return self.max_error <= self.tol

    def __str__(self):
        rows = [f"{name:>12s}: " + ("no gradient" if e is None else f"rel. error {e:.2e}")
                for name, e in zip(self.names, self.errors)]
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
              raise_on_failure=False):
    """Compare the analytic gradients of ``fn`` with central differences.

    Args:
        fn: ``fn(*inputs) -> (out, backward)``, ``backward(dout) -> gradient or tuple of them``.
        inputs: arrays; floating ones must be float64 (float32 differences are round-off noise).
        eps: the finite-difference step.
        tol: the largest accepted relative error (see :func:`relative_error`).
        max_entries: check at most this many randomly chosen entries per input (None: all).
        names: labels for the report (default ``input0``, ``input1``, ...).
    Returns a :class:`GradcheckResult`; raises AssertionError on failure if ``raise_on_failure``.
    """
    inputs = list(inputs)
    for i, x in enumerate(inputs):
        if isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating) and x.dtype != np.float64:
            raise ValueError(f"gradcheck: input {i} expected float64 (float32 finite differences are "
                             f"round-off noise), got {x.dtype}")
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

    errors = []
    for x, a in zip(inputs, analytic):
        if a is None:
            errors.append(None)
            continue
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
    result = GradcheckResult(errors, tol, names or [f"input{i}" for i in range(len(inputs))])
    if raise_on_failure and not result.ok:
        raise AssertionError(str(result))
    return result
