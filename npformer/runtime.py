"""npformer's runtime: how the engine uses the machine, in one place.

It owns four things, and nothing outside it changes them. Their mechanics stand in modules of
their own below this one (:mod:`npformer.cores`, :mod:`npformer.blas`,
:mod:`npformer.dispatch_table`), whose public names it re-exports: ``npformer.runtime.X`` is
the one place to call.

1. **The cores.** :func:`available_cores` counts the cores this process may really use: its CPU
   affinity (``os.sched_getaffinity``, not ``os.cpu_count``), the cgroup CPU quota of a container
   (``cpu.max`` or ``cpu.cfs_quota_us``), and the caps a user set (``NPFORMER_NUM_THREADS``,
   ``OMP_NUM_THREADS``, ``NUMBA_NUM_THREADS``). A cap above the cores gets one warning and the
   cores win. (These and the policy below are :mod:`npformer.cores`'s, applied here.)
2. **The thread policy** (:class:`ThreadPolicy`, a pure function of the cores): the Numba kernels'
   ``prange`` loops on every core, and as many Python worker threads (this thread and
   ``cores - 1`` helpers, which block when idle) sharing the parts of parallel work: attention's
   heads, and the cells of a large matrix product.
3. **The BLAS threads**, through threadpoolctl: one inside npformer's own products (the cells are
   the parallelism), set around them and put back afterwards, so the user's other NumPy work
   keeps the user's setting (:func:`blas_scope`; the mechanism is :mod:`npformer.blas`'s).
4. **The matrix-product dispatch table**: which implementation (``"blas"``, ``"numba-blocked"``,
   ...) computes a product of a given shape. In deterministic mode (the default) no clock decides:
   the choice comes from a table that ``npformer calibrate`` wrote, or else from rules in
   ``npformer.kernels.matmul`` (shape and CPU features). The choices in force are recorded in
   every checkpoint (:func:`record`) and a resume adopts them (:func:`adopt`). The table, its
   state and deterministic mode are :mod:`npformer.dispatch_table`'s.

This module holds the threads' state: the policy in force, the BLAS count inside npformer's
products, the worker threads that share the parts of parallel work (:func:`run_parts`), and
the :func:`snapshot` and :func:`restore` of every setting, the dispatch table's included.

Same bits on any number of threads: every parallel kernel gives each thread disjoint outputs and
reduces in an order fixed by the shape (fixed chunk counts, never ``n_threads`` chunks); a large
product is cut into cells fixed by its shape, each computed by single-threaded BLAS. (A BLAS
divides a product between its own threads by their number, and some round the edges of each
share differently: OpenBLAS's AVX-512 float64 kernels give other bits on 1, 2 or 3 threads.)

It applies itself on first use of the engine (when the kernels load), not on ``import npformer``;
set ``NPFORMER_RUNTIME=off`` to leave threads entirely to NumPy's and Numba's defaults (the
variants are still chosen without a clock, but the BLAS then shares products between its own
threads, whose number can change float64 bits), or call :func:`configure_runtime` to override
the policy. The one process-wide setting made without asking is Numba's threading layer
(``workqueue``, only where ``NUMBA_THREADING_LAYER`` does not name one: it must be chosen before
Numba's pool starts); others (glibc ``mallopt``, :func:`keep_freed_memory`) only where asked for.

The reasoning and the costs are in docs/kernels.md ("Threads and determinism").
"""
import contextlib
import ctypes
import ctypes.util
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from . import dispatch_table
from .blas import blas_info, blas_threads  # noqa: F401  (re-exported)
from .cores import (  # noqa: F401  (re-exported: npformer.runtime.available_cores as before)
    THREAD_CAPS, NpformerRuntimeWarning, ThreadPolicy, affinity, affinity_cores, available_cores,
    cgroup_cpu_limit, thread_policy)
from .cores import runtime_warning as _warn
from .dispatch_table import (  # noqa: F401  (re-exported: npformer.runtime.use_table as before)
    ENV_TABLE, RECORD_FORMAT, TABLE_FORMAT, TABLE_VERSION, adopt, choices, default_table_path,
    dispatch_choice, forget_choices, is_deterministic, machine_features, machine_id, read_table,
    record, refuse_choice, register_variants, remember, rule_features, set_deterministic,
    use_table, write_table)
from .validation import check_int

ENV_SWITCH = "NPFORMER_RUNTIME"                  # "off": leave threads to the libraries' defaults

# -- state -----------------------------------------------------------------------------------
_lock = threading.RLock()
_state = {
    "ready": False,          # ensure() ran
    "managed": True,         # False: NPFORMER_RUNTIME=off, threads left to the libraries
    "policy": None,          # ThreadPolicy
    "blas_threads": 1,       # BLAS threads inside npformer's products (configure_runtime)
    "pool": None,
    "noted": set(),          # thread settings already warned about
}


