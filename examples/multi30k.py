"""Train a German->English model on Multi30k with the library API (what `npformer train
--dataset multi30k` does), then score it on test_2016_flickr and show five translations.

    python examples/multi30k.py --minutes 10
    python examples/multi30k.py --src en --tgt de --minutes 60 --out runs/example-en-de

The full recipe and its measured figures are in docs/multi30k.md.
"""
import argparse

from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.multi30k import build_trainer, evaluate_checkpoint, load_multi30k


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None, help="default $NPFORMER_DATA")
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-time budget of training")
    parser.add_argument("--out", default="runs/example-multi30k")
    args = parser.parse_args()

    # 1. data: raw sentence pairs; vocabularies (min_freq 2) from the lowercased training side
    data = load_multi30k(args.data_dir, args.src, args.tgt)
    print(f"{len(data.train)} training pairs, e.g. {data.train[0]}")
    print(f"vocabularies: {len(data.vocabs.src)} {args.src}, {len(data.vocabs.tgt)} {args.tgt} tokens")

    # 2. model and trainer with the recipe's defaults (d_model 256, 3+3 layers, ~5,000-token
    #    batches, warm-up schedule, label smoothing 0.1), capped by wall time
    trainer = build_trainer(data, train_kwargs={"time_budget": args.minutes * 60, "out_dir": args.out,
                                                "keep_last": 5})
    print(f"{trainer.model.num_parameters():,} parameters, {trainer.task.batches_per_epoch()} batches an epoch")
    trainer.fit(on_eval=lambda r: print(f"{r['seconds'] / 60:5.1f} min  step {r['step']:5d}  "
                                        f"valid BLEU {r['bleu']:.2f}", flush=True))

    # 3. the best checkpoint (by validation BLEU) on the test set, scored by sacrebleu
    best = load_model_checkpoint(f"{args.out}/best")
    result = evaluate_checkpoint(best, args.data_dir, "test_2016_flickr")
    print(f"test_2016_flickr: BLEU {result['bleu']:.2f} (lowercased; {result['signature']}), "
          f"cased {result['bleu_cased']:.2f}, greedy in {result['seconds']:.1f} s")
    for src, ref, hyp in list(zip(result["sources"], result["references"], result["hypotheses"]))[:5]:
        print(f"  {src}\n    -> {hyp}\n    reference: {ref}")


if __name__ == "__main__":
    main()
