"""The child process that runs the learner's code (:mod:`.child` starts it and holds its limits):

- ``python -m npformer.exercises.runner check DIR --timeout S --memory MIB NAME...`` checks
  each exercise and writes one JSON line per verdict;
- ``python -m npformer.exercises.runner train DIR --memory MIB [--seed N] [--epochs N]
  [--finale toy|gpt] [--data FILE] [--steps N] [--scratch DIR]`` runs a finale (the toy's run
  written into DIR, a folder the parent made and removes) and writes a line per evaluation,
  then the verdict.

Its standard output carries only those lines; whatever the learner's code prints goes to
standard error instead."""
import argparse
import os
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="npformer.exercises.runner")
    actions = parser.add_subparsers(dest="action", required=True)
    check, train = actions.add_parser("check"), actions.add_parser("train")
    for p in (check, train):
        p.add_argument("folder")
        p.add_argument("--memory", type=int, required=True)
    check.add_argument("--timeout", type=float, required=True)
    check.add_argument("names", nargs="+")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--epochs", type=int, default=None)
    train.add_argument("--finale", choices=("toy", "gpt"), default="toy")
    train.add_argument("--data", default=None)
    train.add_argument("--steps", type=int, default=None)
    train.add_argument("--scratch", default=None)
    args = parser.parse_args(argv)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())   # the learner's prints: to stderr
    from .child import limit_memory
    if args.action == "check":
        from .checker import run_child
        limit_memory(args.memory)
        run_child(args.folder, args.names, args.timeout, out)
    else:
        from .finale import train_child
        limit_memory(args.memory)
        train_child(args.folder, args.seed, args.epochs, out, args.finale, args.data, args.steps,
                    args.scratch)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
