"""``npformer export``: write a checkpoint in another engine's format (CTranslate2)."""
import os

from ..ct2 import QUANTIZATIONS, check_export_target, export_ctranslate2
from ..training.checkpointing import load_model_checkpoint
from .common import checkpoint_files, resolve_checkpoint
from .runs import remove_stale_temps


def add_parser(sub, name):
    p = sub.add_parser(name, help="export a translation checkpoint to CTranslate2",
                       description="Write the encoder-decoder of --checkpoint as a CTranslate2 "
                                   "model folder (extra ctranslate2), with what npformer needs "
                                   "to tokenise for it; run it with `npformer translate/eval "
                                   "--engine ctranslate2 --checkpoint OUT`. The folder is written "
                                   "under a temporary name and renamed into place; its "
                                   "npformer.json records the sha256 of every file, checked "
                                   "whenever the export is loaded.")
    p.add_argument("--checkpoint", required=True, metavar="CKPT",
                   help="checkpoint path (run/best) or a run directory")
    p.add_argument("--format", choices=["ctranslate2"], required=True)
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to create")
    p.add_argument("--quantization", choices=list(QUANTIZATIONS), default=None,
                   help="store the weights quantized (default: float32, the weights unchanged)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out if it holds an earlier export")
    p.set_defaults(run=run, engine="npformer")


def run(args):
    inputs = [path for _, path in checkpoint_files(args)]
    check_export_target(args.out, inputs, overwrite=args.overwrite)   # before loading anything
    loaded = load_model_checkpoint(resolve_checkpoint(args.checkpoint))
    remove_stale_temps(*os.path.split(os.path.abspath(args.out)))   # a killed export's leftovers
    out = export_ctranslate2(loaded, args.out, args.quantization, overwrite=args.overwrite)
    print(f"exported {loaded.path} ({args.quantization or 'float32'}) -> {out}")
    return 0
