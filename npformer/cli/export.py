"""``npformer export``: write a checkpoint in another engine's format: CTranslate2 (a translation
checkpoint), PEFT's adapter files or a merged Hugging Face folder (a LoRA run of npformer lm on
a base of any family of ``npformer.families``)."""
import json
import os
from pathlib import Path

from .. import families, lora, lora_files
from ..checkpoint import write_file_atomic, write_folder
from ..ct2 import QUANTIZATIONS, check_export_target, export_ctranslate2
from ..training.checkpointing import load_model_checkpoint
from .common import checkpoint_files, path_argument, resolve_checkpoint
from .runs import remove_stale_temps

FORMATS = ("ctranslate2", "peft", "hf")


def add_parser(sub, name):
    p = sub.add_parser(name, help="export a checkpoint to CTranslate2, PEFT or Hugging Face",
                       description="Write the encoder-decoder of --checkpoint as a CTranslate2 "
                                   "model folder (extra ctranslate2), with what npformer needs "
                                   "to tokenise for it; run it with `npformer translate/eval "
                                   "--engine ctranslate2 --checkpoint OUT`. The folder is written "
                                   "under a temporary name and renamed into place; its "
                                   "npformer.json records the sha256 of every file, checked "
                                   "whenever the export is loaded. A LoRA run of npformer lm "
                                   f"({families.spelled()} base) exports as PEFT's "
                                   "adapter_config.json and adapter_model.safetensors "
                                   "(--format peft), or as a Hugging Face folder of its merged "
                                   "weights that transformers loads (--format hf --merge).")
    p.add_argument("--checkpoint", type=path_argument, required=True, metavar="CKPT",
                   help="checkpoint path (run/best) or a run directory")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument("--out", type=path_argument, required=True, metavar="DIR",
                   help="the folder to create")
    p.add_argument("--quantization", choices=list(QUANTIZATIONS), default=None,
                   help="ctranslate2: store the weights quantized (default: float32, the "
                        "weights unchanged)")
    p.add_argument("--merge", action="store_true",
                   help="hf: add each adapter's (alpha / r) B A into its base weight")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="hf: the merged weights' dtype (default float32)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out if it holds an earlier export")
    p.set_defaults(run=run, engine="npformer")


def _refuse_misplaced(args):
    """Options of one format given with another would be ignored: refused."""
    if args.format != "ctranslate2" and args.quantization is not None:
        raise ValueError(f"--quantization: only for --format ctranslate2 (got --format "
                         f"{args.format})")
    if args.format != "hf" and (args.merge or args.dtype is not None):
        option = "--merge" if args.merge else "--dtype"
        raise ValueError(f"{option}: only for --format hf (got --format {args.format})")
    if args.format == "hf" and not args.merge:
        raise ValueError("--format hf: writes the merged weights of a LoRA run; add --merge")


def run(args):
    _refuse_misplaced(args)
    inputs = [path for _, path in checkpoint_files(args)]
    if args.format != "ctranslate2":
        def check_target():
            check_export_target(args.out, inputs, overwrite=args.overwrite,
                                is_earlier=_is_lora_export, marker=LORA_MARKER,
                                what=f"--format {args.format} export")
        check_target()                      # before loading anything
        return _run_lora(args, check_target)
    check_export_target(args.out, inputs, overwrite=args.overwrite)
    loaded = load_model_checkpoint(resolve_checkpoint(args.checkpoint))
    _remove_leftovers(args.out)
    out = export_ctranslate2(loaded, args.out, args.quantization, overwrite=args.overwrite)
    print(f"exported {loaded.path} ({args.quantization or 'float32'}) -> {out}")
    return 0


def _remove_leftovers(out):
    """What a killed export to ``out`` left beside it (npformer.cli.runs.remove_stale_temps)."""
    remove_stale_temps(*os.path.split(os.path.abspath(out)))


LORA_MARKER = "npformer-export.json"      # in a --format peft / hf export: what --overwrite may replace
_LORA_KIND = "npformer LoRA export"


def _is_lora_export(out):
    """Whether ``out`` holds an earlier --format peft or hf export, by its marker file: a folder
    that merely looks like a Hugging Face model (the base model's own) is never replaced."""
    try:
        return json.loads((Path(out) / LORA_MARKER).read_text("utf-8")).get("kind") == _LORA_KIND
    except (OSError, ValueError, AttributeError):
        return False


def _run_lora(args, check_target):
    """--format peft / hf --merge: the adapters of a LoRA run, written into a temporary folder
    beside --out and renamed into place (``npformer.checkpoint.write_folder``, as a CTranslate2
    export is). ``check_target()`` runs again just before the rename: an --out that appeared
    while the export ran is not replaced without --overwrite."""
    loaded = load_model_checkpoint(resolve_checkpoint(args.checkpoint))
    model, settings = loaded.model, lora.settings(loaded.model)
    if settings is None:
        raise ValueError(f"--checkpoint {args.checkpoint}: holds no LoRA adapters (--format "
                         f"{args.format} writes a LoRA run of npformer lm --lora-rank)")
    what = "PEFT adapter" if args.format == "peft" else \
        f"merged Hugging Face model ({args.dtype or 'float32'})"

    def write(tmp):
        if args.format == "peft":
            lora_files.save_peft(model, tmp, settings.base.get("folder"))
        else:
            lora_files.save_merged(model, settings.base["folder"], tmp, args.dtype or "float32")
        marker = json.dumps({"kind": _LORA_KIND, "format": args.format}) + "\n"
        write_file_atomic(tmp / LORA_MARKER, lambda f: f.write(marker.encode("utf-8")))
    _remove_leftovers(args.out)
    out = write_folder(args.out, write, check=check_target)
    print(f"exported {loaded.path} as a {what} -> {out}")
    return 0
