"""The staged exercises ("becoming a backprop ninja"): a layer's forward written as a chain of
named intermediates, and the learner's backward giving the gradient of every one of them, in
order, before the fused exercise asks for the simplified formula.

A :class:`Chain` is the checker's own copy of that forward: one :class:`Step` per intermediate,
each computed from named values before it. From it the checker gets, for every intermediate, the
function from that value to the output with everything after it recomputed, so that central
differences give the intermediate's total gradient (:mod:`.stepcheck`). The learner's file never
runs this code: its forward is held against the reference solution's, and a test holds the
chains equal to the reference solutions' forwards.
"""
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Step:
    """``name = fn(*args)``, ``args`` the names of values computed (or given) before it.
    ``constant``: computed once, then held (a row's max, subtracted only to keep exp finite: it
    cancels, so no gradient flows through it and the learner writes none for it)."""

    name: str
    args: tuple
    fn: object
    constant: bool = False


@dataclass
class Chain:
    """A forward as named steps: ``inputs`` (the names of the differentiable inputs),
    ``constants`` (given, never differentiated: a mask, the targets) and ``steps``, the last one
    the output.
    ``order``: every value whose gradient the learner writes, in the order of the backward (each
    after all the values computed from it)."""

    inputs: tuple
    steps: tuple
    order: tuple
    constants: tuple = ()

    @property
    def output(self):
        return self.steps[-1].name

    def values(self, given):
        """{name: value} of every input and intermediate, ``given`` the inputs by name."""
        values = dict(given)
        for step in self.steps:
            values[step.name] = step.fn(*(values[a] for a in step.args))
        return values

    def users(self, name):
        """The steps that read ``name``, directly or through others (its value's descendants)."""
        found = {name}
        for step in self.steps:
            if not step.constant and found.intersection(step.args):
                found.add(step.name)
        found.discard(name)
        return found

    def suffix(self, name, values):
        """The function from the value of ``name`` to the output, every later value recomputed
        from it and the others held at ``values``."""
        later = [s for s in self.steps if s.name in self.users(name)]

        def fn(value):
            here = dict(values)
            here[name] = value
            for step in later:
                here[step.name] = step.fn(*(here[a] for a in step.args))
            return np.asarray(here[self.output], dtype=np.float64)
        return fn

    def needs(self, name):
        """The values whose gradient is computed from ``name``'s: those it is computed from,
        directly or through others (its value's ancestors), in the backward's order."""
        ancestors = {name}
        for step in reversed(self.steps):
            if step.name in ancestors and not step.constant:
                ancestors.update(step.args)
        return [n for n in self.order if n in ancestors and n != name]

    def check(self):
        """ValueError unless ``order`` lists every value but the output once, each after the
        values computed from it (a consumer's gradient is judged before its inputs')."""
        names = [*self.inputs, *(s.name for s in self.steps[:-1] if not s.constant)]
        if sorted(self.order) != sorted(names):
            raise ValueError(f"order: expected {sorted(names)}, got {sorted(self.order)}")
        for i, name in enumerate(self.order):
            early = self.users(name).intersection(self.order[i + 1:])
            if early:
                raise ValueError(f"order: {name} comes before {sorted(early)}, computed from it")
        return self


@dataclass
class StagedCase:
    """One check of a staged exercise: the inputs (by ``names``; the chain's constants among
    them), and how the learner's module is called."""

    label: str
    inputs: list
    names: list
    forward: object
    backward: object
    extra: dict = field(default_factory=dict)


def _rnd(rng, *shape):
    return rng.standard_normal(shape)


def _row_mean(a):
    return a.mean(axis=-1, keepdims=True)


# -- LayerNorm: mu, xc, var, rstd, xhat, y -----------------------------------------------------

LN_EPS = 1e-5
LAYERNORM = Chain(
    inputs=("x", "gamma", "beta"),
    steps=(Step("mu", ("x",), _row_mean),
           Step("xc", ("x", "mu"), lambda x, mu: x - mu),
           Step("var", ("xc",), lambda xc: _row_mean(xc * xc)),
           Step("rstd", ("var",), lambda var: 1.0 / np.sqrt(var + LN_EPS)),
           Step("xhat", ("xc", "rstd"), lambda xc, rstd: xc * rstd),
           Step("y", ("xhat", "gamma", "beta"), lambda xhat, gamma, beta: xhat * gamma + beta)),
    order=("beta", "gamma", "xhat", "rstd", "var", "xc", "mu", "x")).check()


def layernorm_staged_cases(rng):
    return [StagedCase("x (2, 3, 6), gamma (6,), beta (6,)",
                       [_rnd(rng, 2, 3, 6) * 2 + 1, 1 + 0.3 * _rnd(rng, 6), _rnd(rng, 6)],
                       ["x", "gamma", "beta"],
                       lambda m, *xs: m.layernorm_staged_forward(*xs),
                       lambda m, d, c: m.layernorm_staged_backward(d, c))]


