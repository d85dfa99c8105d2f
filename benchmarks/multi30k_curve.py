"""BLEU against wall-clock minutes of a Multi30k run: the recipe's steps as a time budget.

Every kept checkpoint ``step_N`` of a run (the tiny preset keeps one an epoch, the base preset
one a validation) stands for stopping the run at its minute: the average of it and the
checkpoints kept before it (up to ``--average-last``, the recipe's averaging) is what the README
command would have given then. This script scores those averages (every ``--every``-th
checkpoint, and the last) on each ``--split`` with beam search (length penalty
``--length-penalty``, as ``eval``'s), in both metrics: sacreBLEU of the detokenised output
against the raw references, lowercased (the headline) and cased, and the papers' BLEU on
lowercased, Moses-tokenised text (``npformer.training.metrics.papers_bleu``). It prints a table
and writes JSON lines that ``npformer plot --curve`` draws::

    npformer train --dataset multi30k --preset tiny --src en --tgt de --time-budget 57 \\
        --keep-last 40 --average-last 10 --out runs/tiny-en-de
    python benchmarks/multi30k_curve.py runs/tiny-en-de \\
        --split val --split test_2016_flickr --every 3 --out runs/tiny-en-de/curve.jsonl
    npformer plot --curve runs/tiny-en-de/curve.jsonl --out plots

Minutes are the training seconds a checkpoint records (validations included; the data
preparation before the first update is not). Tune on ``val``; ``test_2016_flickr`` is for the
report only.
"""
import argparse
import json
import os
import sys

from npformer.cli.common import non_negative_float, positive_int
from npformer.data.textfile import write_text_atomic
from npformer.training.averaging import average_state_dicts
from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.multi30k import evaluate_checkpoint
from npformer.training.trainer import step_checkpoints

FIGURES = ("bleu", "bleu_cased", "bleu_papers", "seconds")


def windows(kept, every, average_last):
    """For every ``every``-th kept checkpoint counted back from the last: the checkpoints the
    recipe would average if the run stopped there (it and up to ``average_last - 1`` before)."""
    chosen = sorted(range(len(kept) - 1, -1, -every))
    return [kept[max(0, i - average_last + 1): i + 1] for i in chosen]


class Weights:
    """Loaded checkpoints' weights, each read once and dropped once no later window needs it."""

    def __init__(self):
        self._states = {}

    def averaged(self, paths):
        """The last checkpoint of ``paths`` (loaded) holding the mean weights of all of them."""
        self._states = {p: state for p, state in self._states.items() if p in paths}
        last = load_model_checkpoint(paths[-1])
        for path in paths:
            if path not in self._states:
                self._states[path] = (last if path == paths[-1]
                                      else load_model_checkpoint(path)).model.state_dict()
        if len(paths) > 1:
            last.model.load_state_dict(average_state_dicts(self._states[p] for p in paths))
        return last


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="the run folder (its step_N checkpoints)")
    p.add_argument("--data-dir", default=None, help="the Multi30k folder")
    p.add_argument("--split", action="append", default=None,
                   help="split to score (repeatable; default val)")
    p.add_argument("--beam", type=positive_int, default=5, help="beam width (default %(default)s)")
    p.add_argument("--length-penalty", type=non_negative_float, default=0.6,
                   help="beam search's length penalty α (default %(default)s, eval's)")
    p.add_argument("--average-last", type=positive_int, default=10,
                   help="checkpoints averaged at each point (default %(default)s)")
    p.add_argument("--every", type=positive_int, default=1,
                   help="score every N-th kept checkpoint, counted back from the last")
    p.add_argument("--out", help="write the points here as JSON lines (refused if it exists)")
    args = p.parse_args(argv)
    if args.out and os.path.exists(args.out):
        p.error(f"--out {args.out}: exists; give another path")
    kept = step_checkpoints(args.run)
    if not kept:
        p.error(f"{args.run}: no step_N checkpoints (train with --keep-last)")
    splits = args.split or ["val"]
    weights, points = Weights(), []
    if args.out:
        write_text_atomic(args.out, "")          # claimed now: each point is added as scored
    print(f"{'minutes':>8} {'step':>6} {'avg':>4} {'split':>18} {'BLEU lc':>8} {'cased':>7} "
          f"{'papers':>7} {'decode s':>9}")
    for paths in windows(kept, args.every, args.average_last):
        loaded = weights.averaged(paths)
        training = loaded.meta.get("training") or {}
        options = (loaded.meta.get("extra") or {}).get("options") or {}
        for split in splits:
            result = evaluate_checkpoint(loaded, args.data_dir, split, beam=args.beam,
                                         length_penalty=args.length_penalty)
            point = {"run": os.path.basename(os.path.normpath(args.run)),
                     "preset": options.get("preset"), "src": result["src"], "tgt": result["tgt"],
                     "step": training.get("step", -1), "epoch": training.get("epoch", -1),
                     "minutes": (training.get("seconds") or float("nan")) / 60.0,
                     "averaged": len(paths), "length_penalty": args.length_penalty, "split": split,
                     "method": result["method"],
                     **{k: result[k] for k in FIGURES if k in result}}
            points.append(point)
            print(f"{point['minutes']:8.1f} {point['step']:6d} {len(paths):4d} {split:>18} "
                  f"{point['bleu']:8.2f} {point['bleu_cased']:7.2f} "
                  f"{point.get('bleu_papers', float('nan')):7.2f} {point['seconds']:9.1f}",
                  flush=True)
            if args.out:                         # an interrupted run keeps what it scored
                write_text_atomic(args.out, "".join(json.dumps(pt) + "\n" for pt in points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
