"""The finale's backend: the learner's own forward/backward pairs as the namespace the modules
call (``npformer.backend.using``), with the fused names the modules use built from them, and a
shadow of it that compares every backward with the reference's on the same inputs, so that a
training run that fails can name the layer to look at.

The fused names are composed exactly as :mod:`npformer.functional` composes them, so the
reference solutions train bit for bit as the NumPy backend does.
"""
import copy
import sys
from dataclasses import dataclass, field

import numpy as np

from ..functional.activation_dropout import check_activation
from ..functional.activations import ACTIVATIONS
from ..functional.dropout import check_terms
from .catalogue import EXERCISES

OUTPUTS = {"linear_backward": ("dx", "dw", "db"), "layernorm_backward": ("dx", "dgamma", "dbeta"),
           "attention_backward": ("dq", "dk", "dv")}      # what each backward returns, by name
TOLERANCE = 1e-3          # a backward off the reference by more than this, relative, on a real
                          # float32 batch is wrong (a right one differs by round-off, ~1e-6)


def trained_exercises():
    return [e for e in EXERCISES if e.trained]


def pairs_of(modules):
    """{function name: function} of the trained exercises' modules ({exercise name: module})."""
    return {name: getattr(modules[e.name], name) for e in trained_exercises() for name in e.provides}


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
    """Where the learner's backward disagrees with the reference's on the same dout and
    inputs: ``function``, the module ``layer`` (``encoder.layers.0.norm1``), the worst relative
    ``error`` and which output it was in."""

    function: str
    layer: str
    error: float
    output: str
    note: str = ""


@dataclass
class Shadow:
    """Pairs that run the learner's functions and, beside each, the reference's on copies of
    the same arguments, recording where the backward passes disagree. ``paths``: {id(module):
    its name in the model}."""

    learner: dict
    reference: dict
    paths: dict
    findings: dict = field(default_factory=dict)
    _caches: dict = field(default_factory=dict)

    def pairs(self):
        out = {}
        for e in trained_exercises():
            for name in e.provides:
                if name.endswith("_forward"):
                    out[name] = self._forward(name)
                else:
                    out[name] = self._backward(name)
        return out

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
            out, cache = mine(*args, **kwargs)
            ref_out, ref_cache = ref(*theirs, **kwargs)
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
            got = mine(dout, cache, *rest)
            if entry is None or entry[0] is not cache:
                return got
            layer = entry[2]
            if isinstance(dout, np.ndarray) and not np.array_equal(dout, saved):
                self._note(name, layer, float("inf"), "dout", "it changed dout in place")
            want = ref(saved, entry[1], *rest)
            got_t = got if isinstance(got, tuple) else (got,)
            want_t = want if isinstance(want, tuple) else (want,)
            for i, (a, b) in enumerate(zip(got_t, want_t)):
                err = _error(a, b)
                if err > TOLERANCE:
                    labels = OUTPUTS.get(name, ())
                    self._note(name, layer, err, labels[i] if i < len(labels) else "its output")
            return got
        return backward

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
