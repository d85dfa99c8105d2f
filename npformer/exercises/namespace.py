"""The finales' backend: the learner's own forward/backward pairs as the namespace the modules
call (``npformer.backend.using``), with the fused names the modules use built from them, and a
shadow of it that runs every learner function on a real training batch beside the reference's,
on the same inputs, recording which functions ran, how often, and where they disagree, so that
a finale names the first wrong function and never counts one that did not run as trained.

The fused names are composed exactly as :mod:`npformer.functional` composes them, so the
reference solutions train bit for bit as the NumPy backend does.
"""
import contextlib
import copy
import sys
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..functional.activation_dropout import check_activation
from ..functional.activations import ACTIVATIONS
from ..functional.dropout import check_terms
from .catalogue import EXERCISES, find
from .learner import LearnerError, solution

OUTPUTS = {"linear_backward": ("dx", "dw", "db"), "layernorm_backward": ("dx", "dgamma", "dbeta"),
           "attention_backward": ("dq", "dk", "dv"), "rmsnorm_backward": ("dx", "dgamma"),
           "mha_backward": ("dx", "dw_in", "db_in", "dw_out", "db_out"),
           "residual_backward": ("dx", "dw", "db", "dgamma", "dbeta"),
           "adam_step": ("the step of p", "m", "v")}   # what each returns (or updates), by name
TOLERANCE = 1e-3          # a backward off the reference by more than this, relative, on a real
                          # float32 batch is wrong (a right one differs by round-off, ~1e-6)

# The exercises each finale trains with (their ``provides``): the toy translator of npformer
# toy, and the character GPT of ``--train gpt`` (:mod:`.gpt`).
FINALES = {"toy": ("linear", "embedding", "dropout", "layernorm", "softmax", "attention",
                   "cross_entropy", "adam"),
           "gpt": ("linear", "embedding", "rmsnorm", "swiglu", "multi_head_attention", "residual",
                   "cross_entropy", "adam")}


def trained_exercises(finale="toy"):
    """The exercises finale ``finale`` trains with, in the catalogue's order."""
    return [e for e in EXERCISES if e.name in FINALES[finale]]


def finales_of(exercise):
    """The finales that train with ``exercise`` ('toy', 'gpt'), as a short label."""
    return "+".join(f for f, names in FINALES.items() if exercise.name in names) or "checked"


def pairs_of(modules, finale="toy"):
    """{function name: function} of the finale's exercises' modules ({exercise name: module})."""
    return {name: getattr(modules[e.name], name) for e in trained_exercises(finale)
            for name in e.provides}


def build(pairs):
    """The namespace (a dict for ``backend.using``): the pairs, and the fused names the modules
    call, made of them."""
    functions = dict(pairs)
    linear_backward = pairs["linear_backward"]
    dropout_forward, dropout_backward = pairs["dropout_forward"], pairs["dropout_backward"]
    attention_backward = pairs["attention_backward"]

    def linear_backward_accumulate(dout, cache, dw_acc, db_acc=None):
        dx, dw, db = linear_backward(dout, cache)
        dw_acc += dw
        if db_acc is not None:
            db_acc += db
        return dx

    def dropout_add_forward(x, y, p, rng, training=True):
        check_terms(x, y)
        dropped, cache = dropout_forward(y, p, rng, training)
        return x + dropped, cache

    def dropout_add_backward(dout, cache):
        return dout, dropout_backward(dout, cache)

    def activation_dropout_forward(h, activation, p, rng, training=True):
        check_activation(activation)
        a, act_cache = ACTIVATIONS[activation][0](h)
        out, drop_cache = dropout_forward(a, p, rng, training)
        return out, (activation, act_cache, drop_cache)

    def activation_dropout_backward(dout, cache):
        activation, act_cache, drop_cache = cache
        return ACTIVATIONS[activation][1](dropout_backward(dout, drop_cache), act_cache)

    def attention_backward_into(dout, cache, dq, dk, dv):
        dq[...], dk[...], dv[...] = attention_backward(dout, cache)
        return dq, dk, dv

    functions.update(linear_backward_accumulate=linear_backward_accumulate,
                     dropout_add_forward=dropout_add_forward,
                     dropout_add_backward=dropout_add_backward,
                     activation_dropout_forward=activation_dropout_forward,
                     activation_dropout_backward=activation_dropout_backward,
                     attention_backward_into=attention_backward_into)
    return functions


