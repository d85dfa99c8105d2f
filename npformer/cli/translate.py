"""``npformer translate``: translate with a checkpoint written by ``npformer toy/train``.
Sentences come as arguments or, if none, from stdin (one per line); translations go to stdout,
one per line. The input is read and translated a window at a time (the sentences of one batch,
see --batch-size), each window's translations printed before the next is read, so a long input
needs the memory of one window and its first translations come at once. Sampled output
(--sample) depends on the windows: the same seed gives the same output for the same
--batch-size."""
import sys
import time

import numpy as np

from ..data.textfile import iter_lines
from ..decoding.search import LENGTH_PENALTY     # shown in --length-penalty's help
from ..decoding.translator import MAX_TOKENS, format_trace
from ..training.multi30k import translator_for
from .common import (add_engine_arg, add_text_args, beam_length_penalty, command_parser,
                     load_translation_model, non_negative_float, non_negative_int, path_argument,
                     positive_float, positive_int, resolve_text_settings)

TEMPERATURE = 1.0                                # --sample's unless --temperature


def add_parser(sub, name):
    p = command_parser(sub, name, __doc__, "translate sentences (arguments, or stdin one per line)")
    p.add_argument("sentences", nargs="*", help="source sentences (whitespace-tokenised for toy/files "
                   "models, raw text for Multi30k models)")
    p.add_argument("--checkpoint", type=path_argument, required=True, metavar="CKPT",
                   help="checkpoint path (run/best) or a run directory (with --engine "
                        "ctranslate2: an exported folder)")
    p.add_argument("--input", type=path_argument, metavar="FILE",
                   help="read sentences from FILE instead of stdin")
    p.add_argument("--beam", type=positive_int, default=None, metavar="N",
                   help="beam search with N beams")
    p.add_argument("--length-penalty", type=non_negative_float, default=None, metavar="ALPHA",
                   help=f"beam search alpha, >= 0 (with --beam; default {LENGTH_PENALTY})")
    p.add_argument("--sample", action="store_true",
                   help="sample instead of greedy (what is drawn depends on the windows the "
                        "input is read in, so on --batch-size)")
    p.add_argument("--temperature", type=positive_float, default=None,
                   help=f"> 0 (with --sample; default {TEMPERATURE})")
    p.add_argument("--top-k", type=positive_int, default=None, metavar="K",
                   help="sample among the K most likely tokens (with --sample)")
    p.add_argument("--seed", type=non_negative_int, default=None, help="seed for --sample")
    p.add_argument("--trace", action="store_true", help="print every chosen token and its probability")
    p.add_argument("--truncate", action="store_true",
                   help="cut sentences longer than the model's max_len (with a warning) instead of failing")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"at most N sentences decoded together (default: batches of about "
                        f"{MAX_TOKENS:,} source tokens, beams counted); also the window of "
                        f"input lines read and translated before the next is read")
    p.add_argument("--time", action="store_true", help="report decoding time on stderr")
    add_engine_arg(p)
    add_text_args(p)
    p.set_defaults(run=run)


def check_options(args):
    """Refuse options that would be silently ignored: the settings of a decoding method that was
    not chosen (only those the user gave; their defaults are None)."""
    if args.beam is not None and args.sample:
        raise ValueError("--beam and --sample: choose one decoding method")
    if not args.sample:
        for option, value in (("--temperature", args.temperature), ("--top-k", args.top_k),
                              ("--seed", args.seed)):
            if value is not None:
                raise ValueError(f"{option}: only used with --sample (it would be ignored)")
    beam_length_penalty(args)
    if args.engine == "ctranslate2":
        for option, given in (("--sample", args.sample), ("--trace", args.trace)):
            if given:
                raise ValueError(f"{option}: --engine ctranslate2 does not give npformer's "
                                 f"{'seeded samples' if option == '--sample' else 'token probabilities'}"
                                 f"; use the npformer engine for {option}")
    if args.sentences and args.input:
        raise ValueError("--input: give sentences either as arguments or with --input, not both")


def run(args):
    check_options(args)
    loaded = load_translation_model(args)
    settings = resolve_text_settings(args, loaded)       # before reading stdin
    lines = args.sentences if args.sentences else iter_lines(args.input or "-")
    method = "beam" if args.beam is not None else "sample" if args.sample else "greedy"
    # Multi30k checkpoints tokenise raw text as their run did; toy/files ones split on spaces
    translator = translator_for(loaded, batch_size=args.batch_size, settings=settings)
    reading = [0.0]                              # seconds spent waiting for the input
    windows = translator.translate_windows(
        _timed(lines, reading), method=method, beam_size=args.beam or 4,
        length_penalty=beam_length_penalty(args),
        temperature=TEMPERATURE if args.temperature is None else args.temperature,
        top_k=args.top_k, rng=np.random.default_rng(args.seed), truncate=args.truncate)
    count, start = 0, time.perf_counter()
    for results in windows:
        sys.stdout.write("".join((format_trace(r) if args.trace else r.text) + "\n"
                                 for r in results))
        sys.stdout.flush()                       # this window's lines before the next is read
        count += len(results)
    seconds = time.perf_counter() - start - reading[0]
    if args.time:
        print(f"translated {count} sentences ({method}) in {seconds:.3f} s", file=sys.stderr)
    return 0


def _timed(lines, seconds):
    """``lines``, adding the time spent waiting for each to ``seconds[0]``."""
    lines = iter(lines)
    while True:
        start = time.perf_counter()
        line = next(lines, None)
        seconds[0] += time.perf_counter() - start
        if line is None:
            return
        yield line
