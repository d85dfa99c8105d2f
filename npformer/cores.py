"""The cores npformer may use and the thread policy they imply: pure functions of the machine
(its affinity mask, a container's cgroup CPU quota) and of the user's thread caps, which
:mod:`npformer.runtime` applies.

:func:`available_cores` counts the cores this process may really use: its CPU affinity
(``os.sched_getaffinity``, not ``os.cpu_count``), the cgroup CPU quota of a container
(``cpu.max`` or ``cpu.cfs_quota_us``), and the caps a user set (``NPFORMER_NUM_THREADS``,
``OMP_NUM_THREADS``, ``NUMBA_NUM_THREADS``); :func:`thread_policy` gives each kind of work its
threads for that many cores (:class:`ThreadPolicy`).

The runtime's warning (:class:`NpformerRuntimeWarning`) is declared here, below the modules
that warn with it (:mod:`npformer.runtime`, :mod:`npformer.dispatch_table`).
"""
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

THREAD_CAPS = ("NPFORMER_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")


class NpformerRuntimeWarning(UserWarning):
    """Warnings of the runtime: a thread setting overridden, a dispatch table ignored."""


def runtime_warning(message):
    """Warn ``message`` as an :class:`NpformerRuntimeWarning`, pointing at the caller of the
    runtime function that warns."""
    warnings.warn(message, NpformerRuntimeWarning, stacklevel=3)


def affinity():
    """The CPUs this process may be scheduled on (its affinity mask), sorted."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def affinity_cores():
    """How many CPUs this process may be scheduled on (at least 1)."""
    return max(1, len(affinity()))


def cgroup_cpu_limit(root="/sys/fs/cgroup"):
    """The CPU quota of this process's cgroup in cores (e.g. 2.5), or None where there is none.

    cgroup v2: ``<root>/cpu.max`` holds "<quota> <period>" or "max <period>"; cgroup v1:
    ``<root>/cpu/cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    root = Path(root)
    try:
        fields = (root / "cpu.max").read_text().split()
        if len(fields) == 2 and fields[0] != "max":
            return int(fields[0]) / int(fields[1])
        return None
    except (OSError, ValueError):
        pass
    for folder in ("cpu", "cpu,cpuacct"):
        try:
            quota = int((root / folder / "cpu.cfs_quota_us").read_text())
            period = int((root / folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None


def available_cores(affinity=None, quota=None, environ=None):
    """(cores, notes): how many cores npformer may use, and a note for every setting overruled.

    ``affinity`` (CPUs in the affinity mask), ``quota`` (cgroup quota in cores, None: none) and
    ``environ`` default to this process's; the tests pass their own. A thread cap in the
    environment (``NPFORMER_NUM_THREADS``, ``OMP_NUM_THREADS``, ``NUMBA_NUM_THREADS``) lowers the
    count; one above the cores, or one that is not a positive integer, is noted and ignored."""
    affinity = affinity_cores() if affinity is None else affinity
    quota = cgroup_cpu_limit() if quota is None and environ is None else quota
    environ = os.environ if environ is None else environ
    cores = max(1, int(affinity))
    if quota is not None and quota > 0:
        cores = min(cores, max(1, math.ceil(quota - 1e-9)))
    notes = []
    caps = []
    for var in THREAD_CAPS:
        raw = environ.get(var)
        if raw is None or raw.strip() == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            notes.append(f"{var}={raw!r} is not a positive integer; ignored")
        elif value > cores:
            notes.append(f"{var}={value} asks for more threads than the {cores} core(s) this "
                         f"process may use (affinity, cgroup quota); using {cores}")
        else:
            caps.append(value)
    return (min([cores] + caps), notes)


@dataclass(frozen=True)
class ThreadPolicy:
    """How many threads each kind of work gets, for ``cores`` usable cores.

    ``kernel_threads``: the Numba kernels' ``prange`` loops; ``workers``: Python threads (the
    caller and ``workers - 1`` helpers) sharing the parts of parallel work: attention's heads,
    the cells of a large product (each by single-threaded BLAS or the blocked kernel)."""
    cores: int
    kernel_threads: int
    workers: int


def thread_policy(cores, numba_max=None):
    """The policy for ``cores`` usable cores. ``numba_max``: the size of Numba's thread pool
    (``NUMBA_NUM_THREADS``, fixed when Numba loads), which ``kernel_threads`` cannot exceed.
    No kind of work gets more threads than cores, and the kinds never run at the same time
    (parallel kernels and parts of products alternate; a waiting worker blocks, it does not
    spin), so nothing oversubscribes."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores: expected a positive integer, got {cores!r}")
    kernel = cores if numba_max is None else max(1, min(cores, numba_max))
    return ThreadPolicy(cores=cores, kernel_threads=kernel, workers=cores)
