"""``npformer lm``: train a character-level GPT on a text file, or fine-tune a Hugging Face model
(any family of ``npformer.families``) on one.

    npformer download tinyshakespeare
    npformer lm --data tinyshakespeare --out runs/shakespeare
    npformer sample --checkpoint runs/shakespeare/best --prompt "ROMEO:" --max-new-tokens 300
    npformer lm --data my.txt --init-from path/to/gpt2 --out runs/gpt2-mine --max-steps 200
    npformer lm --data tinyshakespeare --arch llama --out runs/llama
    npformer lm --data my.txt --init-from path/to/SmolLM2-135M --lora-rank 8 --out runs/lora

The recipe is ``npformer.training.language_model``'s (``lm_model(arch)``, ``LM_TRAIN``).
``--arch`` picks the block of a new model: a family of ``npformer.families`` (GPT-2's, Llama's,
Qwen2's, Qwen3's); it is recorded like a model option, and the model's configuration records
its family. A run recorded before --arch existed trained GPT-2's block (``migrate_arch``).
"""
import argparse
import os
from pathlib import Path

from ..checkpoint import write_file_atomic
from ..configs import GPTConfig
from ..data.download import text_file
from ..lora import split_names
from . import common
from .. import families
from ..training.language_model import (ARCH_ALIASES, INIT_CONTEXT, LM_ARCH, LM_TRAIN, lm_d_ff,
                                       lm_model, lm_trainer, migrate_arch)
from ..training.trainer import SPANNING
from .common import (NoneDefaultFormatter, add_model_options, non_negative_float, non_negative_int,
                     path_argument, positive_float, positive_int, probability,
                     refuse_min_lr_above_lr)
from .model_options import LANGUAGE_MODEL
from .parallel import add_parallel_args, join
from .runs import (same_path, add_run_folder_options, apply_resume_policy, flag, plan_run_folder,
                   refuse_inputs_in_run)

LM_MADE_BY = "npformer lm"
# what an out-of-memory error suggests (npformer.cli.main)
MEMORY_HINT = "try a smaller --layers, --d-model, --d-ff, --context or --batch-size"
# the options a checkpoint of ``npformer lm`` records, and those a resume may change
LM_RECORDED = ("data", "init_from", "arch", *LANGUAGE_MODEL.options, "max_steps", "batch_size", "lr",
               "schedule", "min_lr", "warmup_steps", "weight_decay", "clip_norm",
               "eval_every_steps", "time_budget", "sample_tokens", "seed",
               "lora_rank", "lora_alpha", "lora_dropout", "lora_targets")
LM_MAY_CHANGE = ("data", "max_steps", "time_budget", "eval_every_steps", "sample_tokens")
# what the LoRA settings' messages call them (npformer.lora.apply's names=)
LORA_FLAGS = {"rank": "--lora-rank", "alpha": "--lora-alpha", "dropout": "--lora-dropout",
              "target_modules": "--lora-targets"}
# the model options --init-from refuses, its model bringing them: all but --context (how much
# of the text the task shows it at once) and --dropout (the fine-tuning's)
# the families whose feed-forward is an MLP, and those whose is gated (the recipe's d_ff rule)
_MLP_ARCHS = [name for name in families.names() if lm_d_ff(name, 96) == 4 * 96]
_GATED_ARCHS = [name for name in families.names() if name not in _MLP_ARCHS]
_SHAPE = ("arch",) + tuple(option for option in LANGUAGE_MODEL.options
                            if option not in ("context", "dropout"))


