"""The matrix-product dispatch table: which implementation (``"blas"``, ``"numba-blocked"``,
...) computes a product of a given shape, and the deterministic mode that says whether a clock
may decide it.

In deterministic mode (the default) no clock decides: the choice comes from a table that
``npformer calibrate`` wrote (:func:`write_table`, :func:`use_table`; by default the one at
:func:`default_table_path`, read on the engine's first use), or else from the rules in
``npformer.kernels.matmul``, which read the shape and the machine's features
(:func:`rule_features`). Every choice made is remembered (:func:`remember`), so a product keeps
its variant for the life of the process; the choices in force are recorded in every checkpoint
(:func:`record`) and a resume adopts them (:func:`adopt`), so it computes as the recorded run
did. The matmul dispatcher registers its variant names here (:func:`register_variants`): this
module imports neither the kernels nor the rest of the runtime. :mod:`npformer.runtime`
re-exports its public names and takes its settings into ``snapshot``/``restore``.
"""
import copy
import hashlib
import json
import os
import platform
import threading
from pathlib import Path

from .blas import blas_info
from .cores import runtime_warning as _warn
from .validation import check_flag

ENV_TABLE = "NPFORMER_DISPATCH_TABLE"            # path of the dispatch table (else the cache dir)

TABLE_FORMAT = "npformer-dispatch-table"
TABLE_VERSION = 1

_lock = threading.RLock()
_state = {
    "deterministic": True,
    "default_read": False,   # the default table was considered (load_default_table)
    "table": {},             # key -> variant, from a calibrated table file
    "table_source": None,    # the file it came from
    "adopted": {},           # key -> variant, from a checkpoint being resumed
    "used": {},              # key -> variant, every choice made in this process
    "features": None,        # this machine's CPU and BLAS facts (machine_features)
    "rule_features": None,   # the facts the rules read: this machine's, or a resumed run's
    "variants": None,        # the matmul variants this version has (register_variants)
    "noted": set(),          # refused choices already warned about
}
# what decides the matrix products' variants: a calibrated table, a resumed checkpoint's choices
# and machine features (:func:`adopt`), and the choices made so far under them
_DISPATCH = ("table", "table_source", "adopted", "used", "rule_features")


def set_deterministic(flag=True):
    """Deterministic mode (the default): the same inputs and seed give the same bits in every
    process, on any number of threads. ``False`` lets the matmul dispatcher time its candidates
    once per shape and keep the fastest (the last percent of speed, different bits from run to
    run). Choices already made stay; call before the first step."""
    _state["deterministic"] = check_flag("set_deterministic(flag)", flag)


def is_deterministic():
    return _state["deterministic"]


def table_source():
    """Where the table in force came from (a file, ``checkpoint ...``), or None: the rules."""
    return _state["table_source"]


def snapshot():
    """What decides the products' variants now (the table in force, a resumed run's adopted
    choices and features, the choices made so far), for :func:`restore`."""
    return {k: copy.copy(_state[k]) for k in _DISPATCH}


def restore(saved):
    """Put back what :func:`snapshot` took."""
    with _lock:
        for k, value in saved.items():
            _state[k] = copy.copy(value)


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


def load_default_table():
    """Put the table at :func:`default_table_path` in force, the first time this is called
    (``npformer.runtime.ensure``: the engine's first use), unless a table or a resumed run's
    choices are in force already."""
    with _lock:
        if _state["default_read"]:
            return
        _state["default_read"] = True
        if _state["table"] or _state["table_source"] is not None:
            return
        path = default_table_path()
        choices = read_table(path)
        if choices is not None:
            _state["table"] = choices
            _state["table_source"] = str(path)


def use_table(path):
    """Use the dispatch table at ``path`` from now on (None: none, the rules alone). Returns True
    if it was read (a bad one warns and is ignored)."""
    with _lock:
        load_default_table()                     # so that it cannot replace this one later
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
