"""``npformer eval``: BLEU of a checkpoint on a Multi30k split, or exact match and BLEU on a pair
of text files. --dataset multi30k translates a split (the checkpoint knows its languages),
detokenizes, and scores with sacrebleu against the raw references (lowercased BLEU first, cased
next to it); otherwise it translates --src and compares with --ref."""
import json

from ..data.multi30k import LANGUAGES, resolve_data_dir
from ..data.textfile import read_lines
from ..decoding.search import LENGTH_PENALTY     # shown in --length-penalty's help
from ..decoding.translator import whitespace_tokenize
from ..training.metrics import corpus_bleu, exact_match
from ..training.multi30k import evaluate_checkpoint, make_translator
from .common import (add_engine_arg, add_text_args, beam_length_penalty, check_writable,
                     checkpoint_files, command_parser, load_translation_model,
                     non_negative_float, path_argument, positive_int, refuse_output_over_inputs,
                     refuse_text_args, resolve_text_settings, write_json, write_lines)
from .runs import refuse_output_named_like_a_run_file



def add_parser(sub, name):
    p = command_parser(sub, name, __doc__,
                       "BLEU on a Multi30k split, or on a source/reference file pair")
    p.add_argument("--checkpoint", type=path_argument, required=True, metavar="CKPT")
    p.add_argument("--dataset", choices=["multi30k"], default=None)
    p.add_argument("--data-dir", type=path_argument, default=None,
                   help="Multi30k folder (default $NPFORMER_DATA, else ~/.cache/npformer/multi30k)")
    p.add_argument("--split", default="test_2016_flickr",
                   help="reads SPLIT.<lang>.gz or SPLIT.<lang> (default %(default)s)")
    p.add_argument("--src", type=path_argument,
                   help="source sentences, one per line (without --dataset)")
    p.add_argument("--ref", type=path_argument,
                   help="reference translations, one per line (without --dataset)")
    p.add_argument("--beam", type=positive_int, default=None, metavar="N",
                   help="beam search of width N (default: greedy)")
    p.add_argument("--length-penalty", type=non_negative_float, default=None, metavar="ALPHA",
                   help=f"beam search alpha, >= 0 (with --beam; default {LENGTH_PENALTY})")
    p.add_argument("--out", type=path_argument, metavar="PATH",
                   help="write the translations here, one per line")
    p.add_argument("--metrics-json", type=path_argument, metavar="PATH",
                   help="write bleu, signature, bleu_cased, seconds, sentences, ... as JSON")
    p.add_argument("--truncate", action="store_true")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_engine_arg(p)
    add_text_args(p)
    p.set_defaults(run=run)


def _inputs(args):
    """(option, path) of every file the command reads: the checkpoint's files, --src/--ref
    or the Multi30k files of --split."""
    inputs = checkpoint_files(args)
    if args.dataset == "multi30k":
        folder = resolve_data_dir(args.data_dir)
        inputs += [("--split", str(folder / f"{args.split}.{lang}{gz}"))
                   for lang in LANGUAGES for gz in (".gz", "")]
    else:
        inputs += [("--src", args.src), ("--ref", args.ref)]
    return inputs


def check_outputs(args):
    """Before any decoding: --out and --metrics-json must be writable, apart, and name no input."""
    outputs = [(option, path) for option, path in (("--out", args.out),
                                                   ("--metrics-json", args.metrics_json)) if path]
    for option, path in outputs:
        check_writable(option, path)
        refuse_output_over_inputs(option, path, _inputs(args))
        refuse_output_named_like_a_run_file(option, path)
    if len(outputs) == 2:
        refuse_output_over_inputs("--metrics-json", args.metrics_json, outputs[:1])


def run_multi30k(args, loaded):
    result = evaluate_checkpoint(loaded, args.data_dir, args.split, beam=args.beam,
                                 length_penalty=beam_length_penalty(args),
                                 settings=resolve_text_settings(args, loaded))
    figures = {k: v for k, v in result.items() if k not in ("hypotheses", "sources", "references")}
    figures["checkpoint"] = loaded.path
    summary = [f"{result['split']} {result['src']}->{result['tgt']}, {result['sentences']} "
               f"sentences, {result['method']}, {result['seconds']:.1f} s",
               f"BLEU (lowercased) {result['bleu']:.2f}   {result['signature']}",
               f"BLEU (cased)      {result['bleu_cased']:.2f}   {result['signature_cased']}"]
    if "bleu_papers" in result:
        summary.append(f"BLEU (papers': lowercased, Moses-tokenised, escaped; tokenize none) "
                       f"{result['bleu_papers']:.2f}   {result['signature_papers']}")
    else:
        summary.append("BLEU (papers' tokenised): needs sacremoses (pip install 'npformer[moses]')")
    if result["unknown_source_tokens"]:
        summary.append(f"{result['unknown_source_tokens']} source tokens were not in the "
                       f"vocabulary (<unk>)")
    return _report(args, figures, result["hypotheses"], summary)


def _report(args, figures, hypotheses, summary):
    """Write the translations (--out) and the figures (--metrics-json), print JSON or a summary."""
    if args.out:
        write_lines(args.out, hypotheses)
    if args.metrics_json:
        write_json(args.metrics_json, figures)
    print(json.dumps(figures) if args.json else "\n".join(summary))
    return 0


def check_options(args):
    """Refuse combinations that would be silently ignored or cannot work, before any work."""
    if args.dataset == "multi30k":
        if args.src or args.ref:
            raise ValueError("--src/--ref: not used with --dataset multi30k (give --split)")
        folder = resolve_data_dir(args.data_dir)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"--data-dir {folder}: is a file, expected a folder (with the "
                             f"Multi30k files)")
    elif not (args.src and args.ref):
        raise ValueError("--src and --ref: both are needed (or --dataset multi30k)")
    else:
        refuse_text_args(args, "only with --dataset multi30k (--src/--ref are read as "
                               "whitespace-tokenised text)")
    beam_length_penalty(args)


def run(args):
    check_options(args)
    check_outputs(args)
    loaded = load_translation_model(args)
    if args.dataset == "multi30k":
        return run_multi30k(args, loaded)
    src, ref = read_lines(args.src), read_lines(args.ref)
    if len(src) != len(ref):
        raise ValueError(f"--src {args.src} has {len(src)} lines but --ref {args.ref} has {len(ref)}")
    if not src:
        raise ValueError(f"--src {args.src}: no sentences")
    translator = make_translator(loaded, whitespace_tokenize, " ".join)
    hyps = [t.text for t in translator.translate(
        src, method="beam" if args.beam else "greedy", beam_size=args.beam or 4,
        length_penalty=beam_length_penalty(args), truncate=args.truncate)]
    refs = [" ".join(r.split()) for r in ref]
    figures = {"sentences": len(src), "exact_match": exact_match(hyps, refs),
               "bleu": corpus_bleu(hyps, refs)}
    return _report(args, figures, hyps, [f"sentences   {figures['sentences']}",
                                         f"exact match {figures['exact_match']:.4f}",
                                         f"BLEU        {figures['bleu']:.2f}"])
