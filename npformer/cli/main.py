"""``npformer``: the command line. One sub-command per file in this package.

    npformer toy                                  # train the toy zh->en model, print examples
    npformer translate --checkpoint runs/toy "我 有 一个 苹果"
    npformer download tinyshakespeare             # the character model's text
    npformer lm --data tinyshakespeare --out runs/shakespeare
    npformer sample --checkpoint runs/shakespeare/best --prompt "ROMEO:" --max-new-tokens 300
    npformer sample --hf path/to/gpt2 --prompt "Hello" --max-new-tokens 20
    npformer <command> --help

Every mistake a user can make ends in one line on stderr and a non-zero exit: bad option values
in argparse's (exit 2), bad input files, checkpoints and settings as ``ValueError``/``OSError``
(exit 1), a model too big for memory as ``MemoryError`` (exit 1), a standard output that cannot
be written (closed, full, open for reading only) as "cannot write to standard output: why"
(exit 1). Anything else is a bug: one line names it and the file that holds its traceback
(exit 70); ``--debug`` or ``NPFORMER_DEBUG=1`` lets every exception through with its traceback
instead. An error's line never continues a line of output left unfinished on the same terminal.
"""
import argparse
import errno
import os
import sys
import tempfile
import time
import traceback
import warnings

from .. import backend, distributed, runtime
from . import parallel
from . import (average, calibrate, download, evaluate, exercises, export, gradcheck, info, lm,
               plot, sample, toy, train, translate)
from .common import positive_int, refuse_output_under_a_file

COMMANDS = {"toy": toy, "train": train, "translate": translate, "eval": evaluate,
            "gradcheck": gradcheck, "plot": plot, "download": download, "average": average,
            "calibrate": calibrate, "lm": lm, "sample": sample, "export": export,
            "info": info, "exercises": exercises}
EXIT_INTERNAL = 70                               # EX_SOFTWARE: a bug, not the user's mistake
EXIT_BROKEN_PIPE = 141                           # 128 + SIGPIPE: the reader of our output left


class Parser(argparse.ArgumentParser):
    """argparse, with one line for a usage error instead of the whole usage text (which, for
    train, runs to a dozen lines above the one that matters). Sub-command parsers are Parsers
    too (``add_subparsers`` makes them of the parent's class)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def print_help(self, file=None):
        """argparse's, except that help standard output cannot take ends in one line on stderr
        and exit 1, as a command's output does (argparse drops it, exit 0), and a reader that
        left ends it quietly, exit 141."""
        if file is not None:
            return super().print_help(file)
        try:
            out = _open_stdout()
            out.write(self.format_help())
            out.flush()
        except BrokenPipeError:
            _silence_stdout()
            self.exit(EXIT_BROKEN_PIPE)
        except StandardOutputError as e:
            _silence_stdout()
            self.exit(1, f"{self.prog}: error: {e}\n")


def build_parser():
    parser = Parser(
        prog="npformer", description="The Transformer in NumPy: train, translate, sample, inspect.")
    parser.add_argument("--threads", type=positive_int, default=None, metavar="N",
                        help="cores to use (default: every core this process may use, after "
                             "its affinity, cgroup quota and $OMP_NUM_THREADS / "
                             "$NUMBA_NUM_THREADS)")
    parser.add_argument("--blas-threads", type=positive_int, default=None, metavar="N",
                        help="BLAS threads inside each matrix product (default 1: large "
                             "products are cut into cells the cores share; more BLAS threads "
                             "can change float64 results with their number)")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of any error (also: NPFORMER_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module in COMMANDS.items():
        module.add_parser(sub, name)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


def describe_os_error(e):
    """One line for an OSError, naming the file when the error knows it (a failed ``write()``
    does not: the writers of npformer re-raise such errors with the path)."""
    message = str(e)
    if e.errno == errno.ENOSPC:
        where = f" writing {e.filename}" if e.filename else ""
        return (f"no space left on device{where}; nothing saved before was lost (files are "
                f"written under a temporary name and renamed only when complete): free some "
                f"space and run again")
    for name in (e.filename, e.filename2):
        if name is not None and os.fsdecode(name) not in message:
            message += f": {os.fsdecode(name)}"
    return message


# what an out-of-memory error suggests, unless the command's module has a MEMORY_HINT of its own
MEMORY_HINT = "try a smaller --d-model, --d-ff, --layers, --max-len or --batch-size (or --beam)"


def describe_memory_error(e, hint=MEMORY_HINT):
    """One line for a MemoryError: numpy's message says how much was asked for; ``hint``, the
    command's options that decide it."""
    asked = str(e) or "an allocation failed"
    return f"out of memory: {asked}; {hint}"


def save_traceback():
    """Write the current exception's traceback to a file in the temp folder; its path, or None."""
    name = f"npformer-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    path = os.path.join(tempfile.gettempdir(), name)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"npformer {' '.join(sys.argv[1:])}\n\n")
            f.write(traceback.format_exc())
    except OSError:
        return None
    return path


def _debug(args):
    return getattr(args, "debug", False) or os.environ.get("NPFORMER_DEBUG", "") not in ("", "0")


def _who(prefix):
    """The messages' prefix: ``npformer train``, or ``npformer train (rank 1 of 4)`` in a
    data-parallel run."""
    world = distributed.active()
    return prefix if world is None else f"{prefix} (rank {world.rank} of {world.size})"


