"""``npformer train``: train a Transformer. --dataset toy uses the built-in corpus;
--src-file/--tgt-file train on parallel text, one sentence a line, whitespace-tokenised
(validation on --valid-src/--valid-tgt); --dataset multi30k trains on Multi30k (--data-dir,
--src, --tgt) with the recipe of docs/multi30k.md."""
import contextlib
import os
import re

from ..dropout_rates import inner_dropout_rates
from ..training.averaging import average_checkpoints
from ..training.files import files_trainer
from ..training.multi30k import MULTI30K_TRAIN, PREPROCESS, PRESETS, multi30k_trainer
from ..training.toy import TOY_MODEL, TOY_TRAIN, toy_trainer
from ..training.trainer import TrainConfig, step_checkpoints
from .common import (RecipeDefaultsFormatter, add_model_args, add_train_args, bucket_size,
                     command_parser, model_kwargs, path_argument, positive_float, positive_int,
                     refuse_output_over_inputs, train_kwargs)
from .model_options import TRANSLATION_MODEL
from .parallel import add_parallel_args, join
from .runs import (RECORDED_OPTIONS, TOY_MADE_BY, TRAIN_MADE_BY, add_run_folder_options,
                   apply_resume_policy, flag, plan_run_folder, refuse_inputs_in_run)

DATASETS = ("toy", "files", "multi30k")
# model/training options left unset take the defaults of the chosen dataset's recipe
_TRAIN_KEYS = ("epochs", "batch_size", "lr", "warmup_steps", "schedule", "label_smoothing",
               "weight_decay", "clip_norm", "stop_metric", "min_lr", "target")
# options each dataset would ignore: giving one is refused, naming it
_NOT_FOR = {"toy": ("src_file", "tgt_file", "valid_src", "valid_tgt", "min_freq", "data_dir",
                    "src", "tgt", "cased", "subword", "subset", "valid_subset", "preset",
                    "preprocess"),
            "files": ("data_dir", "src", "tgt", "cased", "subword", "subset", "valid_subset",
                      "preset", "preprocess"),
            "multi30k": ("src_file", "tgt_file", "valid_src", "valid_tgt")}
# options that act on validation: refused where there is no validation data
_NEED_VALIDATION = ("eval_every_steps", "patience", "target", "stop_metric", "keep_last",
                    "average_last")