@dataclass
class Finding:
    """Where the learner's function disagrees with the reference's on the same dout and
    inputs: ``function``, the module ``layer`` (``encoder.layers.0.norm1``), the worst relative
    ``error`` and which output it was in."""

    function: str
    layer: str
    error: float
    output: str
    note: str = ""


@dataclass
class Usage:
    """What one learner function did on the real batch: ``calls``, how many of them were
    compared with the reference (``compared``), and ``status``: "agreed", "wrong", "not used"
    (``reason`` says why) or "not compared" (it ran, but never on an input the reference's can
    be set beside)."""

    function: str
    calls: int
    compared: int
    status: str
    reason: str = ""


@dataclass
class Shadow:
    """Pairs that run the learner's functions and, beside each, the reference's on copies of
    the same arguments, recording how often each ran and where they disagree. A backward that
    calls another learner function (attention calling softmax_backward) is compared with the
    reference's backward calling that same learner function, so each disagreement is the
    function's own, not its callee's. ``paths``: {id(module): its name in the model}."""

    learner: dict
    reference: dict
    paths: dict
    findings: dict = field(default_factory=dict)
    calls: Counter = field(default_factory=Counter)
    compared: Counter = field(default_factory=Counter)
    nests: dict = field(default_factory=dict)     # function -> the learner functions of the
                                                  # files where it is a global (its callers)
    _caches: dict = field(default_factory=dict)
    _stack: list = field(default_factory=list)         # [(function, {its callees})]
    _wrapped: dict = field(default_factory=dict)

    def pairs(self):
        """{name: the shadowing function} for every learner function."""
        for name in self.learner:
            if name not in self._wrapped:
                make = (self._update if name == "adam_step" else
                        self._forward if name.endswith("_forward") else self._backward)
                self._wrapped[name] = make(name)
        return dict(self._wrapped)

    @contextlib.contextmanager
    def nested(self, modules):
        """While it lasts (``modules``: {exercise name: the learner's module}), a learner
        module's global that names a learner function (the attention file's softmax_backward,
        the SwiGLU file's silu_backward) is that function's shadow, so that calls between the
        learner's own functions are recorded and compared too."""
        wrapped, saved = self.pairs(), []
        for exercise, module in modules.items():
            own = [n for n in find(exercise).provides if n in self.learner]
            for name, function in self.learner.items():
                if getattr(module, name, None) is function:
                    saved.append((module, name, function))
                    setattr(module, name, wrapped[name])
                    self.nests.setdefault(name, set()).update(own)
        try:
            yield
        finally:
            for module, name, function in saved:
                setattr(module, name, function)

    def usage(self):
        """A :class:`Usage` for every learner function, in the pairs' order."""
        wrong = {f.function for f in self.findings.values()}
        out = []
        for name in self.learner:
            if not self.calls[name]:
                out.append(Usage(name, 0, 0, "not used", self._why_unused(name)))
            elif name in wrong:
                out.append(Usage(name, self.calls[name], self.compared[name], "wrong"))
            else:
                out.append(Usage(name, self.calls[name], self.compared[name],
                                 "agreed" if self.compared[name] else "not compared"))
        return out

    def _why_unused(self, name):
        ran = sorted(c for c in self.nests.get(name, ()) if self.calls[c]
                     and c.rsplit("_", 1)[-1] == name.rsplit("_", 1)[-1])
        if ran:
            what = name.rsplit("_", 1)[0].replace("_", " ")
            return (f"your {ran[0]} computes the {what} "
                    f"{name.rsplit('_', 1)[-1]} itself (it never calls {name})")
        return "nothing called it on a training batch"

    def _enter(self, name):
        self.calls[name] += 1
        if self._stack:                                # called by another learner function
            self._stack[-1][1].add(name)
        self._stack.append((name, set()))

    def _layer(self):
        frame = sys._getframe(2)
        while frame is not None:
            owner = frame.f_locals.get("self")
            if owner is not None and id(owner) in self.paths:
                return self.paths[id(owner)] or "the model"
            frame = frame.f_back
        return "the loss"

    def _forward(self, name):
        mine, ref = self.learner[name], self.reference[name]

        def forward(*args, **kwargs):
            theirs = [copy.deepcopy(a) if isinstance(a, np.random.Generator) else
                      a.copy() if isinstance(a, np.ndarray) else a for a in args]
            self._enter(name)
            try:
                out, cache = mine(*args, **kwargs)
            finally:
                self._stack.pop()
            ref_out, ref_cache = ref(*theirs, **kwargs)
            self.compared[name] += 1
            if cache is not None:
                self._caches[id(cache)] = (cache, ref_cache, self._layer())
            if not _close(out, ref_out):
                self._note(name, self._layer(), _error(out, ref_out), "its output",
                           "the forward differs from the given one")
            return out, cache
        return forward

    def _backward(self, name):
        mine, ref = self.learner[name], self.reference[name]

        def backward(dout, cache, *rest):
            entry = self._caches.pop(id(cache), None)
            saved = dout.copy() if isinstance(dout, np.ndarray) else dout
            self._enter(name)
            try:
                got = mine(dout, cache, *rest)
            finally:
                callees = self._stack.pop()[1]
            if entry is None or entry[0] is not cache:
                return got
            layer = entry[2]
            if isinstance(dout, np.ndarray) and not np.array_equal(dout, saved):
                self._note(name, layer, float("inf"), "dout", "it changed dout in place")
            with self._callees_of(ref, callees):
                want = ref(saved, entry[1], *rest)
            self.compared[name] += 1
            self._compare(name, layer, got, want)
            return got
        return backward

    def _update(self, name):
        mine, ref = self.learner[name], self.reference[name]

        def update(p, g, m, v, *rest):
            theirs = [a.copy() for a in (p, g, m, v)]
            self._enter(name)
            try:
                mine(p, g, m, v, *rest)
            finally:
                self._stack.pop()
            before = theirs[0].copy()
            ref(*theirs, *rest)
            self.compared[name] += 1
            # the step p moved by, not p itself: a wrong step is small beside the weights
            self._compare(name, "the optimizer", (p - before, m, v),
                          (theirs[0] - before, theirs[2], theirs[3]))
        return update

    @contextlib.contextmanager
    def _callees_of(self, ref, callees):
        """The reference function ``ref`` calling the learner's own ``callees`` (those the
        learner's function called) in place of its own, while it lasts."""
        names = getattr(ref, "__globals__", {})
        saved = {c: names[c] for c in callees if c in names and c in self.learner}
        names.update({c: self.learner[c] for c in saved})
        try:
            yield
        finally:
            names.update(saved)

    def _compare(self, name, layer, got, want):
        """Note where ``got`` (the learner's) is off ``want``; LearnerError for an output of
        the wrong shape, which the model cannot take (it would fail further on, unnamed)."""
        got_t = got if isinstance(got, tuple) else (got,)
        want_t = want if isinstance(want, tuple) else (want,)
        labels = OUTPUTS.get(name, ())
        for i, (a, b) in enumerate(zip(got_t, want_t)):
            label = labels[i] if i < len(labels) else "its output"
            if np.shape(a) != np.shape(b):
                raise LearnerError(f"your {name} gave {label} of shape {np.shape(a)} at {layer}, "
                                   f"where the model needs {np.shape(b)}")
            err = _error(a, b)
            if err > TOLERANCE:
                self._note(name, layer, err, label)

    def _note(self, function, layer, error, output, note=""):
        key = (function, layer)
        if key not in self.findings or error > self.findings[key].error:
            self.findings[key] = Finding(function, layer, error, output, note)


