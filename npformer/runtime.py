"""npformer's runtime: how the engine uses the machine, in one place.

It owns four things, and nothing outside this module changes them:

1. **The cores.** :func:`available_cores` counts the cores this process may really use: its CPU
   affinity (``os.sched_getaffinity``, not ``os.cpu_count``), the cgroup CPU quota of a container
   (``cpu.max`` or ``cpu.cfs_quota_us``), and the caps a user set (``NPFORMER_NUM_THREADS``,
   ``OMP_NUM_THREADS``, ``NUMBA_NUM_THREADS``). A cap above the cores gets one warning and the
   cores win. (These and the policy below are :mod:`npformer.cores`'s, re-exported here.)
2. **The thread policy** (:class:`ThreadPolicy`, a pure function of the cores): the Numba kernels'
   ``prange`` loops on every core, and as many Python worker threads (this thread and
   ``cores - 1`` helpers, which block when idle) sharing the parts of parallel work: attention's
   heads, and the cells of a large matrix product.
3. **The BLAS threads**, through threadpoolctl: one inside npformer's own products (the cells are
   the parallelism), set around them and put back afterwards, so the user's other NumPy work
   keeps the user's setting.
4. **The matrix-product dispatch table**: which implementation (``"blas"``, ``"numba-blocked"``,
   ...) computes a product of a given shape. In deterministic mode (the default) no clock decides:
   the choice comes from a table that ``npformer calibrate`` wrote, or else from rules in
   ``npformer.kernels.matmul`` (shape and CPU features). The choices in force are recorded in
   every checkpoint (:func:`record`) and a resume adopts them (:func:`adopt`).

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
import copy
import ctypes
import functools
import ctypes.util
import hashlib
import json
import os
import platform
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .cores import (  # noqa: F401  (re-exported: npformer.runtime.available_cores as before)
    THREAD_CAPS, ThreadPolicy, affinity, affinity_cores, available_cores, cgroup_cpu_limit,
    thread_policy)
from .validation import check_flag, check_int

ENV_SWITCH = "NPFORMER_RUNTIME"                  # "off": leave threads to the libraries' defaults
ENV_TABLE = "NPFORMER_DISPATCH_TABLE"            # path of the dispatch table (else the cache dir)

TABLE_FORMAT = "npformer-dispatch-table"
TABLE_VERSION = 1

class NpformerRuntimeWarning(UserWarning):
    """Warnings of the runtime: a thread setting overridden, a dispatch table ignored."""


def _warn(message):
    warnings.warn(message, NpformerRuntimeWarning, stacklevel=3)


# -- state -----------------------------------------------------------------------------------
_lock = threading.RLock()
_state = {
    "ready": False,          # ensure() ran
    "managed": True,         # False: NPFORMER_RUNTIME=off, threads left to the libraries
    "policy": None,          # ThreadPolicy
    "blas_threads": 1,       # BLAS threads inside npformer's products (configure_runtime)
    "deterministic": True,
    "table": {},             # key -> variant, from a calibrated table file
    "table_source": None,    # the file it came from
    "adopted": {},           # key -> variant, from a checkpoint being resumed
    "used": {},              # key -> variant, every choice made in this process
    "features": None,        # this machine's CPU and BLAS facts (machine_features)
    "rule_features": None,   # the facts the rules read: this machine's, or a resumed run's
    "pool": None,
    "variants": None,        # the matmul variants this version has (register_variants)
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
        if not _state["table"] and _state["table_source"] is None:
            _load_default_table()


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


_SETTINGS = ("policy", "blas_threads", "managed", "deterministic")
# what decides the matrix products' variants: a calibrated table, a resumed checkpoint's choices
# and machine features (:func:`adopt`), and the choices made so far under them
_DISPATCH = ("table", "table_source", "adopted", "used", "rule_features")


def snapshot():
    """The runtime's settings now (its thread policy, BLAS threads, whether it manages them,
    deterministic mode, and what decides the products' variants: the table in force, a resumed
    run's adopted choices and features, the choices made so far), for :func:`restore`."""
    ensure()
    saved = {k: _state[k] for k in _SETTINGS}
    saved["dispatch"] = {k: copy.copy(_state[k]) for k in _DISPATCH}
    return saved