def add_parser(sub, name):
    p = command_parser(sub, name, __doc__,
                       "train a model (toy corpus, parallel text files or Multi30k)",
                       formatter_class=RecipeDefaultsFormatter)
    p.add_argument("--dataset", choices=DATASETS, default=None,
                   help="toy, files (implied by --src-file) or multi30k")
    p.add_argument("--src-file", type=path_argument)
    p.add_argument("--tgt-file", type=path_argument)
    p.add_argument("--valid-src", type=path_argument)
    p.add_argument("--valid-tgt", type=path_argument)
    p.add_argument("--min-freq", type=positive_int, default=None,
                   help="vocabulary: keep words seen this often (default 2 for multi30k, else 1)")
    add_run_folder_options(p, removes="replace the run in --out: its best/last/step_*/averaged "
                                      "checkpoints and metrics.jsonl are removed (no other file) "
                                      "before the new run writes")
    m = p.add_argument_group("multi30k")
    m.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="the recipe's model, training and units (docs/multi30k.md): base (3+3 "
                        "layers of d_model 256, words; the default) or tiny (Transformer-Tiny: "
                        "4+4 layers of d_model 128, all embeddings shared over a joint BPE of "
                        "10,000 pieces, 8,000 updates, the average of the last 10 epochs)")
    m.add_argument("--data-dir", type=path_argument, default=None,
                   help="folder with train/val .de.gz/.en.gz (default $NPFORMER_DATA, else "
                        "~/.cache/npformer/multi30k)")
    m.add_argument("--src", default=None, choices=["de", "en"], help="source language (default de)")
    m.add_argument("--tgt", default=None, choices=["de", "en"], help="target language (default en)")
    m.add_argument("--cased", action="store_true", default=None,
                   help="keep the case of the text (default: lowercase, see docs/multi30k.md)")
    m.add_argument("--preprocess", default=None, choices=list(PREPROCESS),
                   help="how raw text becomes tokens: npformer (the project's word tokenizer) or "
                        "moses (the papers': Moses normalisation, lowercasing, the Moses "
                        "tokenizer with its escaping; needs pip install 'npformer[moses]'); "
                        "default: the preset's, npformer for base, moses for tiny")
    m.add_argument("--subword", type=positive_int, default=None, metavar="N",
                   help="split words into a joint SentencePiece model's N pieces (e.g. 8000; needs "
                        "pip install 'npformer[subword]'; default: the preset's, whole words for "
                        "base, 10000 for tiny)")
    m.add_argument("--subset", type=positive_int, default=None, metavar="N",
                   help="first N training pairs only")
    m.add_argument("--valid-subset", type=positive_int, default=None, metavar="N",
                   help="first N validation pairs only")
    g = p.add_argument_group("batching, checkpoints, time")
    g.add_argument("--max-tokens", type=positive_int, default=None, metavar="N",
                   help="batches of about N padded tokens (src + tgt) instead of --batch-size "
                        "(multi30k default: the preset's, %d for base, %d for tiny)"
                   % (PRESETS["base"]["train"]["max_tokens"], PRESETS["tiny"]["train"]["max_tokens"]))
    g.add_argument("--bucket-size", type=bucket_size, default=None, metavar="N|all",
                   help="sort each N training pairs by length before cutting batches; 'all': the "
                        "whole set, as fairseq (default: 1000; 'all' for --preset tiny)")
    g.add_argument("--accum-steps", type=positive_int, default=None, metavar="K",
                   help="sum the gradients of K batches per update (default 1)")
    g.add_argument("--eval-every", "--save-every", dest="eval_every_steps", type=positive_int, default=None,
                   metavar="N", help="validate and checkpoint every N updates (multi30k default "
                                     "%d; otherwise once per epoch)" % MULTI30K_TRAIN["eval_every_steps"])
    g.add_argument("--time-budget", type=positive_float, default=None, metavar="MIN",
                   help="stop training after MIN minutes of wall time (validations included), "
                        "then validate the final weights (when there is validation data)")
    g.add_argument("--keep-last", type=positive_int, default=None, metavar="N",
                   help="keep the last N checkpoints as step_<N>: one per validation, or one per "
                        "epoch under --preset tiny (multi30k tiny default 10)")
    g.add_argument("--average-last", type=positive_int, default=None, metavar="N",
                   help="after training, average the last N kept checkpoints into OUT/averaged "
                        "(implies --keep-last N if that is not given)")
    add_model_args(p)                            # (the dataset's recipe fills them)
    add_train_args(p, {k: None for k in _TRAIN_KEYS})
    p.add_argument("--resume", type=path_argument, metavar="CKPT",
                   help="continue the run of this checkpoint, bit for bit: options left out keep "
                        "the checkpoint's values; only --max-steps, --epochs, --time-budget, "
                        "--patience, --target, --eval-every, --keep-last, --average-last, --quiet "
                        "and the data files' locations may change (docs/reliability.md)")
    add_parallel_args(p)
    # None = not given, so that a resume can tell the options given from those to take from the
    # checkpoint (npformer.cli.runs); fill_defaults sets the recipe's values afterwards
    p.set_defaults(run=run, seed=None)


def dataset_name(args):
    dataset = args.dataset or ("files" if args.src_file else None)
    if dataset is None:
        raise ValueError("--dataset: choose toy or multi30k, or give --src-file and --tgt-file")
    if dataset == "multi30k" and (args.src_file or args.tgt_file):
        raise ValueError("--src-file/--tgt-file: not used with --dataset multi30k (give --data-dir)")
    return dataset


def check_dataset_options(args, dataset, given):
    """Refuse the options in ``given`` (the names the user gave) that ``dataset`` would ignore."""
    for dest in _NOT_FOR[dataset]:
        if dest in given:
            where = {"toy": "the built-in corpus", "files": "--src-file/--tgt-file",
                     "multi30k": "Multi30k (give --data-dir)"}[dataset]
            only = ("--dataset multi30k" if dest in _NOT_FOR["files"] else
                    "--src-file/--tgt-file data" if dest != "min_freq" else
                    "--dataset files or multi30k")
            raise ValueError(f"{flag(dest)}: not used with --dataset {dataset} ({where}); it is "
                             f"only for {only}")
    if dataset == "files" and not (args.src_file and args.tgt_file):
        raise ValueError("--src-file and --tgt-file: both are needed for --dataset files")
    if dataset == "files" and bool(args.valid_src) != bool(args.valid_tgt):
        raise ValueError("--valid-src and --valid-tgt: give both or neither")
    if dataset == "files" and not (args.valid_src or args.valid_tgt):
        for dest in _NEED_VALIDATION:
            if dest in given:
                raise ValueError(f"{flag(dest)}: acts on validation, and this run has no "
                                 f"validation data; give --valid-src and --valid-tgt")


