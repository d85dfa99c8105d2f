"""Which implementation of the functional core the modules call: "numba" (default) or "numpy".

Both backends expose the same names and signatures as :mod:`npformer.functional`::

    out, cache = ops().attention_forward(q, k, v, mask, ...)
    dq, dk, dv = ops().attention_backward(dout, cache)

"numpy" is :mod:`npformer.functional` itself, the readable reference. "numba" is
:mod:`npformer.kernels`: compiled, fused kernels for the same maths (and the reference functions
wherever NumPy is already as fast). A forward and its backward must come from the same backend,
since the caches differ; modules look ``ops()`` up when they run, so switch between steps.

The environment variable ``NPFORMER_BACKEND`` sets the starting choice.

Threads and memory are decided here too, in :func:`configure_runtime` (the CLI and the
benchmarks call it; importing npformer changes nothing by itself):

- BLAS (OpenBLAS, through NumPy) runs on **one** thread per call. Measured on the 2-core machine
  (BENCHMARKS.md) while other programs ran: with 2 OpenBLAS threads every GEMM of the base config
  was as slow or slower (the (1920 x 256) @ (256 x 512) product 8.0 ms instead of 5.0 ms, an
  (8 x 256) @ (256 x 768) one 8 ms instead of 0.05 ms: its threads wait for each other in 4 ms
  scheduler ticks), and a base training step took 1.9 s (median) instead of 0.78 s. The second
  core still serves the big GEMMs: the Numba backend's dispatcher (``kernels/matmul.py``) may
  split a large product's rows between two Python threads, each calling single-threaded BLAS
  (a waiting Python thread blocks instead of spinning), when that measures faster.
- Numba kernels use every core (``prange``) on Numba's ``workqueue`` layer, which sleeps between
  parallel regions (:func:`use_workqueue_threads`; the OpenMP layer spins, and on 2 cores its
  threads take the cores from the BLAS calls between kernels: a base training step measured
  440 ms instead of 300). No kernel calls BLAS inside ``prange`` and BLAS calls happen between
  kernels, never during them, so the two pools never compete for a core.
- Freed memory stays in the process (glibc ``mallopt``): every fresh multi-megabyte array is
  otherwise a new ``mmap`` whose pages fault in at first touch; measured: attention backward
  9.3 ms -> 5.3 ms at T=32. Peak memory is unchanged (it is the peak of live arrays).
"""
import ctypes
import ctypes.util
import glob
import importlib
import importlib.util
import os
import sys
from pathlib import Path

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
    _state["ops"] = load(name)
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


# -- threads and memory ----------------------------------------------------------------------
_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads")


def _openblas_libraries():
    import numpy
    libs = os.path.join(os.path.dirname(numpy.__file__), os.pardir, "numpy.libs")   # Linux wheels
    return sorted(glob.glob(os.path.join(libs, "*openblas*")))


def set_blas_threads(n):
    """Use ``n`` BLAS threads from now on (the env var only works before NumPy loads; this calls
    OpenBLAS's own ``openblas_set_num_threads``). Returns True if an OpenBLAS was found and set."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"blas_threads: expected a positive integer, got {n!r}")
    for path in _openblas_libraries():
        try:
            lib = ctypes.CDLL(path)          # already loaded by NumPy: the same library instance
        except OSError:
            continue
        for name in _BLAS_SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(n))
                return True
    return False


def use_workqueue_threads():
    """Choose Numba's ``workqueue`` threading layer, unless ``NUMBA_THREADING_LAYER`` chose one.

    It only takes effect before Numba starts its thread pool, which the first parallel kernel
    or ``numba.set_num_threads`` does; so both :mod:`npformer.kernels` (on import) and
    :func:`set_numba_threads` call this first, whichever comes first in a program."""
    import numba
    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER = "workqueue"


def set_numba_threads(n):
    """Use ``n`` threads in the Numba kernels' ``prange`` loops (at most NUMBA_NUM_THREADS)."""
    import numba
    use_workqueue_threads()                  # before set_num_threads starts the thread pool
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"threads: expected an integer in [1, {numba.config.NUMBA_NUM_THREADS}] "
                         f"(NUMBA_NUM_THREADS), got {n!r}")
    numba.set_num_threads(n)


def keep_freed_memory():
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS (so a new
    activation array reuses already-mapped pages). Returns False where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_trim_threshold, 1 << 30)) and bool(mallopt(m_mmap_threshold, 1 << 30))


def configure_runtime(threads=None, blas_threads=1, keep_memory=True):
    """The thread and memory policy of npformer (see the module docstring): Numba kernels on
    ``threads`` (default: every core Numba sees), BLAS on ``blas_threads`` (default 1; None
    leaves BLAS as it is), freed memory kept for reuse.
    Returns {"threads", "blas_threads", "blas_set", "keep_memory"}."""
    import numba
    threads = numba.config.NUMBA_NUM_THREADS if threads is None else threads
    set_numba_threads(threads)
    blas_set = set_blas_threads(blas_threads) if blas_threads is not None else False
    kept = keep_freed_memory() if keep_memory else False
    dispatcher = sys.modules.get("npformer.kernels.matmul")
    if dispatcher is not None:
        dispatcher.reset()              # speeds measured under the old thread counts are stale
    return {"threads": threads, "blas_threads": blas_threads, "blas_set": blas_set,
            "keep_memory": kept}
