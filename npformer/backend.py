"""Which implementation of the functional core the modules call: "numba" (default) or "numpy".

Both backends expose the same names and signatures as :mod:`npformer.functional`::

    out, cache = ops().attention_forward(q, k, v, mask, ...)
    dq, dk, dv = ops().attention_backward(dout, cache)

"numpy" is :mod:`npformer.functional` itself, the readable reference. "numba" is
:mod:`npformer.kernels`: compiled, fused kernels for the same maths where they pay, and the
reference's own function for every other name (it falls back to :mod:`npformer.functional`, so a
new layer pair runs on both backends at once). A forward and its backward must come from the
same backend, since the caches differ; modules look ``ops()`` up when they run, so switch
between steps.

A third kind of backend is any namespace of such functions, made active for a while with
:func:`using`: ``npformer exercises check DIR --train`` trains the toy translator on the one a
learner's own backward passes make (:mod:`npformer.exercises.namespace`); names it lacks fall
back to the reference, as the kernels' do.

The environment variable ``NPFORMER_BACKEND`` sets the starting choice. How the kernels use the
machine (threads, BLAS, the matrix-product dispatch table) is :mod:`npformer.runtime`'s concern.
"""
import contextlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from . import runtime

BACKENDS = ("numba", "numpy")
_MODULES = {"numba": "npformer.kernels", "numpy": "npformer.functional"}
_state = {"name": None, "ops": None}


def _check(name, source):
    if name not in BACKENDS:
        raise ValueError(f"{source}: expected one of {BACKENDS}, got {name!r}")
    return name


def _import_kernels_from_source():
    """In a source checkout (not installed) ``kernels/`` sits next to ``npformer/``; setup.cfg maps
    it to ``npformer.kernels`` on install. Load it under that name, as the installed package would."""
    init = Path(__file__).resolve().parent.parent / "kernels" / "__init__.py"
    if not init.is_file():
        raise ModuleNotFoundError(f"npformer.kernels: not installed and no source at {init}",
                                  name="npformer.kernels")
    spec = importlib.util.spec_from_file_location("npformer.kernels", init,
                                                  submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["npformer.kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["npformer.kernels"]
        raise
    return module


def load(name):
    """The namespace of backend ``name`` ("numba" or "numpy"), without making it the active one."""
    name = _check(name, "load(name)")
    try:
        return importlib.import_module(_MODULES[name])    # kernels compile lazily, on first use
    except ModuleNotFoundError as err:
        if err.name != "npformer.kernels":
            raise
    return _import_kernels_from_source()


def set_backend(name):
    """Select the backend ("numba" or "numpy") for every module from now on. Returns the name."""
    name = _check(name, "set_backend(name)")
    module = load(name)
    # the reference's products run on npformer's BLAS thread count, as the kernels' do
    _state["ops"] = runtime.BlasScoped(module) if name == "numpy" else module
    _state["name"] = name
    return name


def environment_choice():
    """The backend the environment variable ``NPFORMER_BACKEND`` names ("numba" where unset),
    checked without loading it: a ValueError names the variable, its value and the choices (the
    command line calls this before a command starts, so that the message comes before any
    output, not when the first layer runs)."""
    return _check(os.environ.get("NPFORMER_BACKEND", "numba"),
                  "environment variable NPFORMER_BACKEND")


def get_backend():
    """The name of the active backend."""
    if _state["name"] is None:
        set_backend(environment_choice())
    return _state["name"]


def ops():
    """The active backend's namespace of forward/backward functions."""
    if _state["ops"] is None:
        get_backend()
    return _state["ops"]


class Namespace:
    """``functions`` (a dict of name -> function) as a backend: each name it lacks is the
    reference's own (:mod:`npformer.functional`), as in the Numba backend."""

    def __init__(self, functions, name):
        self.functions, self.__name__ = dict(functions), name

    def __getattr__(self, name):
        if name in ("functions", "__name__"):       # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        if name in self.functions:
            return self.functions[name]
        return getattr(load("numpy"), name)


@contextlib.contextmanager
def using(functions, name):
    """``with using({"layernorm_backward": mine, ...}, "exercises"):`` every module calls the
    given functions (the reference for the others, products on npformer's BLAS thread count as
    the NumPy backend's) and :func:`get_backend` says ``name``; the backend before is restored
    after, even on an error. ``name`` must not be one of ``BACKENDS`` (a namespace is not one of
    them). The optimizers take the namespace's ``adam_step`` where it has one."""
    if name in BACKENDS:
        raise ValueError(f"name: expected a name other than {BACKENDS}, got {name!r}")
    get_backend()                                    # the one to restore, resolved now
    before = dict(_state)
    _state["ops"] = runtime.BlasScoped(Namespace(functions, name))
    _state["name"] = name
    try:
        yield _state["ops"]
    finally:
        _state.update(before)
