"""The command line's side of data-parallel training (``npformer train`` and ``npformer lm``
under ``mpiexec``; the design is in docs/distributed.md).

Started without a launcher, a command runs in one process exactly as before and never imports
MPI. Under a launcher of several processes, every npformer process, whatever its command, first
takes part in :func:`start` (called by ``npformer.cli.main`` before it parses anything): it joins
the job, and the ranks compare their command lines, which must be the same (a rank started with
another command or another ``--out`` would otherwise leave the others waiting, or be silently
ignored). Standard output is then silenced on every rank but the first (which prints, writes
the run folder and the progress bar). A command other than train and lm is refused on every
rank; :func:`join` gives each rank of a training its share of the machine's cores. Errors still
reach standard error from any rank, and ``npformer.cli.main`` then ends the whole job
(:func:`npformer.distributed.abort`), so no rank waits for one that is gone.
"""
import contextlib
import io
import json
import os
import shlex
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
    over the job's ranks (each pinned to its share of the cores; :func:`start` joined them)."""
    world = distributed.connect()
    if world is None:
        return SingleProcess()
    distributed.share_cores(world, threads=getattr(args, "threads", None),
                            blas_threads=getattr(args, "blas_threads", None))
    return MPICollective(world, reduce=args.reduce, abort_on_error=False)   # cli.main ends the
                                                                             # job on an error


def start(parser, argv, command):
    """Join the MPI job this process was started in and agree with every other rank on the
    command line (``argv``, before it is parsed by ``parser``; ``command`` the one it names, or
    None): the ``World``, or None for a process started alone. Every rank raises the same
    ValueError, naming the first rank whose command line differs from rank 0's and what
    differs; ``npformer.cli.main`` then ends the job. A command other than train and lm that
    cannot join the job is refused (it would run once per rank)."""
    try:
        world = distributed.connect()
    except ValueError:
        if command is not None and command not in PARALLEL_COMMANDS:
            refuse_launcher(command)
        raise
    if world is None:
        return None
    argvs = [json.loads(text) for text in distributed.gather_texts(world, json.dumps(argv))]
    for rank, other in enumerate(argvs[1:], 1):
        difference = describe_difference(parser, argvs[0], other, rank)
        if difference:
            raise ValueError(difference)
    if not world.is_root:
        sys.stdout = open(os.devnull, "w")       # rank 0 speaks for the job
    return world


def describe_difference(parser, argv0, argv, rank):
    """None where ``argv`` (rank ``rank``'s command line) asks for what ``argv0`` (rank 0's)
    asks for (the same words, or the same options in another order), else one line saying
    what differs: the command, each option with both values, or both command lines where one
    of them does not parse."""
    if argv == argv0:
        return None
    ours, theirs = _parse_quietly(parser, argv0), _parse_quietly(parser, argv)
    if ours is None or theirs is None:
        return (f"rank {rank} of the data-parallel run was started with another command line "
                f"than rank 0 (rank 0: npformer {_shown(shlex.join(argv0))}; rank {rank}: "
                f"npformer {_shown(shlex.join(argv))}): every rank must run the same command "
                f"line")
    ours, theirs = vars(ours), vars(theirs)
    if ours.get("command") != theirs.get("command"):
        return (f"rank {rank} of the data-parallel run was started with other command "
                f"{theirs.get('command')} than rank 0 ({ours.get('command')}): every rank must "
                f"run the same command line")
    names = [name for name in list(ours) + [n for n in theirs if n not in ours]
             if _comparable(ours.get(name)) != _comparable(theirs.get(name))]
    if not names:
        return None                              # the same options, in another order
    values = "; ".join(f"{name}: rank 0 {_value(ours.get(name))}, rank {rank} "
                       f"{_value(theirs.get(name))}" for name in names)
    return (f"rank {rank} of the data-parallel run was started with other "
            f"{'option' if len(names) == 1 else 'options'} {', '.join(names)} than rank 0 "
            f"({values}): every rank must run the same command line")


def _parse_quietly(parser, argv):
    """The namespace ``argv`` parses to, or None where it does not parse (or asks for help):
    argparse's messages are not shown."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return parser.parse_args(argv)
        except SystemExit:
            return None


def _comparable(value):
    """A parsed value as two ranks can compare it (a command's function by its name)."""
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', value)}"
    return repr(value)


def _value(value):
    return "not given" if value is None else _shown(str(value))


def _shown(text, width=120):
    """``text``, its end kept where it is longer than ``width`` (a path's end names it)."""
    return text if len(text) <= width else "..." + text[-(width - 3):]


def refuse_launcher(command):
    """Commands other than training run in one process: under a launcher of N > 1 processes they
    would run N copies of the same work (and write the same outputs)."""
    found = distributed.launcher_size()
    if command not in PARALLEL_COMMANDS and found and (found[1] or 2) > 1:
        raise ValueError(f"npformer {command} runs in one process, and ${found[0]} says an MPI "
                         f"launcher started {found[1] or 'several'} of them: start it without "
                         f"mpiexec (only {' and '.join(PARALLEL_COMMANDS)} train data-parallel)")
