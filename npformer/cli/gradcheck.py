"""``npformer gradcheck``: run the float64 central-difference gradient check of each layer and
module and print a table (a learning tool)."""
from ..gradcheck_suite import format_table, run_gradchecks
from .common import command_parser, non_negative_int


def add_parser(sub, name):
    p = command_parser(sub, name, __doc__, "check every backward pass against finite differences")
    p.add_argument("--only", nargs="*", metavar="NAME", help="run the checks whose name contains NAME")
    p.add_argument("--max-entries", type=non_negative_int, default=30,
                   help="entries checked per parameter of the larger modules (0: all)")
    p.add_argument("--fast", action="store_true",
                   help="check 3 random directions per input instead of every entry (two forward "
                        "passes each, whatever the size; see docs/backprop.md#gradient-checking)")
    p.set_defaults(run=run)


def run(args):
    rows = run_gradchecks(args.only, args.max_entries or None, fast=args.fast)
    print(format_table(rows))
    return 0 if all(r.result.ok for r in rows) else 1
