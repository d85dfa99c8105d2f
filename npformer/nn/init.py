"""Weight initialisers (all take an explicit ``rng``, a numpy random Generator, so a seed fixes
the model), and the one switch that builds a model without allocating its weights.

``with shapes_only(): model = GPT(config)`` builds the modules as usual, but every initialiser
returns a zero-strided view of the right shape and dtype (``np.broadcast_to`` of one number):
no memory, no draws. ``Module.shapes_of(config)`` lists a model's parameter shapes this way, so
a configuration learns its shapes from the modules themselves instead of a hand-written mirror.

``with uninitialised(): model = GPT(config)`` builds a whole model, its parameter and gradient
buffers allocated but never written: the weights are whatever the caller copies in next (a
checkpoint, a Hugging Face folder, read tensor by tensor). Nothing is drawn, no per-parameter
array is made and copied, and the buffers' pages are not touched until they are written, so
loading a model costs its weights once instead of three or four times. Until every weight is
written, the values are undefined.
"""
import contextlib
import math

import numpy as np

_state = {"shapes_only": 0, "uninitialised": 0}


@contextlib.contextmanager
def _mode(name):
    _state[name] += 1
    try:
        yield
    finally:
        _state[name] -= 1


def shapes_only():
    """Build modules without allocating or drawing their weights (see the module docstring)."""
    return _mode("shapes_only")


def uninitialised():
    """Build a model whose buffers are allocated but not initialised (the module docstring)."""
    return _mode("uninitialised")


def building_shapes():
    """Whether modules are being built for their shapes alone (inside :func:`shapes_only`)."""
    return _state["shapes_only"] > 0


def drawing_nothing():
    """Whether the initialisers give placeholders instead of values: building for shapes
    (:func:`shapes_only`) or for weights copied in afterwards (:func:`uninitialised`)."""
    return _state["shapes_only"] > 0 or _state["uninitialised"] > 0


def placeholder(shape, dtype):
    """A read-only array of ``shape`` and ``dtype`` that holds one number (zero strides)."""
    return np.broadcast_to(np.zeros((), dtype=dtype), shape)


def xavier_uniform(rng, shape, dtype):
    """U(-a, a), a = sqrt(6 / (fan_in + fan_out)): keeps activation variance across a layer."""
    if drawing_nothing():
        return placeholder(shape, dtype)
    fan_out, fan_in = shape
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-a, a, size=shape).astype(dtype)


def normal(rng, shape, std, dtype):
    if drawing_nothing():
        return placeholder(shape, dtype)
    return (rng.standard_normal(size=shape) * std).astype(dtype)


def zeros(shape, dtype):
    return placeholder(shape, dtype) if drawing_nothing() else np.zeros(shape, dtype=dtype)


def ones(shape, dtype):
    return placeholder(shape, dtype) if drawing_nothing() else np.ones(shape, dtype=dtype)


def table(make, shape, dtype):
    """A table a model computes from its configuration (sinusoidal positions, rotary angles):
    ``make()``, or a placeholder of ``shape`` while building for shapes."""
    return placeholder(shape, dtype) if building_shapes() else make()