def ensure():
    """Apply the runtime once, on first use of the engine (the kernels call this on import)."""
    if _state["ready"]:
        return
    with _lock:
        if _state["ready"]:
            return
        switch = os.environ.get(ENV_SWITCH, "on").strip().lower()
        if switch not in ("on", "off", "1", "0", ""):
            _warn(f"{ENV_SWITCH}={switch!r}: expected 'on' or 'off'; using 'on'")
        _state["managed"] = switch not in ("off", "0")
        if _state["policy"] is None:
            _state["policy"] = _policy_from_machine()
        if _state["managed"]:
            use_workqueue_threads()
        _state["ready"] = True
        dispatch_table.load_default_table()


def _numba_max():
    import numba
    return int(numba.config.NUMBA_NUM_THREADS)


def _policy_from_machine():
    """The policy for this process's cores; each contradicting setting warned about once."""
    cores, notes = available_cores()
    for note in notes:
        if note not in _state["noted"]:
            _state["noted"].add(note)
            _warn(f"npformer runtime: {note}")
    return thread_policy(cores, numba_max=_numba_max())


def policy():
    """The thread policy in force (computed on first use)."""
    ensure()
    return _state["policy"]


def managed():
    """False where the user opted out (``NPFORMER_RUNTIME=off``)."""
    ensure()
    return _state["managed"]


def use_workqueue_threads():
    """Choose Numba's ``workqueue`` threading layer, unless ``NUMBA_THREADING_LAYER`` chose one.

    Its threads sleep between parallel regions; OpenMP's spin, and take the cores from the BLAS
    calls that run between kernels. Only effective before Numba starts its pool (the first
    parallel kernel), hence done on first use of the engine."""
    import numba
    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER = "workqueue"


def keep_freed_memory():
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS, so a new
    activation array reuses already-mapped pages instead of faulting fresh ones in (npformer's
    own large arrays come from ``npformer.aligned``'s pool anyway). A process-wide setting: made
    only by :func:`configure_runtime` ``(keep_memory=True)``. Returns False where there is no
    glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_trim_threshold, 1 << 30)) and bool(mallopt(m_mmap_threshold, 1 << 30))


def configure_runtime(threads=None, blas_threads=None, keep_memory=False, deterministic=None):
    """Override the runtime's choices (everything else it decides on its own):

    - ``threads``: the cores to use (default: :func:`available_cores`); above the available cores
      it warns and uses those;
    - ``blas_threads``: BLAS threads inside each product npformer computes (default 1: a large
      product is divided into parts fixed by its shape, which the worker threads share; more
      BLAS threads may change float64 results with the count on some BLAS builds); above the
      available cores it warns and uses those (BLAS threads beyond the cores only wait on
      each other: on 2 cores, 64 of them made a NumPy-backend step many times slower);
    - ``keep_memory``: keep freed memory in the process (glibc ``mallopt``, process-wide);
    - ``deterministic``: see :func:`set_deterministic`.

    It also turns the runtime on where ``NPFORMER_RUNTIME=off`` had turned it off. Returns a
    summary dict (:func:`describe`)."""
    threads = check_int("threads", threads, allow_none=True)
    blas_threads = check_int("blas_threads", blas_threads, allow_none=True)
    with _lock:
        ensure()
        if threads is None:
            pol = _policy_from_machine()
        else:
            cores, _ = available_cores()
            if threads > cores:
                _warn(f"npformer runtime: threads={threads} is more than the {cores} core(s) this "
                      f"process may use; using {cores}")
                threads = cores
            pol = thread_policy(threads, numba_max=_numba_max())
        if blas_threads is not None:
            cores, _ = available_cores()
            if blas_threads > cores:
                _warn(f"npformer runtime: blas_threads={blas_threads} is more than the {cores} "
                      f"core(s) this process may use; using {cores}")
                blas_threads = cores
        _set_policy(pol)
        _state["blas_threads"] = blas_threads or 1
        _state["managed"] = True
        use_workqueue_threads()
        if deterministic is not None:
            set_deterministic(deterministic)
        kept = keep_freed_memory() if keep_memory else False
    summary = describe()
    summary["keep_memory"] = kept
    return summary


def _set_policy(pol):
    """The thread policy ``pol`` in force; a worker pool of another size is let go (the next
    parallel call makes one of the new size)."""
    _state["policy"] = pol
    if _state["pool"] is not None and _state["pool"][1] != pol.workers - 1:
        _state["pool"][0].shutdown(wait=True)
        _state["pool"] = None


_SETTINGS = ("policy", "blas_threads", "managed")


