"""``npformer eval``: BLEU of a checkpoint on a Multi30k split, or exact match and BLEU on a pair
of text files."""
import json
import os

from ..decoding.translator import Translator
from ..training.checkpointing import load_model_checkpoint
from ..training.metrics import corpus_bleu, exact_match
from ..training.multi30k import evaluate_checkpoint
from .common import read_lines, resolve_checkpoint, write_json


def add_parser(sub, name):
    p = sub.add_parser(name, help="BLEU on a Multi30k split, or on a source/reference file pair",
                       description="--dataset multi30k: translate a split (the checkpoint knows its "
                                   "languages), detokenize, and score with sacrebleu against the "
                                   "raw references (lowercased BLEU first, cased next to it). "
                                   "Otherwise translate --src and compare with --ref.")
    p.add_argument("--checkpoint", required=True, metavar="CKPT")
    p.add_argument("--dataset", choices=["multi30k"], default=None)
    p.add_argument("--data-dir", default=None,
                   help="Multi30k folder (default $NPFORMER_DATA, else ~/.cache/npformer/multi30k)")
    p.add_argument("--split", default="test_2016_flickr",
                   help="reads SPLIT.<lang>.gz or SPLIT.<lang> (default %(default)s)")
    p.add_argument("--src", help="source sentences, one per line (without --dataset)")
    p.add_argument("--ref", help="reference translations, one per line (without --dataset)")
    p.add_argument("--beam", type=int, default=None, metavar="N", help="beam search of width N "
                   "(default: greedy)")
    p.add_argument("--length-penalty", type=float, default=0.6)
    p.add_argument("--out", metavar="PATH", help="write the translations here, one per line")
    p.add_argument("--metrics-json", metavar="PATH",
                   help="write bleu, signature, bleu_cased, seconds, sentences, ... as JSON")
    p.add_argument("--truncate", action="store_true")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(run=run)


def _write_lines(path, lines):
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def run_multi30k(args, loaded):
    if args.src or args.ref:
        raise ValueError("--src/--ref: not used with --dataset multi30k (give --split)")
    if args.beam is not None and args.beam < 1:
        raise ValueError(f"--beam: expected a positive integer, got {args.beam}")
    result = evaluate_checkpoint(loaded, args.data_dir, args.split, beam=args.beam,
                                 length_penalty=args.length_penalty)
    figures = {k: v for k, v in result.items() if k not in ("hypotheses", "sources", "references")}
    figures["checkpoint"] = loaded.path
    summary = [f"{result['split']} {result['src']}->{result['tgt']}, {result['sentences']} "
               f"sentences, {result['method']}, {result['seconds']:.1f} s",
               f"BLEU (lowercased) {result['bleu']:.2f}   {result['signature']}",
               f"BLEU (cased)      {result['bleu_cased']:.2f}   {result['signature_cased']}"]
    if result["unknown_source_tokens"]:
        summary.append(f"{result['unknown_source_tokens']} source tokens were not in the "
                       f"vocabulary (<unk>)")
    return _report(args, figures, result["hypotheses"], summary)


def _report(args, figures, hypotheses, summary):
    """Write the translations (--out) and the figures (--metrics-json), print JSON or a summary."""
    if args.out:
        _write_lines(args.out, hypotheses)
    if args.metrics_json:
        write_json(args.metrics_json, figures)
    print(json.dumps(figures) if args.json else "\n".join(summary))
    return 0


def run(args):
    loaded = load_model_checkpoint(resolve_checkpoint(args.checkpoint))
    if args.dataset == "multi30k":
        return run_multi30k(args, loaded)
    if not (args.src and args.ref):
        raise ValueError("--src and --ref: both are needed (or --dataset multi30k)")
    src, ref = read_lines(args.src), read_lines(args.ref)
    if len(src) != len(ref):
        raise ValueError(f"--src {args.src} has {len(src)} lines but --ref {args.ref} has {len(ref)}")
    if not src:
        raise ValueError(f"--src {args.src}: no sentences")
    translator = Translator(loaded.model, loaded.src_vocab, loaded.tgt_vocab)
    hyps = [t.text for t in translator.translate(
        src, method="beam" if args.beam else "greedy", beam_size=args.beam or 4,
        length_penalty=args.length_penalty, truncate=args.truncate)]
    refs = [" ".join(r.split()) for r in ref]
    figures = {"sentences": len(src), "exact_match": exact_match(hyps, refs),
               "bleu": corpus_bleu(hyps, refs)}
    return _report(args, figures, hyps, [f"sentences   {figures['sentences']}",
                                         f"exact match {figures['exact_match']:.4f}",
                                         f"BLEU        {figures['bleu']:.2f}"])