def add_parser(sub, name):
    p = sub.add_parser(name, formatter_class=NoneDefaultFormatter,
                       help="train a character-level GPT on a text file (or fine-tune a "
                            "Hugging Face model)",
                       description="Train a decoder-only GPT on one UTF-8 text file: characters "
                                   "as tokens, the first 90% for training, the last 10% for "
                                   "the validation loss (nats per character, over the whole "
                                   "split), samples at every validation, the best checkpoint by "
                                   "validation loss. --init-from fine-tunes a Hugging Face "
                                   f"folder ({families.spelled()}) or an npformer GPT "
                                   "checkpoint instead, with its tokenizer.")
    p.add_argument("--data", type=path_argument, required=True, metavar="FILE",
                   help="the UTF-8 text to learn: a file, or tinyshakespeare (the file of "
                        "'npformer download tinyshakespeare'; a file of that name in the working "
                        "folder wins)")
    add_run_folder_options(p, removes="replace the run in --out (its checkpoints, metrics.jsonl "
                                       "and tokenizer.json are removed, no other file)")
    p.add_argument("--resume", type=path_argument, metavar="CKPT",
                   help="continue the run of this checkpoint, bit for bit (options left out keep "
                        "the checkpoint's values; only %s may change)"
                        % ", ".join(flag(d) for d in LM_MAY_CHANGE))
    p.add_argument("--init-from", type=path_argument, metavar="DIR",
                   help=f"start from these weights: a Hugging Face folder of "
                        f"{families.spelled()} (config.json, model.safetensors or its shards, "
                        f"tokenizer.json; extra hf) or an npformer GPT checkpoint; the text is "
                        f"cut by its tokenizer")
    # None: not given, so that a resume tells them from the checkpoint's; fill_defaults sets
    # the recipe's values afterwards, which the help says
    recipe = LANGUAGE_MODEL.defaults(lm_model())
    group = p.add_argument_group("model (a new one; --init-from brings its own)")
    group.add_argument("--arch", type=_arch_name, choices=families.names(), default=None,
                       help=f"the block, a model family's ("
                            f"{'; '.join(f'{f.name}: {f.display}' for f in families.FAMILIES.values())}"
                            f"); the same size and training (default {LM_ARCH}; "
                            f"{', '.join(f'{a} is {n}' for a, n in ARCH_ALIASES.items())}, its "
                            f"earlier name)")
    add_model_options(group, LANGUAGE_MODEL, LANGUAGE_MODEL.defaults(), {
        "layers": f"transformer blocks (default {recipe['layers']})",
        "d_model": f"default {recipe['d_model']}",
        "n_heads": f"default {recipe['n_heads']}",
        "d_ff": f"default 4 x --d-model for {', '.join(_MLP_ARCHS)}; 8/3 x --d-model, "
                f"rounded up to a multiple of 32, for the gated feed-forward of "
                f"{', '.join(_GATED_ARCHS)} (its three matrices then hold as many weights as "
                f"the MLP's two)",
        "n_kv_heads": "key/value heads, each shared by a group of query heads: a divisor of "
                      "--n-heads (default --n-heads; fewer is grouped-query attention)",
        "context": f"tokens the model sees at once (default {recipe['context']}; with "
                   f"--init-from the model's, at most {INIT_CONTEXT})",
        "dropout": f"in [0, 1) (default {recipe['dropout']}; with --init-from the model's)",
        "positions": f"where a token is: a learned vector per position (GPT-2's), the fixed "
                     f"sinusoidal table, or rotary (each attention turns queries and keys by "
                     f"their positions) (default {recipe['positions']})"},
        metavars={"context": "T"})
    lo = p.add_argument_group("LoRA (with --init-from: the model frozen, low-rank adapters "
                              "trained)")
    lo.add_argument("--lora-rank", type=positive_int, default=None, metavar="R",
                    help="train a rank-R update (alpha / R) B A of each targeted projection "
                         "instead of the whole model; checkpoints hold the adapters alone")
    lo.add_argument("--lora-alpha", type=positive_float, default=None, metavar="A",
                    help="the update's scale is A / R (default R: a scale of 1)")
    lo.add_argument("--lora-dropout", type=probability, default=None, metavar="P",
                    help="dropout on the adapters' input, in [0, 1) (PEFT's lora_dropout; "
                         "default 0)")
    lo.add_argument("--lora-targets", nargs="+", default=None, metavar="NAME", action=_Names,
                    help=f"the projections to adapt, separated by spaces or commas: PEFT's "
                         f"names for the model's family ("
                         f"{'; '.join(f'{f.display}: ' + ' '.join(f.peft_targets) for f in families.FAMILIES.values())}"
                         f") or npformer's (in_proj out_proj linear1 linear2, and generator "
                         f"where it is not tied to the embedding) (default PEFT's for the "
                         f"family: "
                         f"{'; '.join(f'{f.name} ' + ' '.join(f.default_targets) for f in families.FAMILIES.values())})")
    t = p.add_argument_group("training")
    t.add_argument("--max-steps", type=positive_int, default=None,
                   help=f"updates; the schedule ends there (default {LM_TRAIN['max_steps']})")
    t.add_argument("--time-budget", type=positive_float, default=None, metavar="MIN",
                   help="stop after MIN minutes of wall time (validations included), then "
                        "validate the final weights")
    t.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"windows per update (default {LM_TRAIN['batch_size']})")
    t.add_argument("--lr", type=positive_float, default=None,
                   help=f"peak learning rate (default {LM_TRAIN['lr']})")
    t.add_argument("--schedule", choices=SPANNING, default=None,
                   help=f"after the warm-up, the rate falls from --lr to --min-lr at --max-steps "
                        f"along a half cosine or a straight line (default {LM_TRAIN['schedule']})")
    t.add_argument("--min-lr", type=non_negative_float, default=None,
                   help=f"where the schedule ends (default {LM_TRAIN['min_lr']})")
    t.add_argument("--warmup-steps", type=non_negative_int, default=None,
                   help=f"default {LM_TRAIN['warmup_steps']}")
    t.add_argument("--weight-decay", type=non_negative_float, default=None,
                   help=f"AdamW's, on weight matrices and embeddings only (default "
                        f"{LM_TRAIN['weight_decay']})")
    t.add_argument("--clip-norm", type=non_negative_float, default=None,
                   help=f"clip the gradient norm (0: no clipping; default {LM_TRAIN['clip_norm']})")
    t.add_argument("--eval-every", dest="eval_every_steps", type=positive_int, default=None,
                   metavar="N", help=f"validate, sample and checkpoint every N updates (default "
                                     f"{LM_TRAIN['eval_every_steps']})")
    t.add_argument("--sample-tokens", type=non_negative_int, default=None, metavar="N",
                   help="tokens of the sample printed at each validation (default 200, at most "
                        "context - 1: a sample that fits the context; 0: none)")
    t.add_argument("--seed", type=non_negative_int, default=None)
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    add_parallel_args(p)
    p.set_defaults(run=run)