def snapshot():
    """The runtime's settings now (its thread policy, BLAS threads, whether it manages them,
    deterministic mode, and what decides the products' variants: the table in force, a resumed
    run's adopted choices and features, the choices made so far), for :func:`restore`."""
    ensure()
    saved = {k: _state[k] for k in _SETTINGS}
    saved["deterministic"] = is_deterministic()
    saved["dispatch"] = dispatch_table.snapshot()
    return saved


def restore(saved):
    """Put back settings :func:`snapshot` took (a test, or a caller that configured the
    runtime for a while, or resumed a checkpoint from another machine, whose rules it adopted)."""
    with _lock:
        _set_policy(saved["policy"])
        for k in _SETTINGS[1:]:
            _state[k] = saved[k]
        set_deterministic(saved["deterministic"])
        dispatch_table.restore(saved.get("dispatch", {}))


def describe():
    """What the runtime does here, as a dict (the benchmarks print it)."""
    pol = policy()
    return {"managed": _state["managed"], "cores": pol.cores, "kernel_threads": pol.kernel_threads,
            "workers": pol.workers, "blas_threads": _state["blas_threads"],
            "deterministic": is_deterministic(), "dispatch_table": dispatch_table.table_source(),
            "blas": blas_info()}


# -- threads around npformer's own calls -------------------------------------------------------
def blas_scope():
    """A context in which BLAS runs on npformer's thread count (1 unless configured), the
    previous count put back afterwards, so the user's own NumPy work keeps the user's setting.
    Does nothing where the runtime is off."""
    if not managed():
        return contextlib.nullcontext()
    return blas_threads(_state["blas_threads"])


class BlasScoped:
    """A namespace of functions (the NumPy reference backend) each run inside :func:`blas_scope`,
    so that its products, like the kernels', do not depend on BLAS's thread count. ``module``
    is the namespace itself."""

    def __init__(self, module):
        self.module = module
        self.__name__ = module.__name__

    def __getattr__(self, name):
        value = getattr(self.module, name)
        if not callable(value) or isinstance(value, type):
            return value

        @functools.wraps(value)
        def scoped(*args, **kwargs):
            with blas_scope():
                return value(*args, **kwargs)
        setattr(self, name, scoped)                  # looked up once
        return scoped


def kernel_threads():
    """Threads for a parallel Numba kernel now, or None to leave Numba's setting alone."""
    if not managed():
        return None
    return _state["policy"].kernel_threads


def _executor():
    pol = _state["policy"]
    helpers = pol.workers - 1
    if _state["pool"] is None:
        with _lock:
            if _state["pool"] is None:
                _state["pool"] = (ThreadPoolExecutor(helpers, thread_name_prefix="npformer-worker"),
                                  helpers)
    return _state["pool"][0]


def _forget_threads_in_child():
    """After ``fork`` the child has none of the parent's threads: its copy of the pool would take
    jobs no thread runs (the first parallel call hung), and a lock another thread held at the fork
    stays held. The child starts afresh: a new lock, and a pool of its own on its first call."""
    global _lock
    _lock = threading.RLock()
    _state["pool"] = None


if hasattr(os, "register_at_fork"):                    # POSIX
    os.register_at_fork(after_in_child=_forget_threads_in_child)


def workers():
    """How many Python threads (this one included) :func:`run_parts` uses."""
    return policy().workers if managed() else 1


_in_part = threading.local()                 # set while a thread computes a part


def run_parts(fn, parts, max_workers=None):
    """fn(part) for every part, on this thread and up to ``workers() - 1`` helper threads (at most
    ``max_workers`` in all), each taking the next part nobody has taken (a thread the machine
    slows down simply does fewer). BLAS runs on npformer's count inside (:func:`blas_scope`; one
    unless configured: the parts are the parallelism). The parts must write disjoint outputs:
    then which thread computes a part changes nothing in the result. Helpers must not enter
    Numba's parallel pool: parts run serial kernels. A part that itself calls ``run_parts`` runs
    its parts inline. The first exception stops the handing out of parts and propagates."""
    parts = list(parts)
    n = min(len(parts), workers(), max_workers or len(parts))
    if getattr(_in_part, "active", False):
        n = 1
    with blas_scope():
        if n <= 1:
            for part in parts:
                fn(part)
            return
        todo, lock, failed = iter(parts), threading.Lock(), []

        def work():
            _in_part.active = True
            try:
                while not failed:
                    with lock:
                        part = next(todo, None)
                    if part is None:
                        return
                    try:
                        fn(part)
                    except BaseException:
                        failed.append(True)
                        raise
            finally:
                _in_part.active = False
        jobs = [_executor().submit(work) for _ in range(n - 1)]
        try:
            work()
        finally:
            for job in jobs:
                job.result()
