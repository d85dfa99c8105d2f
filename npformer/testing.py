"""Tools for people writing their own gradient tests: an assertion with the checker's report, a
whole-model check, and Hypothesis strategies for the inputs.

    from npformer.testing import assert_gradients, check_model, check_module

    def test_my_layer():
        assert_gradients(f, [x, w])                     # raises AssertionError with the report

    def test_my_model():
        result = check_model(model, (src, tgt_in, tgt_out))
        assert result, result

The strategies (``float_arrays``, ``shapes``, ``padding_masks``, ``causal_masks``) need the
``hypothesis`` package (``pip install "npformer[test]"``); it is imported only when one of them is
called. docs/example_test_gradients.py is a test file to copy into your own project.
"""
from dataclasses import dataclass

import numpy as np

from .gradcheck import gradcheck
from .loss import cross_entropy
from .nn.embedding import Embedding

SMOOTHING = 0.1            # check_model's label-smoothed loss, when the caller's is 0


def assert_gradients(fn, inputs, **kwargs):
    """``gradcheck(fn, inputs, **kwargs)``, raising AssertionError with the whole report when a
    gradient is wrong or missing (its own frame hidden from pytest's traceback, so the report is
    what shows). Returns the result when it passes."""
    __tracebackhide__ = True
    result = gradcheck(fn, inputs, **kwargs)
    if not result.ok:
        raise AssertionError(f"gradients disagree with central differences:\n{result}")
    return result


def pair_fn(forward, backward):
    """The ``fn`` that ``gradcheck`` takes for a functional pair: ``forward(*xs)`` returns
    ``(out, cache)``; the backward it hands back is ``backward(dout, cache)``."""
    def fn(*xs):
        out, cache = forward(*xs)
        return out, lambda d: backward(d, cache)
    return fn


def module_function(module, forward, backward, n_inputs):
    """The ``fn`` that ``gradcheck`` takes for a module: called with the module's ``n_inputs``
    activations and then every named parameter's array (which the checker perturbs in place, so
    the module reads them), it runs ``forward(*activations)``; its backward zeroes the module's
    gradients, runs ``backward(dout)`` and returns the input gradients it gives (none, one or a
    tuple) followed by a copy of every trained parameter's ``.grad`` (a frozen one, whose
    ``.grad`` is None, has none to check)."""
    params = [p for _, p in module.named_parameters() if p.grad is not None]

    def fn(*arrays):
        out = forward(*arrays[:n_inputs])

        def back(dout):
            module.zero_grad()
            dxs = backward(dout)
            dxs = () if dxs is None else dxs if isinstance(dxs, tuple) else (dxs,)
            return (*dxs, *[p.grad.copy() for p in params])
        return out, back
    return fn


def check_module(module, forward, backward, inputs=(), names=None, **kwargs):
    """``gradcheck`` of a module over its ``inputs`` (float64 activations) and every named
    trained parameter, each reported by its name (``self_attn.in_proj_weight``)::

        m = nf.nn.LayerNorm(6, dtype=np.float64)
        check_module(m, m.forward, m.backward, [x], names=["x"])

    Keyword arguments go to :func:`npformer.gradcheck`; returns its result."""
    params = [(n, p) for n, p in module.named_parameters() if p.grad is not None]
    names = list(names) if names is not None else [f"input{i}" for i in range(len(inputs))]
    return gradcheck(module_function(module, forward, backward, len(inputs)),
                     [*inputs, *[p.data for _, p in params]],
                     names=names + [n for n, _ in params], **kwargs)


@dataclass
class ModelCheckResult:
    """:func:`check_model`'s verdict: one :class:`~npformer.gradcheck.GradcheckResult` per loss
    checked (``results``: {"loss": ..., "loss, label smoothing 0.1": ...}). ``bool(result)`` is
    ``result.ok``: every loss passes."""

    results: dict

    @property
    def ok(self):
        return all(r.ok for r in self.results.values())

    def __bool__(self):
        return self.ok

    def __str__(self):
        return "\n".join(f"{name}: {result}" for name, result in self.results.items())