# -- RMSNorm: sq, ms, rstd, xhat, y --------------------------------------------------------------

RMS_EPS = 1e-6
RMSNORM = Chain(
    inputs=("x", "gamma"),
    steps=(Step("sq", ("x",), lambda x: x * x),
           Step("ms", ("sq",), _row_mean),
           Step("rstd", ("ms",), lambda ms: 1.0 / np.sqrt(ms + RMS_EPS)),
           Step("xhat", ("x", "rstd"), lambda x, rstd: x * rstd),
           Step("y", ("xhat", "gamma"), lambda xhat, gamma: xhat * gamma)),
    order=("gamma", "xhat", "rstd", "ms", "sq", "x")).check()


def rmsnorm_staged_cases(rng):
    return [StagedCase("x (2, 3, 6), gamma (6,)", [_rnd(rng, 2, 3, 6) + 0.5, 1 + 0.3 * _rnd(rng, 6)],
                       ["x", "gamma"], lambda m, *xs: m.rmsnorm_staged_forward(*xs),
                       lambda m, d, c: m.rmsnorm_staged_backward(d, c))]


# -- masked softmax and attention: scores, e, z, p, out -------------------------------------------

def _row_max(a, mask=True):
    """The largest entry of each row where ``mask``: a shift held constant (see Step)."""
    return np.where(mask, a, -np.inf).max(axis=-1, keepdims=True)


ATTENTION = Chain(
    inputs=("q", "k", "v"),
    steps=(Step("scores", ("q", "k"),
                lambda q, k: (q @ k.swapaxes(-1, -2)) / math.sqrt(q.shape[-1])),
           Step("m", ("scores", "mask"), _row_max, constant=True),
           Step("e", ("scores", "mask", "m"),
                lambda scores, mask, m: np.where(mask, np.exp(scores - m), 0.0)),
           Step("z", ("e",), lambda e: e.sum(axis=-1, keepdims=True)),
           Step("p", ("e", "z"), lambda e, z: e / z),
           Step("out", ("p", "v"), lambda p, v: p @ v)),
    order=("v", "p", "z", "e", "scores", "k", "q"), constants=("mask",)).check()


def attention_staged_cases(rng):
    mask = np.ones((2, 1, 3, 4), dtype=bool)
    mask[0, ..., 3] = False                          # the first sequence's last key: padding
    mask[1, ..., 2:] = False                         # no row all masked (softmax's own case)
    return [StagedCase("q (2, 2, 3, 4), k (2, 2, 4, 4), v (2, 2, 4, 2), padding mask (Tq 3 != Tk 4)",
                       [_rnd(rng, 2, 2, 3, 4), _rnd(rng, 2, 2, 4, 4), _rnd(rng, 2, 2, 4, 2), mask],
                       ["q", "k", "v", "mask"],
                       lambda m, q, k, v, mask: m.attention_staged_forward(q, k, v, mask),
                       lambda m, d, c: m.attention_staged_backward(d, c))]


# -- cross-entropy with label smoothing: e, z, logp, nll, smooth, per_token, loss -----------------

CE_IGNORE, CE_SMOOTHING = -100, 0.1


def _nll(logp, targets):
    return -logp[np.arange(len(targets)), np.where(targets == CE_IGNORE, 0, targets)]


CROSS_ENTROPY = Chain(
    inputs=("logits",),
    steps=(Step("m", ("logits",), _row_max, constant=True),
           Step("e", ("logits", "m"), lambda logits, m: np.exp(logits - m)),
           Step("z", ("e",), lambda e: e.sum(axis=-1, keepdims=True)),
           Step("logp", ("logits", "m", "z"), lambda logits, m, z: logits - m - np.log(z)),
           Step("nll", ("logp", "targets"), _nll),
           Step("smooth", ("logp",), lambda logp: -logp.mean(axis=-1)),
           Step("per_token", ("nll", "smooth"),
                lambda nll, smooth: (1.0 - CE_SMOOTHING) * nll + CE_SMOOTHING * smooth),
           Step("loss", ("per_token", "targets"),
                lambda per_token, t: np.asarray((per_token * (t != CE_IGNORE)).sum()
                                                / (t != CE_IGNORE).sum()))),
    order=("per_token", "smooth", "nll", "logp", "z", "e", "logits"),
    constants=("targets",)).check()

CE_STAGED_TARGETS = np.array([2, 0, CE_IGNORE, 4, 1, CE_IGNORE])


def cross_entropy_staged_cases(rng):
    def forward(m, logits, targets):
        loss, cache = m.cross_entropy_staged_forward(logits, targets, CE_IGNORE, CE_SMOOTHING)
        return np.asarray(loss, dtype=np.float64), cache
    return [StagedCase("logits (6, 5), 2 of 6 targets ignored, label smoothing 0.1",
                       [_rnd(rng, 6, 5) * 2, CE_STAGED_TARGETS.copy()], ["logits", "targets"],
                       forward, lambda m, d, c: m.cross_entropy_staged_backward(d, c))]