def _model_kwargs(args):
    """The GPT's keyword arguments from the model options given. --context reaches the model
    through the recipe's ``context`` (a new model's max_len; a model of --init-from keeps its
    own), so it is not one of them."""
    kwargs = LANGUAGE_MODEL.config_kwargs(args)
    kwargs.pop("max_len", None)
    return kwargs


def _train_kwargs(args):
    kwargs = {dest: getattr(args, dest) for dest in ("max_steps", "batch_size", "lr", "schedule",
                                                     "min_lr", "warmup_steps", "weight_decay",
                                                     "eval_every_steps")
              if getattr(args, dest) is not None}
    if args.clip_norm is not None:
        kwargs["clip_norm"] = args.clip_norm or None             # 0: no clipping
    refuse_min_lr_above_lr(args)
    if args.time_budget is not None:
        kwargs["time_budget"] = args.time_budget * 60.0
    return dict(kwargs, out_dir=args.out, quiet=args.quiet)


class _Names(argparse.Action):
    """--lora-targets: names separated by spaces or commas (``q_proj,v_proj``), kept as a list
    of the names (what a run records and a resume compares)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, split_names(values))


def _lora(args):
    """The LoRA settings of --lora-*, or None without --lora-rank (the others then refused);
    refusals of their values name the flags (``names``, which ``npformer.lora.apply`` takes)."""
    if args.lora_rank is None:
        given = [d for d in ("lora_alpha", "lora_dropout", "lora_targets")
                 if getattr(args, d) is not None]
        if given:
            raise ValueError(f"{flag(given[0])}: only with --lora-rank R")
        return None
    if args.init_from is None and not args.resume:
        raise ValueError("--lora-rank: adapts a trained model; give it with --init-from DIR")
    if args.lora_alpha is None:
        args.lora_alpha = float(args.lora_rank)
    if args.lora_dropout is None:
        args.lora_dropout = 0.0
    return {"rank": args.lora_rank, "alpha": args.lora_alpha, "dropout": args.lora_dropout,
            "targets": None if args.lora_targets is None else list(args.lora_targets),
            "names": LORA_FLAGS}


def _recorded(args):
    return {"made_by": LM_MADE_BY,
            "options": {dest: getattr(args, dest, None) for dest in LM_RECORDED}}


def fill_defaults(args):
    """Options left out take the recipe's values, so that every checkpoint records what its run
    used (a model of --init-from keeps its own shape, context and dropout unless given)."""
    if args.init_from is None:
        args.arch = args.arch or LM_ARCH
        for option, value in LANGUAGE_MODEL.defaults(lm_model(args.arch)).items():
            if getattr(args, option) is None and option != "d_ff":
                setattr(args, option, value)
        if args.d_ff is None:                    # the recipe's ratio, whatever --d-model is
            args.d_ff = lm_d_ff(args.arch, args.d_model)
    for dest in ("max_steps", "batch_size", "lr", "schedule", "min_lr", "warmup_steps",
                 "weight_decay", "clip_norm", "eval_every_steps"):
        if getattr(args, dest) is None:
            setattr(args, dest, LM_TRAIN[dest])
    args.seed = 0 if args.seed is None else args.seed


def check_model_size(args):
    """Refuse a new model that cannot train in this machine's memory, naming lm's options,
    before the text is read: the estimate of ``GPTConfig.memory_estimate`` for a one-token
    vocabulary (the text's is not known yet), a lower bound (as ``train``'s check)."""
    config = GPTConfig(vocab_size=1, **{**lm_model(args.arch),
                                        **LANGUAGE_MODEL.config_kwargs(args)})
    config.check_memory(training=True, memory=common.physical_memory(),
                        names=LANGUAGE_MODEL.names())


def build(args, saved=None):
    if args.init_from is not None and saved is None:
        given = [d for d in _SHAPE if getattr(args, d) is not None]
        if given:
            raise ValueError(f"{flag(given[0])}: the model of --init-from "
                             f"{args.init_from} brings its own shape; leave it out")
    fill_defaults(args)
    lora = _lora(args)
    if args.init_from is None and saved is None:
        check_model_size(args)
    data_path, note = text_file(args.data)
    if note:
        print(note, flush=True)
    args.data = str(data_path)                   # recorded as read: a resume finds it again
    refuse_inputs_in_run(args.out, [("--data", args.data)])
    if args.init_from is not None and saved is None:
        source = args.init_from if os.path.isdir(args.init_from) else os.path.dirname(
            os.path.abspath(args.init_from))
        if same_path(source, args.out):
            raise ValueError(f"--init-from {args.init_from}: is in --out {args.out}, whose run "
                             f"files the new run replaces; give another --out (nothing was "
                             f"written)")
    trainer, data = _lm_trainer(args, saved, lora)
    args.context = trainer.extra["options"]["context"] = trainer.task.context   # as used
    args.sample_tokens = trainer.extra["options"]["sample_tokens"] = trainer.task.sample_tokens
    if lora is not None and saved is None:       # as applied: the family's default if not given
        targets = list(trainer.model.lora.targets)
        args.lora_targets = trainer.extra["options"]["lora_targets"] = targets
    return _summary(args, trainer, data)


def _lm_trainer(args, saved, lora):
    return lm_trainer(args.data, _model_kwargs(args) if saved is None else {},
                      _train_kwargs(args), seed=args.seed, context=args.context,
                      init_from=None if saved is not None else args.init_from,
                      sample_tokens=args.sample_tokens, extra=_recorded(args),
                      saved=saved, arch=args.arch or LM_ARCH,
                      lora=None if saved is not None else lora)


def _summary(args, trainer, data):
    """The run's summary line (and its LoRA line); returns (trainer, data)."""
    model = trainer.model
    print(f"{args.data}: {len(data.train) + len(data.valid):,} tokens ({len(data.train):,} "
          f"training, {len(data.valid):,} validation), a vocabulary of {len(data.tokenizer):,}; "
          f"a {_block_name(model.config)} of {model.num_parameters():,} parameters "
          f"({model.config.n_layers} layers, "
          f"d_model {model.config.d_model}, context {trainer.task.context}), "
          f"{trainer.task.batches_per_epoch()} batches per epoch", flush=True)
    if getattr(model, "lora", None) is not None:
        s = model.lora
        print(f"LoRA rank {s.rank}, alpha {s.alpha:g}, dropout {s.dropout:g} on "
              f"{', '.join(s.targets)}: {model.flat_params.size:,} parameters train, the other "
              f"{model.num_parameters() - model.flat_params.size:,} are frozen", flush=True)
    return trainer, data


