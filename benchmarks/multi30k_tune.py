"""Tune a finished Multi30k run's decoding on ``val``: how many of its last epoch checkpoints to
average and beam search's length penalty.

    npformer train --dataset multi30k --preset tiny --src en --tgt de --time-budget 57 \\
        --keep-last 40 --average-last 10 --out runs/tiny-en-de
    python benchmarks/multi30k_tune.py runs/tiny-en-de \\
        --average-last 5 --average-last 10 --average-last 20 \\
        --length-penalty 0.6 --length-penalty 1.0 --out runs/tiny-en-de/tune.jsonl

Each (N, alpha) of the grid averages the run's last N kept ``step_N`` checkpoints and
translates ``val`` with beam search (``--beam``, default 5) and length penalty alpha
(``npformer.decoding.search``: GNMT's ((5 + length) / 6) ** alpha). It prints every point in
both metrics (sacreBLEU lowercased, the headline; the papers' BLEU on lowercased,
Moses-tokenised text) and the best by the papers' BLEU. Only ``val`` is scored: the test sets
are for the report, with the setting chosen here (``npformer average`` then ``npformer eval
--length-penalty``).
"""
import argparse
import json
import os
import sys

from npformer.cli.common import non_negative_float, positive_int
from npformer.data.textfile import write_text_atomic
from npformer.training.averaging import load_averaged
from npformer.training.multi30k import evaluate_checkpoint
from npformer.training.trainer import step_checkpoints


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="the run folder (its step_N checkpoints)")
    p.add_argument("--data-dir", default=None, help="the Multi30k folder")
    p.add_argument("--beam", type=positive_int, default=5, help="beam width (default %(default)s)")
    p.add_argument("--average-last", type=positive_int, action="append", default=None, metavar="N",
                   help="checkpoints averaged (repeatable; default 10)")
    p.add_argument("--length-penalty", type=non_negative_float, action="append", default=None,
                   metavar="ALPHA", help="beam search's length penalty (repeatable; default 0.6)")
    p.add_argument("--out", help="write the points here as JSON lines (refused if it exists)")
    args = p.parse_args(argv)
    counts, alphas = args.average_last or [10], args.length_penalty or [0.6]
    if args.out and os.path.exists(args.out):
        p.error(f"--out {args.out}: exists; give another path")
    kept = step_checkpoints(args.run)
    if len(kept) < max(counts):
        p.error(f"--average-last {max(counts)}: {args.run} keeps only {len(kept)} step_N "
                f"checkpoints (train with a larger --keep-last)")
    points = []
    print(f"{'avg':>4} {'alpha':>6} {'BLEU lc':>8} {'papers':>7} {'decode s':>9}")
    for n in counts:
        loaded = load_averaged(kept[-n:])
        for alpha in alphas:
            result = evaluate_checkpoint(loaded, args.data_dir, "val", beam=args.beam,
                                         length_penalty=alpha)
            point = {"run": os.path.basename(os.path.normpath(args.run)), "split": "val",
                     "averaged": n, "length_penalty": alpha, "beam": args.beam,
                     **{k: result[k] for k in ("bleu", "bleu_cased", "bleu_papers", "seconds")
                        if k in result}}
            points.append(point)
            print(f"{n:4d} {alpha:6.2f} {point['bleu']:8.2f} "
                  f"{point.get('bleu_papers', float('nan')):7.2f} {point['seconds']:9.1f}",
                  flush=True)
            if args.out:
                write_text_atomic(args.out, "".join(json.dumps(pt) + "\n" for pt in points))
    best = max(points, key=lambda pt: pt.get("bleu_papers", pt["bleu"]))
    print(f"best on val: --average-last {best['averaged']} --length-penalty "
          f"{best['length_penalty']} ({best.get('bleu_papers', best['bleu']):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