def main(argv=None):
    """Entry point (setup.cfg: ``npformer = npformer.cli.main:main``). Returns the exit code.

    Under an MPI launcher of several processes every rank first joins the job and agrees on the
    command line with the others (``parallel.start``), whatever its command, so that an error
    on one rank (a parse error included) can end the whole job instead of leaving the others
    waiting for it."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    warnings.showwarning = _show_warning
    command = next((word for word in argv if word in COMMANDS), None)
    try:
        parallel.start(parser, argv, command)
    except ValueError as e:                      # no MPI, or ranks started differently
        print(f"{_who('npformer' + (f' {command}' if command else ''))}: error: {e}",
              file=sys.stderr)
        return _ended(1)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:                      # a usage error (2), --help (0)
        _ended(e.code if isinstance(e.code, int) else 1)
        raise
    try:
        code = _run(args)
    except BaseException:                        # --debug lets it through: end every rank too
        if distributed.active() is not None:
            traceback.print_exc()
            distributed.abort(1)
        raise
    return _ended(code)


def _silence_stdout():
    """Point standard output at /dev/null, so that flushing it at exit cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file behind sys.stdout (a test's)
        pass


def _ended(code):
    """``code``; in an MPI job, a non-zero one first ends every rank (the others would wait for
    this one)."""
    if code and distributed.active() is not None:
        distributed.abort(code)
    return code


class StandardOutputError(OSError):
    """Standard output cannot be written: closed (``>&-``), on a full device (``> /dev/full``),
    or open for reading only. Not a file of npformer's, so not "no space left ... nothing saved
    was lost": the message names standard output and the reason."""

    def __str__(self):
        return f"cannot write to standard output: {self.strerror}"


class GuardedOutput:
    """``sys.stdout`` while a command runs: a write or flush that fails raises
    :class:`StandardOutputError` (a reader that left, ``BrokenPipeError``, stays itself), and
    ``mid_line`` says whether the last text written left a line unfinished. Everything else is
    the stream's own."""

    def __init__(self, stream):
        self.stream, self.mid_line = stream, False

    def write(self, text):
        written = self._guarded(self.stream.write, text)
        if text:
            self.mid_line = not text.endswith("\n")
        return written

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        self._guarded(self.stream.flush)

    def __getattr__(self, name):
        return getattr(self.stream, name)

    @staticmethod
    def _guarded(call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StandardOutputError(e.errno, e.strerror) from e


def _shares_a_destination(stream, other):
    """Whether two streams write to the same file, pipe or terminal (``2>&1``, a terminal)."""
    try:
        return os.path.sameopenfile(stream.fileno(), other.fileno())
    except (OSError, ValueError, AttributeError):  # no real file behind one of them (a test's)
        return False


def _say(line):
    """Print ``line`` on stderr, on a line of its own: where standard output goes to the same
    place and its last write left a line unfinished (a sampled prompt), that line is ended
    first."""
    if getattr(sys.stdout, "mid_line", False) and _shares_a_destination(sys.stdout, sys.stderr):
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except OSError:
            pass
    print(line, file=sys.stderr)


def _open_stdout():
    """Standard output, guarded (:class:`GuardedOutput`); StandardOutputError where it was closed
    when npformer started (Python's ``sys.stdout`` is then None and ``print`` loses every line)."""
    if sys.stdout is None:
        raise StandardOutputError(errno.EBADF, "it is closed (>&-); redirect it to /dev/null "
                                               "to discard the output")
    return GuardedOutput(sys.stdout)


def _run(args):
    prefix = f"npformer {args.command}"
    stdout = sys.stdout
    try:
        sys.stdout = _open_stdout()
        parallel.refuse_launcher(args.command)   # on every rank: they agreed on the command
        backend.environment_choice()             # a bad NPFORMER_BACKEND, before any output
        if isinstance(getattr(args, "out", None), str):  # every command's output file or folder
            refuse_output_under_a_file("--out", args.out)
        if args.threads or args.blas_threads:        # else the runtime applies itself
            runtime.configure_runtime(threads=args.threads, blas_threads=args.blas_threads)
        code = args.run(args) or 0
        sys.stdout.flush()                       # what is still buffered: its failure is this run's
        return code
    except KeyboardInterrupt:
        _say(f"{_who(prefix)}: interrupted")
        return 130
    except BrokenPipeError:                      # the reader left (`... | head -1`): stop quietly,
        _silence_stdout()                        # as a tool killed by SIGPIPE would
        return EXIT_BROKEN_PIPE
    except StandardOutputError as e:             # before OSError: not a file of npformer's
        if _debug(args):
            raise
        _silence_stdout()                        # what is still buffered cannot fail again at exit
        _say(f"{_who(prefix)}: error: {e}")
        return 1
    except ValueError as e:                      # bad input: a message, not a traceback
        if _debug(args):
            raise
        _say(f"{_who(prefix)}: error: {e}")
        return 1
    except OSError as e:
        if _debug(args):
            raise
        _say(f"{_who(prefix)}: error: {describe_os_error(e)}")
        return 1
    except MemoryError as e:
        if _debug(args):
            raise
        hint = getattr(COMMANDS[args.command], "MEMORY_HINT", MEMORY_HINT)
        _say(f"{_who(prefix)}: error: {describe_memory_error(e, hint)}")
        return 1
    except Exception as e:                       # a bug: say so, keep the traceback in a file
        if _debug(args):
            raise
        path = save_traceback()
        where = (f"traceback in {path}" if path else
                 "the traceback could not be saved; run again with --debug to see it")
        first = str(e).splitlines()[0] if str(e) else ""
        _say(f"{_who(prefix)}: internal error: {type(e).__name__}: {first} ({where})")
        return EXIT_INTERNAL
    finally:
        sys.stdout = stdout


if __name__ == "__main__":
    sys.exit(main())
