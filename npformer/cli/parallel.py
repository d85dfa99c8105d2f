"""The command line's side of data-parallel training (``npformer train`` and ``npformer lm``
under ``mpiexec``; the design is in docs/distributed.md).

Started without a launcher, a command runs in one process exactly as before and never imports
MPI. Under a launcher, :func:`join` connects the ranks, gives each its share of the machine's
cores and silences standard output on every rank but the first (which prints, writes the run
folder and the progress bar); errors still reach standard error from any rank, and
``npformer.cli.main`` then ends the whole job (:func:`npformer.distributed.abort`).
"""
import os
import sys

from .. import distributed
from ..training.collective import REDUCE_MODES, MPICollective, SingleProcess

PARALLEL_COMMANDS = ("train", "lm")


def add_parallel_args(p):
    g = p.add_argument_group("data-parallel training (under mpiexec; docs/distributed.md)")
    g.add_argument("--reduce", choices=REDUCE_MODES, default="ordered",
                   help="how the ranks' gradients are summed: 'ordered' adds them in rank order, "
                        "the same bits on every run (default); 'mpi' is one MPI Allreduce, in "
                        "the order of the library's reduction tree")


def join(args):
    """The run's collective: ``SingleProcess`` without a launcher, else an ``MPICollective``
    over the job's ranks (each pinned to its share of the cores)."""
    world = distributed.connect()
    if world is None:
        return SingleProcess()
    distributed.share_cores(world, threads=getattr(args, "threads", None),
                            blas_threads=getattr(args, "blas_threads", None))
    if not world.is_root:
        sys.stdout = open(os.devnull, "w")       # rank 0 speaks for the run
    return MPICollective(world, reduce=args.reduce, abort_on_error=False)   # cli.main ends the
                                                                             # job on an error


def refuse_launcher(command):
    """Commands other than training run in one process: under a launcher of N > 1 processes they
    would run N copies of the same work (and write the same outputs)."""
    found = distributed.launcher_size()
    if command not in PARALLEL_COMMANDS and found and (found[1] or 2) > 1:
        raise ValueError(f"npformer {command} runs in one process, and ${found[0]} says an MPI "
                         f"launcher started {found[1] or 'several'} of them: start it without "
                         f"mpiexec (only {' and '.join(PARALLEL_COMMANDS)} train data-parallel)")
