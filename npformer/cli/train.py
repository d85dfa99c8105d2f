"""``npformer train``: train on the toy corpus or on a pair of parallel text files."""
import os

from ..data.vocab import Vocab
from ..nn import Transformer
from ..training.toy import TOY_MODEL, TOY_TRAIN, toy_data
from ..training.trainer import TrainConfig, Trainer
from .common import add_model_args, add_train_args, model_kwargs, read_lines, train_kwargs

DATASETS = ("toy", "files", "multi30k")


def add_parser(sub, name):
    p = sub.add_parser(name, help="train a model (toy corpus or parallel text files)",
                       description="Train a Transformer. --dataset toy uses the built-in corpus; "
                                   "--src-file/--tgt-file train on parallel text, one sentence a "
                                   "line, whitespace-tokenised (validation on --valid-src/--valid-tgt).")
    p.add_argument("--dataset", choices=DATASETS, default=None,
                   help="toy, files (implied by --src-file) or multi30k (coming in a later issue)")
    p.add_argument("--src-file")
    p.add_argument("--tgt-file")
    p.add_argument("--valid-src")
    p.add_argument("--valid-tgt")
    p.add_argument("--min-freq", type=int, default=1, help="vocabulary: keep words seen this often")
    p.add_argument("--out", required=True, help="run directory (checkpoints, metrics.jsonl)")
    add_model_args(p, TOY_MODEL)
    add_train_args(p, {**TOY_TRAIN, "target": None})
    p.set_defaults(run=run)


def _read_pairs(src_path, tgt_path, what):
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(f"{what}: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}")
    pairs = []
    for n, (s, t) in enumerate(zip(src, tgt), 1):
        if not s.split() or not t.split():
            raise ValueError(f"{what}: line {n} is empty in {src_path if not s.split() else tgt_path}")
        pairs.append((s, t))
    if not pairs:
        raise ValueError(f"{what}: {src_path} is empty")
    return pairs


def load_dataset(args):
    """(train pairs, valid pairs, src vocab, tgt vocab) for the chosen dataset."""
    dataset = args.dataset or ("files" if args.src_file else None)
    if dataset is None:
        raise ValueError("--dataset: choose toy, or give --src-file and --tgt-file")
    if dataset == "multi30k":
        raise ValueError("--dataset multi30k: not available yet (a later issue); use "
                         "`npformer download multi30k` and --src-file/--tgt-file meanwhile")
    if dataset == "toy":
        data = toy_data(args.seed)
        return data.train, data.valid, data.src_vocab, data.tgt_vocab
    if not (args.src_file and args.tgt_file):
        raise ValueError("--src-file and --tgt-file: both are needed for --dataset files")
    train = _read_pairs(args.src_file, args.tgt_file, "training data")
    valid = []
    if args.valid_src or args.valid_tgt:
        if not (args.valid_src and args.valid_tgt):
            raise ValueError("--valid-src and --valid-tgt: give both or neither")
        valid = _read_pairs(args.valid_src, args.valid_tgt, "validation data")
    src_vocab = Vocab.build([s.split() for s, _ in train], min_freq=args.min_freq)
    tgt_vocab = Vocab.build([t.split() for _, t in train], min_freq=args.min_freq)
    return train, valid, src_vocab, tgt_vocab


def run(args):
    train, valid, src_vocab, tgt_vocab = load_dataset(args)
    if args.resume:
        from ..training.checkpointing import load_model_checkpoint
        saved = load_model_checkpoint(args.resume)   # keep the checkpoint's vocabularies
        src_vocab, tgt_vocab = saved.src_vocab, saved.tgt_vocab
    model = Transformer(len(src_vocab), len(tgt_vocab), seed=args.seed, **model_kwargs(args))
    config = TrainConfig(out_dir=args.out, **train_kwargs(args))
    trainer = Trainer(model, src_vocab, tgt_vocab, train, valid, config)
    if args.resume:
        trainer.resume(args.resume)

    def on_eval(rec):
        if not args.quiet:
            print(f"epoch {rec['epoch']:3d}  step {rec['step']:5d}  valid loss {rec['loss']:.3f}  "
                  f"exact match {rec['exact_match']:.3f}  BLEU {rec['bleu']:.1f}", flush=True)

    summary = trainer.fit(on_eval=on_eval)
    print(f"done: {summary['step']} steps, {summary['epoch']} epochs, {summary['seconds']:.1f} s, "
          f"stopped by {summary['stop_reason']}")
    best = os.path.join(args.out, "best" if valid else "last")
    print(f"checkpoint: {best}")
    return 0