def restore(saved):
    """Put back settings :func:`snapshot` took (a test, or a caller that configured the
    runtime for a while, or resumed a checkpoint from another machine, whose rules it adopted)."""
    with _lock:
        _set_policy(saved["policy"])
        for k in _SETTINGS[1:]:
            _state[k] = saved[k]
        for k, value in saved.get("dispatch", {}).items():
            _state[k] = copy.copy(value)


def set_deterministic(flag=True):
    """Deterministic mode (the default): the same inputs and seed give the same bits in every
    process, on any number of threads. ``False`` lets the matmul dispatcher time its candidates
    once per shape and keep the fastest (the last percent of speed, different bits from run to
    run). Choices already made stay; call before the first step."""
    _state["deterministic"] = check_flag("set_deterministic(flag)", flag)


def is_deterministic():
    return _state["deterministic"]


def describe():
    """What the runtime does here, as a dict (the benchmarks print it)."""
    pol = policy()
    return {"managed": _state["managed"], "cores": pol.cores, "kernel_threads": pol.kernel_threads,
            "workers": pol.workers, "blas_threads": _state["blas_threads"],
            "deterministic": _state["deterministic"], "dispatch_table": _state["table_source"],
            "blas": blas_info()}


# -- threads around npformer's own calls -------------------------------------------------------
_blas = {"controllers": None}


def _blas_controllers():
    if _blas["controllers"] is None:
        try:
            from threadpoolctl import ThreadpoolController
            _blas["controllers"] = ThreadpoolController().select(user_api="blas").lib_controllers
        except Exception:                      # no threadpoolctl or no BLAS it knows: leave BLAS be
            _blas["controllers"] = []
    return _blas["controllers"]


def blas_info():
    """[(internal_api, version, architecture)] of the BLAS libraries loaded in this process,
    NumPy's first (others, such as SciPy's, follow in a fixed order)."""
    import numpy
    home = os.path.dirname(os.path.dirname(os.path.abspath(numpy.__file__)))
    numpy_libs = os.path.join(home, "numpy.libs")

    def order(c):
        path = os.path.abspath(getattr(c, "filepath", "") or "")
        return (not path.startswith(numpy_libs), path)
    return [(c.internal_api, c.version, getattr(c, "architecture", None))
            for c in sorted(_blas_controllers(), key=order)]


def blas_scope():
    """A context in which BLAS runs on npformer's thread count (1 unless configured), the
    previous count put back afterwards, so the user's own NumPy work keeps the user's setting.
    Does nothing where the runtime is off."""
    if not managed():
        return contextlib.nullcontext()
    return blas_threads(_state["blas_threads"])


_blas_lock = threading.Lock()
_blas_hold = {"saved": [], "counts": []}     # counts in force, outermost first (see blas_threads)


@contextlib.contextmanager
def blas_threads(n):
    """BLAS on ``n`` threads inside the block. BLAS's thread count is one setting for the whole
    process, so the blocks of every thread count together: the first to enter saves the user's
    setting, the last to leave puts it back, and a nested block with another count restores the
    enclosing block's on exit."""
    with _blas_lock:
        counts = _blas_hold["counts"]
        if not counts:
            _blas_hold["saved"] = [(c, c.get_num_threads()) for c in _blas_controllers()]
            current = None
        else:
            current = counts[-1]
        if n != current:
            for c, before in _blas_hold["saved"]:
                if current is not None or before != n:
                    c.set_num_threads(n)
        counts.append(n)
    try:
        yield
    finally:
        with _blas_lock:
            counts.pop()
            if not counts:
                for c, before in _blas_hold["saved"]:
                    if before != n:
                        c.set_num_threads(before)
            elif counts[-1] != n:
                for c, _ in _blas_hold["saved"]:
                    c.set_num_threads(counts[-1])


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