def _error(a, b):
    try:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            return float("inf")
        scale = max(float(np.abs(b).max(initial=0.0)), 1e-30)
        err = float(np.abs(a - b).max(initial=0.0)) / scale
        return err if np.isfinite(err) else float("inf")
    except (TypeError, ValueError):
        return float("inf")


def _close(a, b):
    return _error(a, b) <= TOLERANCE


def module_paths(model):
    """{id(module): dotted name} of every module of ``model`` ('' for the model itself)."""
    paths = {}

    def walk(module, prefix):
        paths.setdefault(id(module), prefix)
        for name, child in module._modules.items():
            walk(child, f"{prefix}.{name}" if prefix else name)
    walk(model, "")
    return paths


def reference_modules(finale="toy"):
    """The reference solutions' modules of the exercises finale ``finale`` trains with."""
    return {e.name: solution(e) for e in trained_exercises(finale)}


def verify(learner, finale, paths, run_batch):
    """Every learner function of ``finale`` run on a real training batch beside the reference's
    (:class:`Shadow`): ``run_batch(pairs)`` runs one training step (the loss, the
    backward and the optimizer's update) with the namespace ``pairs``. Returns the findings, in
    the order they arose (the forward's, then the backward's, a callee before its caller), and
    the :class:`Usage` of every function."""
    shadow = Shadow(pairs_of(learner, finale), pairs_of(reference_modules(finale), finale), paths)
    with shadow.nested(learner):
        run_batch(shadow.pairs())
    return list(shadow.findings.values()), shadow.usage()