def fill_defaults(args, dataset):
    """Options left unset take the recipe's defaults (multi30k's preset, else the toy's)."""
    if dataset == "multi30k":
        args.preset = args.preset or "base"
        preset = PRESETS[args.preset]
        model, train = preset["model"], preset["train"]
        for dest in ("subword", "average_last", "preprocess"):
            if getattr(args, dest) is None:
                setattr(args, dest, preset[dest])
        for dest in ("max_steps", "keep_last"):
            if getattr(args, dest) is None:
                setattr(args, dest, train.get(dest))
    else:
        model, train = TOY_MODEL, {**TOY_TRAIN, "target": None}
    for option, value in TRANSLATION_MODEL.defaults(model).items():
        if getattr(args, option) is None:
            setattr(args, option, value)
    # recorded as the rates the run uses (a recipe without them: --dropout's)
    args.attention_dropout, args.activation_dropout = inner_dropout_rates(
        args.dropout, args.attention_dropout, args.activation_dropout)
    for key in _TRAIN_KEYS:
        if getattr(args, key) is None:
            setattr(args, key, train.get(key, 0.0 if key in ("min_lr", "weight_decay") else None))
    if args.seed is None:
        args.seed = 0
    if args.accum_steps is None:
        args.accum_steps = 1
    if args.min_freq is None:
        args.min_freq = 2 if dataset == "multi30k" else 1
    if dataset == "multi30k":
        args.src = "de" if args.src is None else args.src
        args.tgt = "en" if args.tgt is None else args.tgt
        args.cased = bool(args.cased)
        if args.max_tokens is None:
            args.max_tokens = train["max_tokens"]
        if args.eval_every_steps is None:
            args.eval_every_steps = train["eval_every_steps"]
    if args.bucket_size is None:
        args.bucket_size = train.get("bucket_size", TrainConfig.bucket_size) or "all"  # None: all
    if args.average_last is not None and args.keep_last is None:
        args.keep_last = args.average_last
    if args.average_last is not None and args.average_last > args.keep_last:
        raise ValueError(f"--average-last {args.average_last}: cannot exceed --keep-last "
                         f"{args.keep_last} (only that many checkpoints are kept)")


def _config_kwargs(args):
    kwargs = train_kwargs(args)
    kwargs.update(out_dir=args.out, max_tokens=args.max_tokens, accum_steps=args.accum_steps,
                  bucket_size=None if args.bucket_size == "all" else args.bucket_size,
                  eval_every_steps=args.eval_every_steps, keep_last=args.keep_last,
                  time_budget=None if args.time_budget is None else args.time_budget * 60.0)
    return kwargs


def _recorded(args, dataset):
    """What every checkpoint of this run records about its options (npformer.cli.runs)."""
    options = {dest: getattr(args, dest, None) for dest in RECORDED_OPTIONS}
    options["dataset"] = dataset
    return {"made_by": TRAIN_MADE_BY, "options": options}


_PARAMETER = re.compile(r"([a-z][a-z_]*)(?=:| [^ ]+:| \()")


@contextlib.contextmanager
def _options_named():
    """Around a recipe: its errors name its parameters (``min_freq 100000: ...``); where the
    parameter is one of this command's options, the message names the option instead
    (``--min-freq 100000: ...``)."""
    try:
        yield
    except ValueError as e:
        message = str(e)
        name = _PARAMETER.match(message)
        if type(e) is not ValueError or not name or name.group(1) not in RECORDED_OPTIONS:
            raise
        raise ValueError(flag(name.group(1)) + message[name.end(1):]) from None