# -- the dispatch table ------------------------------------------------------------------------
def machine_features():
    """The facts about this machine that the dispatch rules may read: the CPU's vector width
    (AVX-512 or not, from LLVM's view of the host) and the BLAS's own kernel family."""
    if _state["features"] is None:
        try:
            from llvmlite import binding as llvm
            features = llvm.get_host_cpu_features()
            avx512 = bool(features.get("avx512f", False))
            avx2 = bool(features.get("avx2", False))
            cpu = llvm.get_host_cpu_name()
        except Exception:
            avx512 = avx2 = False
            cpu = platform.machine()
        arch = [a for (_, _, a) in blas_info()]
        _state["features"] = {"cpu": cpu, "avx2": avx2, "avx512f": avx512,
                              "blas_arch": arch[0] if arch else None}
    return dict(_state["features"])


def rule_features():
    """The facts the dispatch rules read: this machine's (:func:`machine_features`), or those
    recorded by the run being resumed, so that a resume on another machine chooses as it did."""
    return dict(_state["rule_features"] or machine_features())


def machine_id():
    """A short fingerprint of this CPU and NumPy's BLAS (a table calibrated elsewhere, or a
    checkpoint written elsewhere, may not compute the same way here)."""
    f = machine_features()
    blas = blas_info()[:1]
    text = json.dumps([f["cpu"], f["avx2"], f["avx512f"], f["blas_arch"],
                       [list(map(str, b)) for b in blas], platform.machine()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_table_path():
    """``NPFORMER_DISPATCH_TABLE`` if set, else ``$XDG_CACHE_HOME/npformer/dispatch-table.json``
    (``~/.cache`` when unset)."""
    if os.environ.get(ENV_TABLE):
        return Path(os.environ[ENV_TABLE])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "npformer" / "dispatch-table.json"


def register_variants(names):
    """The matmul dispatcher's variant names (``npformer.kernels.matmul`` registers them when it
    loads): a table or checkpoint naming anything else is not trusted."""
    _state["variants"] = frozenset(names)


def _known_variants():
    """The registered variant names, or None before the kernels loaded (then nothing can be
    checked, and nothing computes with the choices either)."""
    return _state["variants"]


def read_table(path):
    """The choices {key: variant} of a table file written by :func:`write_table`, or None with a
    warning naming the file when it is unreadable, corrupt, of another version, or calibrated on
    another machine. A missing file is None without a warning."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        _warn(f"dispatch table {path}: cannot be read ({e}); using the built-in rules")
        return None
    try:
        data = json.loads(text)
    except ValueError as e:
        _warn(f"dispatch table {path}: not valid JSON ({e}); using the built-in rules")
        return None
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
        _warn(f"dispatch table {path}: not an npformer dispatch table; using the built-in rules")
        return None
    if data.get("version") != TABLE_VERSION:
        _warn(f"dispatch table {path}: version {data.get('version')!r}, this npformer reads "
              f"version {TABLE_VERSION}; using the built-in rules (run `npformer calibrate` again)")
        return None
    if data.get("machine") != machine_id():
        _warn(f"dispatch table {path}: calibrated on another CPU or BLAS ({data.get('machine')!r}, "
              f"this machine is {machine_id()!r}); using the built-in rules")
        return None
    choices = data.get("choices")
    known = _known_variants()
    if (not isinstance(choices, dict)
            or not all(isinstance(k, str) and isinstance(v, str) and (known is None or v in known)
                       for k, v in choices.items())):
        _warn(f"dispatch table {path}: its choices are not a mapping of product keys to known "
              f"variants {sorted(known or ())}; using the built-in rules")
        return None
    return dict(choices)


def write_table(path, choices, timings=None):
    """Write a dispatch table (atomically) for this machine. Returns the path."""
    from npformer.checkpoint import write_file_atomic
    data = {"format": TABLE_FORMAT, "version": TABLE_VERSION, "machine": machine_id(),
            "features": machine_features(), "choices": dict(sorted(choices.items())),
            "timings_ms": {k: {n: round(s * 1e3, 4) for n, s in t.items()}
                           for k, t in sorted((timings or {}).items())}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (json.dumps(data, indent=1) + "\n").encode()
    write_file_atomic(path, lambda f: f.write(text))
    return path


def _load_default_table():
    path = default_table_path()
    choices = read_table(path)
    if choices is not None:
        _state["table"] = choices
        _state["table_source"] = str(path)


def use_table(path):
    """Use the dispatch table at ``path`` from now on (None: none, the rules alone). Returns True
    if it was read (a bad one warns and is ignored)."""
    with _lock:
        ensure()
        _state["table"], _state["table_source"] = {}, None
        if path is None:
            return False
        choices = read_table(path)
        if choices is None:
            return False
        _state["table"], _state["table_source"] = choices, str(path)
        return True


def dispatch_choice(key):
    """The variant fixed for a product key (adopted from a checkpoint, made earlier in this
    process, or from the table in force), or None: the caller applies its rules and
    :func:`remember`s. The caller also checks that the variant can compute its product."""
    name = _state["adopted"].get(key) or _state["used"].get(key)
    if name is None:
        name = _state["table"].get(key)
        if name is not None:
            _state["used"][key] = name
    return name


def refuse_choice(key, name, why):
    """A fixed choice that cannot be used (a table or checkpoint naming a variant this product
    cannot use): warn once per key and forget it; the caller's rules choose instead."""
    for source in ("adopted", "used", "table"):
        if _state[source].get(key) == name:
            del _state[source][key]
    note = ("dispatch", key, name)
    if note not in _state["noted"]:
        _state["noted"].add(note)
        _warn(f"the dispatch table in force ({_state['table_source'] or 'this process'}) names "
              f"variant {name!r} for product {key}, which {why}; using the built-in rules instead"
              f" (a resumed run is then no longer bit-exact)")


def remember(key, name):
    """Record the variant chosen for ``key`` (the rules' or a measured one)."""
    _state["used"][key] = name


def forget_choices():
    """Forget every choice made in this process (a new table, a new mode)."""
    _state["used"].clear()


def choices():
    """{key: variant} of every product computed so far in this process."""
    return dict(_state["used"])


RECORD_FORMAT = "npformer-runtime/1"


def record():
    """What a checkpoint stores so that a resume computes with the same variants: the choices
    made so far, the table in force, the features the rules read, and the mode."""
    return {"format": RECORD_FORMAT, "deterministic": _state["deterministic"],
            "machine": machine_id(), "features": rule_features(), "table": dict(_state["table"]),
            "choices": {**_state["used"], **_state["adopted"]}}


def adopt(rec, where):
    """Use the choices recorded by :func:`record` in checkpoint ``where`` from now on.

    The record's choices and table become the ones in force (a table calibrated since is not
    consulted), and the rules read the recorded machine features. Returns True if the resumed
    run computes as the recorded one did. Choices naming a variant this version lacks are
    dropped with a warning (the rules choose instead); a record from non-deterministic mode or
    from another CPU or BLAS warns too: then the run goes on, but not bit for bit."""
    if rec is None:
        return True                                  # a checkpoint from before the runtime record
    exact = True
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        _warn(f"checkpoint {where}: its runtime record is not one this version reads; the "
              f"resumed run uses this machine's choices and is not bit-exact")
        return False
    known = _known_variants()
    merged = {}
    for source in ("table", "choices"):
        entries = rec.get(source) or {}
        if not isinstance(entries, dict):
            continue
        for key, name in entries.items():
            if isinstance(key, str) and isinstance(name, str) and (known is None or name in known):
                merged[key] = name
            else:
                exact = False
                _warn(f"checkpoint {where}: records matrix-product variant {name!r} for {key}, "
                      f"which this version lacks; using the rules' choice instead, so the "
                      f"resumed run is no longer bit-exact")
    if rec.get("deterministic") is False:
        exact = False
        _warn(f"checkpoint {where}: was trained with set_deterministic(False); its resume is "
              f"not bit-exact")
    if rec.get("machine") not in (None, machine_id()):
        exact = False
        _warn(f"checkpoint {where}: was written on another CPU or BLAS ({rec.get('machine')!r}, "
              f"this machine is {machine_id()!r}); it resumes with the same product variants, "
              f"but the BLAS's kernels may round differently, so not necessarily bit for bit")
    features = rec.get("features")
    _state["rule_features"] = (dict(machine_features(), **features)
                               if isinstance(features, dict) else None)
    _state["table"] = {}                         # the record's table is among ``merged``
    _state["table_source"] = f"checkpoint {where}"
    _state["adopted"] = merged
    _state["used"].clear()
    return exact
