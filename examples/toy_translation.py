"""Train the toy Chinese->English model with the library API (what `npformer toy` does).

    python examples/toy_translation.py            # ~20 s on 2 CPU cores
"""
import npformer as nf
from npformer.decoding.translator import Translator
from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.metrics import exact_match
from npformer.training.toy import toy_data
from npformer.training.trainer import TrainConfig
from npformer.training.translation import translation_trainer


def main():
    # 1. data: 3000 training pairs; held-out pairs use combinations never seen in training
    data = toy_data(seed=0)
    print(f"{len(data.train)} training pairs, e.g. {data.train[0]}")
    print(f"vocabularies: {len(data.vocabs.src)} Chinese, {len(data.vocabs.tgt)} English tokens")

    # 2. a small Transformer
    model = nf.Transformer(len(data.vocabs.src), len(data.vocabs.tgt), d_model=64, n_heads=4,
                           d_ff=128, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1, max_len=32)
    print(f"{model.num_parameters():,} parameters")

    # 3. train: warm-up + cosine schedule, label smoothing, validation after every epoch
    config = TrainConfig(epochs=14, batch_size=64, lr=3e-3, warmup_steps=60, schedule="cosine",
                         min_lr=1e-4, label_smoothing=0.1, stop_metric="loss", out_dir="runs/example")
    trainer = translation_trainer(model, data.vocabs, data.train, data.valid, config)
    trainer.fit(on_eval=lambda r: print(f"epoch {r['epoch']}: valid exact match {r['exact_match']:.3f}"))

    # 4. translate with the best checkpoint, as `npformer translate` would
    best = load_model_checkpoint("runs/example/best")
    translator = Translator(best.model, best.vocabs)
    hyps = [t.text for t in translator.translate([zh for zh, _ in data.heldout])]
    print(f"held-out exact match: {exact_match(hyps, [en for _, en in data.heldout]):.3f}")
    for (zh, en), hyp in list(zip(data.heldout, hyps))[:5]:
        print(f"  {zh}  ->  {hyp}")


if __name__ == "__main__":
    main()
