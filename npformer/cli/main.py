"""``npformer``: the command line. One sub-command per file in this package.

    npformer toy                                  # train the toy zh->en model, print examples
    npformer translate --checkpoint runs/toy "我 有 一个 苹果"
    npformer <command> --help
"""
import argparse
import os
import sys
import warnings

from .. import backend
from . import average, download, evaluate, gradcheck, plot, toy, train, translate
from .threads import set_blas_threads

COMMANDS = {"toy": toy, "train": train, "translate": translate, "eval": evaluate,
            "gradcheck": gradcheck, "plot": plot, "download": download, "average": average}


def build_parser():
    parser = argparse.ArgumentParser(
        prog="npformer", description="An encoder-decoder Transformer in NumPy: train, translate, inspect.")
    parser.add_argument("--blas-threads", type=int, default=None, metavar="N",
                        help="threads for NumPy's BLAS (default 1, or $OPENBLAS_NUM_THREADS if "
                             "set): tiny matrices run fastest on one thread")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module in COMMANDS.items():
        module.add_parser(sub, name)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


def main(argv=None):
    """Entry point (setup.cfg: ``npformer = npformer.cli.main:main``). Returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = _show_warning
    try:
        blas = args.blas_threads
        if blas is None and "OPENBLAS_NUM_THREADS" not in os.environ:
            blas = 1                             # the policy (npformer.backend); the user's env wins
        if blas is not None:
            set_blas_threads(blas)               # validates: the message names --blas-threads
        backend.configure_runtime(blas_threads=None)   # Numba threads and memory; BLAS set above
        return args.run(args) or 0
    except (ValueError, OSError) as e:           # bad input: a message, not a traceback
        print(f"npformer {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"npformer {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