def check_model(model, batch, label_smoothing=0.0, fast=True, **kwargs):
    """Check the gradient of a model's cross-entropy loss with respect to every named parameter.

    ``model``: a float64 ``nf.Transformer`` or ``nf.GPT`` (or any model with ``forward``,
    ``backward``, ``named_parameters`` and ``zero_grad`` called the same way). ``batch``:
    ``(src, tgt_in, tgt_out)`` for an encoder-decoder (targets equal to its ``pad_id`` are
    ignored), ``(ids, targets)`` for a language model (targets of -100 are ignored). Dropout is
    off during the check (the model's mode is restored after). Two losses are checked: with
    ``label_smoothing`` and, so that the smoothing term is covered too, with
    ``label_smoothing`` 0.1 when it is 0 (or 0 when it is not). An ``Embedding``'s padding row
    is left out: it is frozen on purpose although the loss depends on it.

    ``fast`` (default True): random directions per parameter (``gradcheck(fast=True)``);
    False checks every entry (pass ``max_entries`` to sample). Other keyword arguments go to
    :func:`npformer.gradcheck`. Returns a :class:`ModelCheckResult`.
    """
    forward, targets, ignore_index = _model_call(model, batch)
    params = [(n, p) for n, p in model.named_parameters() if p.grad is not None]   # trained
    if not params:
        raise ValueError(f"model: this {type(model).__name__} has no trainable parameters "
                         f"(every one is frozen: its .grad is None), so there is no gradient to "
                         f"check")
    for name, p in params:
        if p.data.dtype != np.float64:
            raise ValueError(f"model: {name} is {p.data.dtype}; a gradient check needs a float64 "
                             f"model (build it with dtype=np.float64)")
    frozen = {}
    for m in model.modules():
        if isinstance(m, Embedding) and m.padding_idx is not None:
            frozen[id(m.weight)] = m.padding_idx
    names, views = [], []                 # (parameter, rows) with a padding row left out
    for name, p in params:
        pad = frozen.get(id(p))
        pieces = [(slice(None), name)] if pad is None else \
            [(slice(0, pad), f"{name}[:{pad}]"), (slice(pad + 1, None), f"{name}[{pad + 1}:]")]
        for rows, label in pieces:
            if p.data[rows].size:
                names.append(label)
                views.append((p, rows))
    other = SMOOTHING if label_smoothing == 0 else 0.0
    results = {}
    with model.evaluating():
        for smoothing in (label_smoothing, other):
            fn = loss_function(model, forward, targets, views, ignore_index, smoothing)
            label = "loss" if smoothing == 0 else f"loss, label smoothing {smoothing:g}"
            results[label] = gradcheck(fn, [p.data[rows] for p, rows in views], names=names,
                                       fast=fast, **kwargs)
    return ModelCheckResult(results)


def loss_function(model, forward, targets, views, ignore_index, label_smoothing):
    """The ``fn`` that ``gradcheck`` takes for a model's cross-entropy loss: ``forward()`` gives
    the logits (N, V) of ``targets`` (N,); the backward it hands back runs the model's backward
    and returns a copy of the gradient of each (parameter, rows) of ``views``."""
    def fn(*_):
        logits = forward()
        loss, dlogits = cross_entropy(logits, targets, ignore_index=ignore_index,
                                      label_smoothing=label_smoothing)

        def backward(dloss):
            model.zero_grad()
            model.backward(dlogits * dloss)
            return tuple(p.grad[rows].copy() for p, rows in views)
        return np.array(loss), backward
    return fn