def _arch_name(text):
    """--arch's value by today's name (``ARCH_ALIASES``: an earlier name is read as its own)."""
    return ARCH_ALIASES.get(text, text)


def _block_name(config):
    """How the summary line names a model: by the family its configuration records."""
    family = getattr(config, "family", None)
    if family in families.FAMILIES:
        return f"GPT with {families.get(family).display}'s block"
    return f"{config.arch} model"


def _tokenizer_bytes(data):
    """The tokenizer.json a fine-tuned GPT-2 was cut with (None for characters, which the
    checkpoints hold): read before the run folder is prepared, written into it afterwards
    (``npformer sample --checkpoint`` reads it there)."""
    source = getattr(data.tokenizer, "path", None)
    if source is None:
        return None
    with open(source, "rb") as f:
        return f.read()


def recorded_lm_options(meta):
    """The options of ``LM_RECORDED`` a checkpoint of ``npformer lm`` recorded. A run recorded
    before --schedule existed trained with the schedule its training config names (the
    cosine), one recorded before a model option (--positions) with its model's value; a resume
    keeps them, or refuses others, like any recorded option."""
    extra = meta.get("extra") if isinstance(meta.get("extra"), dict) else {}
    options = extra.get("options") if isinstance(extra.get("options"), dict) else {}
    recorded = {k: options[k] for k in LM_RECORDED if k in options}
    if "schedule" not in recorded:
        config = (meta.get("training") or {}).get("config") or {}
        recorded["schedule"] = config.get("schedule", "cosine")
    if isinstance(meta.get("config"), dict):
        model = LANGUAGE_MODEL.from_config(GPTConfig.from_dict(meta["config"]).to_dict())
        for option, value in model.items():
            if option != "context":              # the task's, recorded by every run
                recorded.setdefault(option, value)
        if recorded.get("init_from") is None:   # a new model: the block its run recorded
            recorded["arch"] = migrate_arch(recorded)
    for option in ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets"):
        recorded.setdefault(option, None)        # a run from before LoRA trained no adapters
    return recorded