def build(args, saved=None, given=()):
    """The Trainer that the options describe, from its dataset's recipe. ``saved``: the loaded
    checkpoint a resume continues (the recipe keeps its vocabularies and units); ``given``: the
    options the user gave."""
    dataset = dataset_name(args)
    check_dataset_options(args, dataset, given)
    fill_defaults(args, dataset)
    refuse_inputs_in_run(args.out, [("--src-file", args.src_file), ("--tgt-file", args.tgt_file),
                                    ("--valid-src", args.valid_src), ("--valid-tgt", args.valid_tgt)])
    common = dict(model_kwargs=model_kwargs(args), train_kwargs=_config_kwargs(args),
                  seed=args.seed, extra=_recorded(args, dataset), saved=saved)
    with _options_named():
        if dataset == "toy":
            return toy_trainer(**common)[0]
        if dataset == "files":
            return files_trainer(args.src_file, args.tgt_file, args.valid_src, args.valid_tgt,
                                 args.min_freq, **common)[0]
        trainer, data = multi30k_trainer(args.data_dir, args.src, args.tgt,
                                         lowercase=not args.cased, min_freq=args.min_freq,
                                         subset=args.subset, valid_subset=args.valid_subset,
                                         subword=args.subword, preset=args.preset,
                                         preprocess=args.preprocess, **common)
    vocabs = trainer.task.vocabs
    sizes = (f"one joint vocabulary of {len(vocabs.src)}" if vocabs.is_joint else
             f"vocabularies {len(vocabs.src)} / {len(vocabs.tgt)}")
    print(f"multi30k {args.src}->{args.tgt}: {len(data.train)} training pairs, "
          f"{len(data.valid)} validation pairs, {sizes} (min_freq {args.min_freq}"
          f"{f', {len(data.subword)} subword pieces' if data.subword else ''}), "
          f"{trainer.model.num_parameters():,} parameters, {trainer.task.batches_per_epoch()} batches "
          f"per epoch", flush=True)
    return trainer


def _existing(path):
    return os.path.exists(path + ".npz")


def run(args):
    given = {dest for dest in RECORDED_OPTIONS if getattr(args, dest, None) is not None}
    collective = join(args)                      # one process, or this rank of an MPI job
    saved = None
    if args.resume:
        from ..training.checkpointing import load_model_checkpoint
        saved = load_model_checkpoint(args.resume)
        made_by = (saved.meta.get("extra") or {}).get("made_by")
        if made_by not in (None, TRAIN_MADE_BY, TOY_MADE_BY):
            raise ValueError(f"--resume {args.resume}: was written by {made_by}; resume it with "
                             f"that command")
        apply_resume_policy(args, saved.meta, args.resume)
    trainer = build(args, saved, given)          # bad data and options are reported first
    trainer.set_collective(collective)
    root = collective.is_root                    # the one process that writes the run folder
    folder = root and plan_run_folder(args.out, "train", overwrite=args.overwrite,
                                      resume=args.resume)
    if saved is not None:
        trainer.resume(saved)                    # the checkpoint loaded (and checked) above
    trainer.check_work_left()                    # before the folder is touched
    if root:
        folder.prepare()

    def on_eval(rec):
        if not args.quiet:
            print(f"epoch {rec['epoch']:3d}  step {rec['step']:5d}  {rec['seconds']:7.0f} s  "
                  f"valid loss {rec['loss']:.3f}  exact match {rec['exact_match']:.3f}  "
                  f"BLEU {rec['bleu']:.2f}", flush=True)

    summary = trainer.fit(on_eval=on_eval)
    print(f"done: {summary['step']} steps, {summary['epoch']} epochs, {summary['seconds']:.1f} s, "
          f"stopped by {summary['stop_reason']}")
    best, last = os.path.join(args.out, "best"), os.path.join(args.out, "last")
    shown = best if trainer.task.has_validation and _existing(best) else last if _existing(last) else None
    print(f"checkpoint: {shown}" if shown else "checkpoint: none written")
    if args.average_last and root:
        kept = step_checkpoints(args.out)[-args.average_last:]
        if len(kept) < 2:
            print(f"--average-last {args.average_last}: only {len(kept)} checkpoint(s) kept, "
                  f"nothing to average")
        else:
            out = os.path.join(args.out, "averaged")
            refuse_output_over_inputs("--average-last", out,
                                      [("--resume", args.resume)] + [("checkpoint", k) for k in kept],
                                      checkpoint=True)
            average_checkpoints(kept, out)
            print(f"averaged {len(kept)} checkpoints ({', '.join(os.path.basename(k) for k in kept)}) "
                  f"-> {out}")
    return 0