def _model_call(model, batch):
    """(forward thunk, targets, ignore_index) for a batch of 3 (encoder-decoder) or 2 (language
    model) integer arrays."""
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3) or \
            not all(isinstance(a, np.ndarray) and a.dtype.kind in "iu" for a in batch):
        raise ValueError("batch: expected (src, tgt_in, tgt_out) for an encoder-decoder or "
                         "(ids, targets) for a language model, as integer arrays, got "
                         f"{type(batch).__name__}")
    if len(batch) == 3:
        src, tgt_in, tgt_out = batch
        return (lambda: model.forward(src, tgt_in)), tgt_out, getattr(model, "pad_id", -100)
    ids, targets = batch
    return (lambda: model.forward(ids)), targets, -100


# -- Hypothesis strategies (hypothesis is imported when one is called) -----------------------

def _hypothesis():
    try:
        import hypothesis.strategies as st
    except ImportError:
        raise ImportError("npformer.testing's strategies need the hypothesis package: "
                          "pip install \"npformer[test]\"") from None
    return st


def shapes(min_dims=1, max_dims=3, min_side=1, max_side=5):
    """Array shapes: tuples of ``min_dims`` .. ``max_dims`` sides in ``min_side`` .. ``max_side``
    (small: each entry of a checked array costs two forward passes)."""
    st = _hypothesis()
    return st.lists(st.integers(min_side, max_side), min_size=min_dims,
                    max_size=max_dims).map(tuple)


def float_arrays(shape, min_scale=0.1, max_scale=10.0, mixed=True, zeros=True):
    """float64 arrays of ``shape`` (a tuple, or a strategy of them) with bounded scale: standard
    normal entries times a scale drawn log-uniformly in [min_scale, max_scale]. ``mixed``: each
    row (last axis) may get its own scale, so one array mixes magnitudes; ``zeros``: some
    entries may be exactly 0. Bounded, because central differences in float64 are exact to
    ~1e-10 only while the inputs and the output stay within a few orders of magnitude of one."""
    st = _hypothesis()
    if not (0 < min_scale <= max_scale < np.inf):
        raise ValueError(f"min_scale, max_scale: expected 0 < min_scale <= max_scale, got "
                         f"{min_scale}, {max_scale}")
    shape_strategy = shape if hasattr(shape, "example") else st.just(tuple(shape))
    lo, hi = np.log(min_scale), np.log(max_scale)

    @st.composite
    def draw_array(draw):
        shape = draw(shape_strategy)
        seed = draw(st.integers(0, 2 ** 32 - 1))
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(shape)
        rows = shape[:-1] + (1,) if (mixed and len(shape) and draw(st.booleans())) else (1,) * len(shape)
        x *= np.exp(rng.uniform(lo, hi, size=rows))
        if zeros and x.size and draw(st.booleans()):
            x[rng.random(shape) < 0.2] = 0.0
        return x
    return draw_array()


def padding_masks(batch_size, length):
    """Key-padding masks (B, 1, 1, T), True = a real token: each row is a prefix of real tokens
    of length 1 .. T (as ``nf.functional.padding_mask`` makes from padded ids)."""
    st = _hypothesis()
    return st.lists(st.integers(1, length), min_size=batch_size, max_size=batch_size).map(
        lambda lengths: (np.arange(length)[None, :] < np.array(lengths)[:, None])[:, None, None, :])


def causal_masks(batch_size, length, padding=True):
    """Causal masks (B, 1, T, T), each query seeing itself and the keys before it, AND (with
    ``padding``) a key-padding mask from :func:`padding_masks` (the first key is always real,
    so every query sees at least one key)."""
    causal = np.tril(np.ones((length, length), dtype=bool))[None, None]
    if not padding:
        _hypothesis()
        import hypothesis.strategies as st
        return st.just(np.broadcast_to(causal, (batch_size, 1, length, length)).copy())
    return padding_masks(batch_size, length).map(lambda pad: causal & pad)


__all__ = ["ModelCheckResult", "assert_gradients", "causal_masks", "check_model", "check_module",
           "float_arrays", "module_function", "padding_masks", "shapes"]