def run(args):
    collective = join(args)                      # one process, or this rank of an MPI job
    saved = None
    if args.resume:
        from ..training.checkpointing import load_model_checkpoint
        saved = load_model_checkpoint(args.resume)
        extra = saved.meta.get("extra") if isinstance(saved.meta.get("extra"), dict) else {}
        if extra.get("made_by") != LM_MADE_BY:
            raise ValueError(f"--resume {args.resume}: was not written by npformer lm (resume a "
                             f"translation run with npformer train --resume)")
        apply_resume_policy(args, saved.meta, args.resume, recorded=recorded_lm_options(saved.meta),
                            may_change=LM_MAY_CHANGE)
    trainer, data = build(args, saved)
    trainer.set_collective(collective)
    root = collective.is_root                    # the one process that writes the run folder
    folder = root and plan_run_folder(args.out, "lm", overwrite=args.overwrite, resume=args.resume)
    if saved is not None:
        trainer.resume(saved)
    trainer.check_work_left()
    tokenizer = _tokenizer_bytes(data)
    if root:
        folder.prepare()
    if tokenizer is not None and root:
        os.makedirs(args.out, exist_ok=True)
        write_file_atomic(Path(os.path.join(args.out, "tokenizer.json")),
                          lambda f: f.write(tokenizer))

    def on_eval(rec):
        if not args.quiet:
            print(f"step {rec['step']:5d}  {rec['seconds'] / 60:6.1f} min  val loss "
                  f"{rec['val_loss']:.4f}", flush=True)
            for sample in rec.get("examples") or []:
                print("  " + sample.replace("\n", "\n  "), flush=True)

    summary = trainer.fit(on_eval=on_eval)
    best = summary.get("best_val_loss")
    print(f"done: {summary['step']} steps in {summary['seconds'] / 60:.1f} min, stopped by "
          f"{summary['stop_reason']}; best val loss "
          f"{'n/a' if best is None else f'{best:.4f}'} -> {os.path.join(args.out, 'best')}")
    return 0

