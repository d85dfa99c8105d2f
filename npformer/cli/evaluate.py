"""``npformer eval``: exact match and BLEU of a checkpoint on a pair of text files."""
import json

from ..decoding.translator import Translator
from ..training.checkpointing import load_model_checkpoint
from ..training.metrics import corpus_bleu, exact_match
from .common import read_lines, resolve_checkpoint


def add_parser(sub, name):
    p = sub.add_parser(name, help="exact match and BLEU on a source/reference file pair",
                       description="Translate --src (one sentence a line) and compare with --ref.")
    p.add_argument("--checkpoint", required=True, metavar="CKPT")
    p.add_argument("--src", required=True, help="source sentences, one per line")
    p.add_argument("--ref", required=True, help="reference translations, one per line")
    p.add_argument("--beam", type=int, default=None, metavar="N")
    p.add_argument("--truncate", action="store_true")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(run=run)


def run(args):
    loaded = load_model_checkpoint(resolve_checkpoint(args.checkpoint))
    src, ref = read_lines(args.src), read_lines(args.ref)
    if len(src) != len(ref):
        raise ValueError(f"--src {args.src} has {len(src)} lines but --ref {args.ref} has {len(ref)}")
    if not src:
        raise ValueError(f"--src {args.src}: no sentences")
    translator = Translator(loaded.model, loaded.src_vocab, loaded.tgt_vocab)
    hyps = [t.text for t in translator.translate(
        src, method="beam" if args.beam else "greedy", beam_size=args.beam or 4, truncate=args.truncate)]
    refs = [" ".join(r.split()) for r in ref]
    figures = {"sentences": len(src), "exact_match": exact_match(hyps, refs),
               "bleu": corpus_bleu(hyps, refs)}
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"sentences   {figures['sentences']}\nexact match {figures['exact_match']:.4f}\n"
              f"BLEU        {figures['bleu']:.2f}")
    return 0
