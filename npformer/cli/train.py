"""``npformer train``: train on the toy corpus, on a pair of parallel text files, or on Multi30k."""
import os

from ..data.vocab import Vocab
from ..nn import Transformer
from ..training.averaging import average_checkpoints
from ..training.multi30k import (MULTI30K_MODEL, MULTI30K_TRAIN, build_trainer, checkpoint_subword,
                                 load_multi30k)
from ..training.toy import TOY_MODEL, TOY_TRAIN, toy_data
from ..training.trainer import TrainConfig, Trainer, step_checkpoints
from .common import add_model_args, add_train_args, model_kwargs, read_lines, train_kwargs

DATASETS = ("toy", "files", "multi30k")
# model/training options left unset take the defaults of the chosen dataset's recipe
_MODEL_KEYS = ("d_model", "n_heads", "d_ff", "n_encoder_layers", "dropout", "max_len")
_TRAIN_KEYS = ("epochs", "batch_size", "lr", "warmup_steps", "schedule", "label_smoothing",
               "clip_norm", "stop_metric", "min_lr", "target")


def add_parser(sub, name):
    p = sub.add_parser(name, help="train a model (toy corpus, parallel text files or Multi30k)",
                       description="Train a Transformer. --dataset toy uses the built-in corpus; "
                                   "--src-file/--tgt-file train on parallel text, one sentence a "
                                   "line, whitespace-tokenised (validation on --valid-src/--valid-tgt); "
                                   "--dataset multi30k trains on Multi30k (--data-dir, --src, --tgt) "
                                   "with the recipe of docs/multi30k.md.")
    p.add_argument("--dataset", choices=DATASETS, default=None,
                   help="toy, files (implied by --src-file) or multi30k")
    p.add_argument("--src-file")
    p.add_argument("--tgt-file")
    p.add_argument("--valid-src")
    p.add_argument("--valid-tgt")
    p.add_argument("--min-freq", type=int, default=None,
                   help="vocabulary: keep words seen this often (default 2 for multi30k, else 1)")
    p.add_argument("--out", required=True, help="run directory (checkpoints, metrics.jsonl)")
    m = p.add_argument_group("multi30k")
    m.add_argument("--data-dir", default=None,
                   help="folder with train/val .de.gz/.en.gz (default $NPFORMER_DATA, else "
                        "~/.cache/npformer/multi30k)")
    m.add_argument("--src", default="de", choices=["de", "en"], help="source language")
    m.add_argument("--tgt", default="en", choices=["de", "en"], help="target language")
    m.add_argument("--cased", action="store_true",
                   help="keep the case of the text (default: lowercase, see docs/multi30k.md)")
    m.add_argument("--subword", type=int, default=None, metavar="N",
                   help="split words into a joint SentencePiece model's N pieces (e.g. 8000; needs "
                        "pip install 'npformer[subword]'; default: whole words)")
    m.add_argument("--subset", type=int, default=None, metavar="N", help="first N training pairs only")
    m.add_argument("--valid-subset", type=int, default=None, metavar="N",
                   help="first N validation pairs only")
    g = p.add_argument_group("batching, checkpoints, time")
    g.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="batches of about N padded tokens (src + tgt) instead of --batch-size "
                        "(multi30k default %d)" % MULTI30K_TRAIN["max_tokens"])
    g.add_argument("--accum-steps", type=int, default=1, metavar="K",
                   help="sum the gradients of K batches per update (default 1)")
    g.add_argument("--eval-every", "--save-every", dest="eval_every_steps", type=int, default=None,
                   metavar="N", help="validate and checkpoint every N updates (multi30k default "
                                     "%d; otherwise once per epoch)" % MULTI30K_TRAIN["eval_every_steps"])
    g.add_argument("--time-budget", type=float, default=None, metavar="MIN",
                   help="stop training after MIN minutes of wall time (validations included), "
                        "then validate once more")
    g.add_argument("--keep-last", type=int, default=None, metavar="N",
                   help="keep the checkpoints of the last N validations as step_<N>")
    g.add_argument("--average-last", type=int, default=None, metavar="N",
                   help="after training, average the last N kept checkpoints into OUT/averaged "
                        "(implies --keep-last N if that is not given)")
    add_model_args(p, {k: None for k in ("d_model", "n_heads", "d_ff", "n_encoder_layers",
                                          "dropout", "max_len")})
    add_train_args(p, {k: None for k in _TRAIN_KEYS})
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


def dataset_name(args):
    dataset = args.dataset or ("files" if args.src_file else None)
    if dataset is None:
        raise ValueError("--dataset: choose toy or multi30k, or give --src-file and --tgt-file")
    if dataset == "multi30k" and (args.src_file or args.tgt_file):
        raise ValueError("--src-file/--tgt-file: not used with --dataset multi30k (give --data-dir)")
    return dataset


