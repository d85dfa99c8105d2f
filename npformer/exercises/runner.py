"""The child process of ``npformer exercises check``: ``python -m npformer.exercises.runner DIR
[--timeout S] NAME...`` checks each exercise and writes one JSON line per verdict to standard
output; whatever the learner's code prints goes to standard error instead."""
import argparse
import os
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="npformer.exercises.runner")
    parser.add_argument("folder")
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())   # the learner's prints: to stderr
    from .checker import run_child
    run_child(args.folder, args.names, args.timeout, out)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
