"""``npformer info``: print npformer's view of this machine: the cores it may use (affinity,
cgroup quota, thread caps), its thread policy, the BLAS, whether mpi4py and an MPI library are
installed, and the ranks x threads split recommended for data-parallel training, with its
``mpiexec`` line (docs/distributed.md)."""
import importlib.util
import json

from .. import distributed, runtime
from ..version import VERSION as __version__
from .common import command_parser


def add_parser(sub, name):
    p = command_parser(sub, name, __doc__,
                       "show the cores, threads, BLAS and MPI npformer would use")
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    p.set_defaults(run=run)


def mpi_status():
    """(mpi4py version or None, the MPI library's first line or a reason it cannot load)."""
    if importlib.util.find_spec("mpi4py") is None:
        return None, f"mpi4py is not installed: {distributed.INSTALL}"
    import mpi4py
    mpi4py.rc.initialize = False                 # ask the library its version, start nothing
    try:
        from mpi4py import MPI
        return mpi4py.__version__, " ".join(MPI.Get_library_version().splitlines()[0].split())
    except (ImportError, RuntimeError, OSError) as e:
        return mpi4py.__version__, f"no MPI library mpi4py can load ({e})"


def run(args):
    cores = distributed.machine_cores()
    ranks, threads = distributed.suggest_split(cores)
    mpi4py_version, library = mpi_status()
    # Open MPI binds each of 1 or 2 ranks to a single core unless told not to; npformer shares
    # the cores among the ranks itself (npformer.distributed.plan_shares)
    bind = "--bind-to none " if "Open MPI" in (library or "") else ""
    launch = (f"mpiexec {bind}-n {ranks} python -m mpi4py -m npformer train ..." if ranks > 1
              else "npformer train ... (one process)")
    summary = {"npformer": __version__, "machine_cores": cores, "runtime": runtime.describe(),
               "mpi4py": mpi4py_version, "mpi_library": library,
               "suggested_split": {"ranks": ranks, "threads": threads}, "launch": launch}
    if args.json:
        print(json.dumps(summary, default=str))
        return 0
    policy = runtime.policy()
    print(f"npformer {__version__}")
    print(f"cores: {cores} on this machine for this process (affinity and cgroup quota); the "
          f"runtime uses {policy.cores} ({policy.kernel_threads} kernel threads, "
          f"{policy.workers} workers)")
    print(f"BLAS: {json.dumps(runtime.blas_info(), default=str)}")
    print(f"MPI: {'mpi4py ' + mpi4py_version + ', ' if mpi4py_version else ''}{library}")
    print(f"data-parallel training: {ranks} ranks x {threads} thread(s) recommended; "
          f"effective batch = per-rank batch x {ranks}")
    print(f"  {launch}")
    return 0