def fill_defaults(args, dataset):
    """Options left unset take the recipe's defaults (multi30k, else the toy's)."""
    model = MULTI30K_MODEL if dataset == "multi30k" else TOY_MODEL
    train = MULTI30K_TRAIN if dataset == "multi30k" else {**TOY_TRAIN, "target": None}
    for key in _MODEL_KEYS:
        dest = "layers" if key == "n_encoder_layers" else key
        if getattr(args, dest) is None:
            setattr(args, dest, model[key])
    for key in _TRAIN_KEYS:
        if getattr(args, key) is None:
            setattr(args, key, train.get(key, 0.0 if key == "min_lr" else None))
    if args.min_freq is None:
        args.min_freq = 2 if dataset == "multi30k" else 1
    if dataset == "multi30k":
        if args.max_tokens is None:
            args.max_tokens = train["max_tokens"]
        if args.eval_every_steps is None:
            args.eval_every_steps = train["eval_every_steps"]
    if args.average_last is not None and args.keep_last is None:
        args.keep_last = args.average_last
    if args.average_last is not None and args.average_last > args.keep_last:
        raise ValueError(f"--average-last {args.average_last}: cannot exceed --keep-last "
                         f"{args.keep_last} (only that many checkpoints are kept)")
    if args.time_budget is not None and not args.time_budget > 0:
        raise ValueError(f"--time-budget: expected a positive number of minutes, got {args.time_budget}")


def load_dataset(args):
    """(train pairs, valid pairs, src vocab, tgt vocab) for the toy or files datasets."""
    dataset = dataset_name(args)
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


def _config_kwargs(args):
    kwargs = train_kwargs(args)
    kwargs.update(max_tokens=args.max_tokens, accum_steps=args.accum_steps,
                  eval_every_steps=args.eval_every_steps, keep_last=args.keep_last,
                  time_budget=None if args.time_budget is None else args.time_budget * 60.0)
    return kwargs


def build(args):
    """The Trainer (and the number of training pairs) that the options describe."""
    dataset = dataset_name(args)
    fill_defaults(args, dataset)
    if dataset == "multi30k":
        saved = None
        if args.resume:                              # its vocabularies and units are kept
            from ..training.checkpointing import load_model_checkpoint
            saved = load_model_checkpoint(args.resume)
            pieces = checkpoint_subword(saved)
            if args.subword is not None and pieces is None:
                raise ValueError(f"--subword: the checkpoint {args.resume} was trained on whole "
                                 f"words; resume it without --subword")
        data = load_multi30k(args.data_dir, args.src, args.tgt, lowercase=not args.cased,
                             min_freq=args.min_freq, subset=args.subset,
                             valid_subset=args.valid_subset,
                             subword=None if saved is not None else args.subword)
        if saved is not None:
            data.src_vocab, data.tgt_vocab, data.subword = saved.src_vocab, saved.tgt_vocab, pieces
            if pieces is not None:
                data.lowercase = pieces.lowercase
        trainer = build_trainer(data, model_kwargs(args),
                                {**_config_kwargs(args), "out_dir": args.out}, seed=args.seed)
        print(f"multi30k {args.src}->{args.tgt}: {len(data.train)} training pairs, "
              f"{len(data.valid)} validation pairs, vocabularies {len(data.src_vocab)} / "
              f"{len(data.tgt_vocab)} (min_freq {args.min_freq}"
              f"{f', {len(data.subword)} subword pieces' if data.subword else ''}), "
              f"{trainer.model.num_parameters():,} parameters, {len(trainer.sampler)} batches "
              f"per epoch", flush=True)
        return trainer
    if args.subset or args.valid_subset or args.subword is not None:
        raise ValueError("--subset/--valid-subset/--subword: only for --dataset multi30k")
    train, valid, src_vocab, tgt_vocab = load_dataset(args)
    if args.resume:
        from ..training.checkpointing import load_model_checkpoint
        saved = load_model_checkpoint(args.resume)   # keep the checkpoint's vocabularies
        src_vocab, tgt_vocab = saved.src_vocab, saved.tgt_vocab
    model = Transformer(len(src_vocab), len(tgt_vocab), seed=args.seed, **model_kwargs(args))
    config = TrainConfig(out_dir=args.out, **_config_kwargs(args))
    return Trainer(model, src_vocab, tgt_vocab, train, valid, config)


def run(args):
    trainer = build(args)
    if args.resume:
        trainer.resume(args.resume)

    def on_eval(rec):
        if not args.quiet:
            print(f"epoch {rec['epoch']:3d}  step {rec['step']:5d}  {rec['seconds']:7.0f} s  "
                  f"valid loss {rec['loss']:.3f}  exact match {rec['exact_match']:.3f}  "
                  f"BLEU {rec['bleu']:.2f}", flush=True)

    summary = trainer.fit(on_eval=on_eval)
    print(f"done: {summary['step']} steps, {summary['epoch']} epochs, {summary['seconds']:.1f} s, "
          f"stopped by {summary['stop_reason']}")
    best = os.path.join(args.out, "best" if trainer.valid_pairs else "last")
    print(f"checkpoint: {best}")
    if args.average_last:
        kept = step_checkpoints(args.out)[-args.average_last:]
        if len(kept) < 2:
            print(f"--average-last {args.average_last}: only {len(kept)} checkpoint(s) kept, "
                  f"nothing to average")
        else:
            out = os.path.join(args.out, "averaged")
            average_checkpoints(kept, out)
            print(f"averaged {len(kept)} checkpoints ({', '.join(os.path.basename(k) for k in kept)}) "
                  f"-> {out}")
    return 0
