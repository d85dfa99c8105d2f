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

The environment variable ``NPFORMER_BACKEND`` sets the starting choice. How the kernels use the
machine (threads, BLAS, the matrix-product dispatch table) is :mod:`npformer.runtime`'s concern.
"""
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


def get_backend():
    """The name of the active backend."""
    if _state["name"] is None:
        set_backend(_check(os.environ.get("NPFORMER_BACKEND", "numba"),
                           "environment variable NPFORMER_BACKEND"))
    return _state["name"]


def ops():
    """The active backend's namespace of forward/backward functions."""
    if _state["ops"] is None:
        get_backend()
    return _state["ops"]
