"""``npformer average``: write the element-wise mean of the weights of CKPT... (checkpoints of
one run: the same config and vocabularies) to --out, an inference checkpoint. With --run DIR
--last N, average DIR's last N step_<N> checkpoints (kept by npformer train --keep-last)."""
import os

from ..checkpoint import checkpoint_paths
from ..training.averaging import average_checkpoints
from ..training.trainer import step_checkpoints
from .common import (command_parser, path_argument, positive_int, refuse_output_over_inputs,
                     resolve_checkpoint)
from .runs import remove_stale_temps


def add_parser(sub, name):
    p = command_parser(sub, name, __doc__,
                       "average the weights of checkpoints (e.g. the last N of a run)")
    p.add_argument("checkpoints", nargs="*", type=path_argument, metavar="CKPT")
    p.add_argument("--out", type=path_argument, required=True, metavar="AVG",
                   help="where to write the average")
    p.add_argument("--run", type=path_argument, dest="run_dir", metavar="DIR",
                   help="a run directory (use with --last)")
    p.add_argument("--last", type=positive_int, metavar="N", help="average the last N step_<N> checkpoints of --run")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a checkpoint that already exists at --out (never one of the "
                        "checkpoints averaged)")
    p.set_defaults(run=run)


def run(args):
    paths = [resolve_checkpoint(c) for c in args.checkpoints]
    if (args.run_dir is None) != (args.last is None):
        raise ValueError("--run and --last: give both (or neither, and list checkpoints)")
    if args.run_dir is not None:
        kept = step_checkpoints(args.run_dir)
        if len(kept) < args.last:
            raise ValueError(f"--run {args.run_dir}: holds {len(kept)} step_<N> checkpoints, "
                             f"--last asks for {args.last} (train with --keep-last N)")
        paths += kept[-args.last:]
    if not paths:
        raise ValueError("give the checkpoints to average (CKPT... or --run DIR --last N)")
    # the average is an inference checkpoint: it must never replace one of its inputs, nor,
    # unless asked, any other checkpoint (a run's training checkpoint 'last', say)
    refuse_output_over_inputs("--out", args.out, [("CKPT", p) for p in paths], checkpoint=True)
    npz = checkpoint_paths(args.out)[0]
    if os.path.exists(npz) and not args.overwrite:
        raise ValueError(f"--out {args.out}: a checkpoint already exists there ({npz}); give "
                         f"another --out, or --overwrite to replace it with the (inference-only) "
                         f"average (nothing was written)")
    remove_stale_temps(npz.parent, npz.stem)    # what a killed average to --out left
    average_checkpoints(paths, args.out)
    print(f"averaged {len(paths)} checkpoints -> {args.out}")
    return 0
