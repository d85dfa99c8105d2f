"""``npformer toy``: generate the toy Chinese->English corpus, build vocabularies, train a small
Transformer, report exact match on the training and held-out pairs and print example
translations."""
import os
import time

from ..training.toy import TOY_MODEL, TOY_TRAIN, run_toy
from .common import (NoneDefaultFormatter, add_model_args, add_train_args, check_writable,
                     command_parser, model_kwargs, non_negative_int, path_argument, train_kwargs,
                     write_json)
from .runs import TOY_MADE_BY, plan_run_folder, refuse_output_named_like_a_run_file


def add_parser(sub, name):
    p = command_parser(sub, name, __doc__,
                       "train the built-in Chinese->English toy model in one command",
                       formatter_class=NoneDefaultFormatter)
    p.add_argument("--out", type=path_argument, default="runs/toy",
                   help="run directory: best/last checkpoints and metrics.jsonl (default "
                        "%(default)s); a previous toy run there is replaced, any other run "
                        "refused")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run in --out even if npformer toy did not write it (only "
                        "its best/last/step_*/averaged checkpoints and metrics.jsonl are removed)")
    p.add_argument("--metrics-json", type=path_argument, metavar="PATH",
                   help="write train_exact_match, heldout_exact_match, train_seconds, ... as JSON")
    p.add_argument("--examples", type=non_negative_int, default=6, help="example translations to print")
    add_model_args(p, TOY_MODEL)
    add_train_args(p, TOY_TRAIN)
    p.set_defaults(run=run)


def run(args):
    start = time.perf_counter()
    if args.metrics_json:                        # fail now, not after training
        check_writable("--metrics-json", args.metrics_json)
        refuse_output_named_like_a_run_file("--metrics-json", args.metrics_json)
    folder = plan_run_folder(args.out, "toy", overwrite=args.overwrite)

    def on_eval(rec):
        if not args.quiet:
            print(f"epoch {rec['epoch']:3d}  step {rec['step']:5d}  valid loss {rec['loss']:.3f}  "
                  f"exact match {rec['exact_match']:.3f}  BLEU {rec['bleu']:.1f}", flush=True)

    result = run_toy(seed=args.seed, model_kwargs=model_kwargs(args),
                     train_kwargs={k: v for k, v in train_kwargs(args).items() if k != "seed"},
                     out_dir=args.out, quiet=args.quiet, on_eval=on_eval, n_examples=args.examples,
                     extra={"made_by": TOY_MADE_BY}, before_fit=folder.prepare)
    total = time.perf_counter() - start
    print(f"train exact match   {result.train_exact_match:.4f} ({len(result.data.train)} pairs)")
    print(f"held-out exact match {result.heldout_exact_match:.4f} ({len(result.data.heldout)} pairs, "
          f"combinations never seen in training)")
    print(f"training took {result.train_seconds:.1f} s ({result.summary['step']} steps, "
          f"stopped by {result.summary['stop_reason']}); total {total:.1f} s")
    if result.examples:
        print("\nexample translations (held-out):")
        for zh, ref, hyp in result.examples:
            mark = "ok" if hyp.split() == ref.split() else f"expected: {ref}"
            print(f"  {zh}\n    -> {hyp}   [{mark}]")
    checkpoint = next((os.path.join(args.out, name) for name in ("best", "last")
                       if os.path.exists(os.path.join(args.out, name + ".npz"))), None)
    if checkpoint:
        print(f"\ncheckpoint: {checkpoint}  (npformer translate --checkpoint {checkpoint} ...)")
    if args.metrics_json:
        write_json(args.metrics_json, {
            "train_exact_match": result.train_exact_match,
            "heldout_exact_match": result.heldout_exact_match,
            "train_seconds": result.train_seconds, "total_seconds": total,
            "steps": result.summary["step"], "epochs": result.summary["epoch"],
            "stop_reason": result.summary["stop_reason"],
            "checkpoint": checkpoint})
    return 0
