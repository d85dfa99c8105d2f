"""Run folders: what ``npformer train``, ``npformer lm`` and ``npformer toy`` may do with the
folder ``--out`` names, and what a resumed run may change. One place for the policy they follow.

A run folder holds one run's files: ``best``, ``last``, ``averaged`` and ``step_<N>``
checkpoints (``.npz`` with a readable ``.json`` beside each), ``metrics.jsonl`` and, for a
fine-tuned GPT-2, the ``tokenizer.json`` it was trained with. Nothing else in the folder belongs
to the run, and nothing else is ever touched.

* ``npformer train --out DIR`` (and ``npformer lm``) refuses a DIR that holds a run, unless
  - ``--resume CKPT`` names a checkpoint of that very run (DIR is CKPT's folder): the run goes on
    in its own folder; or
  - ``--overwrite`` is given: exactly that run's files are removed (after every check of the new
    run has passed, before its first file is written).
* ``npformer toy --out DIR`` (default ``runs/toy``) is a demo that must work every time: it
  starts afresh, replacing a previous toy run in DIR (and saying so), but refuses a DIR that holds
  any other run unless ``--overwrite``. Toy runs are told apart by the mark ``made_by: "npformer
  toy"`` in their checkpoints' metadata ``extra`` and in the first record of their metrics.jsonl.
* When a run starts or resumes in DIR, the temporary files of checkpoint saves that were killed
  half way (``.<name>.npz.<hex>.tmp``, ``.<name>.json.<hex>.tmp``, see ``npformer.checkpoint``)
  are removed from DIR. Only one process may write a run folder at a time: a second writer's
  temporary files would be taken for stale ones.
* No command's output names one of its inputs: a data file inside DIR named like a run file is
  refused, as is a ``--metrics-json`` that would replace a run file.

Resuming (``npformer train --resume CKPT``): the resumed run is the checkpoint's run, continued.
Every option left out takes the value the checkpoint recorded (its metadata ``extra.options``;
older checkpoints: their training config, model config and text settings). An option given with
a value other than the recorded one is allowed only if it is in ``RESUME_MAY_CHANGE``: the options
that decide how long training goes on (``--max-steps``, ``--epochs``, ``--time-budget``,
``--patience``, ``--target``), when it validates and what it keeps and reports
(``--eval-every``, ``--keep-last``, ``--average-last``, ``--quiet``), and where the same data
files now lie (``--data-dir``, ``--src-file``, ``--tgt-file``, ``--valid-src``, ``--valid-tgt``;
the checkpoint's CRC of the token ids still holds the pairs to be the same). None of these changes the
numerics of a step: the model, the data and its vocabulary, the batches, the optimizer, the
learning-rate schedule, the loss, the dropout and the seeds stay the checkpoint's, so a resumed
run takes exactly the steps the uninterrupted run would have taken. (The one coupling: the cosine
and linear schedules decay over ``--max-steps`` or ``--epochs``, so lengthening such a run
stretches the rest of its decay, as if the run had been planned that long.) Every other
difference is refused
in one error that lists each offending option with the checkpoint's value and the given one.
A run that has nothing left to train (already at ``--max-steps``, ...) is refused by the Trainer
before anything is written.
"""
import math
import os
import re
import shutil

from ..dropout_rates import inner_dropout_rates
from ..training.multi30k import checkpoint_preprocess
from .common import path_argument, refuse_output_under_a_file
from .model_options import TRANSLATION_MODEL

TOY_MADE_BY = "npformer toy"
TRAIN_MADE_BY = "npformer train"

_RUN_FILE = re.compile(r"(?:(?:best|last|averaged|step_\d+)\.(?:npz|json)|metrics\.jsonl|"
                       r"tokenizer\.json)")
_STALE_TEMP = re.compile(r"\..+\.(?:npz|json)\.[0-9a-f]+\.tmp")
_CHECKPOINT = re.compile(r"(?:best|last|averaged|step_\d+)\.npz")

# the options of ``npformer train`` a resume may set to another value than the checkpoint's
RESUME_MAY_CHANGE = ("max_steps", "epochs", "time_budget", "patience", "target",
                     "eval_every_steps", "keep_last", "average_last", "quiet",
                     "data_dir", "src_file", "tgt_file", "valid_src", "valid_tgt")
# the options of ``npformer train`` a checkpoint records (all but --out, --resume, --overwrite
# and --quiet, which are about this invocation, not the run)
RECORDED_OPTIONS = ("dataset", "src_file", "tgt_file", "valid_src", "valid_tgt", "min_freq",
                    "data_dir", "src", "tgt", "cased", "subword", "subset", "valid_subset",
                    "preset", "preprocess",
                    "max_tokens", "bucket_size", "accum_steps", "eval_every_steps", "time_budget",
                    "keep_last", "average_last", *TRANSLATION_MODEL.options,
                    "epochs", "max_steps", "batch_size", "lr", "warmup_steps", "schedule", "min_lr",
                    "label_smoothing", "weight_decay", "clip_norm", "patience", "stop_metric",
                    "target", "seed")
_FLAGS = {"eval_every_steps": "--eval-every"}


def flag(dest):
    """The command-line spelling of an option's destination (``layers`` -> ``--layers``)."""
    return _FLAGS.get(dest, "--" + dest.replace("_", "-"))


def add_run_folder_options(p, removes):
    """A training command's --out (its run folder) and --overwrite, whose help says what it
    ``removes``."""
    p.add_argument("--out", type=path_argument, required=True,
                   help="run directory (checkpoints, metrics.jsonl); a folder that already holds "
                        "a run is refused unless --resume continues it or --overwrite replaces it")
    p.add_argument("--overwrite", action="store_true", help=removes)


# ----------------------------------------------------------------------------------------------
# the files of a run

def run_files(folder):
    """Names of the run files in ``folder`` (sorted; none if it does not exist)."""
    if not os.path.isdir(folder):
        return []
    return sorted(name for name in os.listdir(folder) if _RUN_FILE.fullmatch(name))


def is_run_file(path):
    """Whether ``path`` is named like one of the files a run writes into its folder."""
    return bool(_RUN_FILE.fullmatch(os.path.basename(os.fspath(path))))


def refuse_output_named_like_a_run_file(option, path):
    """A command's text output (``--metrics-json``, ``eval --out``) may never carry the name of a
    run's file: written into a run folder it would replace that run's checkpoint or log."""
    if is_run_file(path):
        raise ValueError(f"{option} {path}: is named like a run's own file (best/last/averaged/"
                         f"step_<N> .npz/.json, metrics.jsonl, tokenizer.json), which it could replace; choose "
                         f"another name (nothing was written)")


def remove_stale_temps(folder, name=None):
    """Remove what killed saves left in ``folder``; returns the names removed. With no ``name``
    (a run folder, which has one writer): the temporary files of checkpoint saves,
    ``.<name>.npz.<hex>.tmp`` / ``.<name>.json.<hex>.tmp``. With ``name`` (the one output of
    ``npformer average`` or ``export``): only that output's, its checkpoint's temporary files
    and the folders of a killed export, ``.<name>.<hex>.partial`` (an export being written;
    ``.tmp`` where a LoRA export made it before npformer.checkpoint.write_folder) and
    ``.<name>.<hex>.old`` (an earlier export being replaced; removed only once ``name`` exists,
    else it may hold the only copy of that export)."""
    if not os.path.isdir(folder):
        return []
    if name is None:
        files, folders = _STALE_TEMP, None
    else:
        files = re.compile(rf"\.{re.escape(name)}\.(?:npz|json)\.[0-9a-f]+\.tmp")
        kept = "partial|tmp|old" if os.path.exists(os.path.join(folder, name)) else "partial|tmp"
        folders = re.compile(rf"\.{re.escape(name)}\.[0-9a-z_]+\.(?:{kept})")
    removed = []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if files.fullmatch(entry) and os.path.isfile(path):
            os.remove(path)
        elif folders is not None and folders.fullmatch(entry) and os.path.isdir(path) \
                and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            continue
        removed.append(entry)
    return removed


def _checkpoint_made_by(path):
    from ..checkpoint import load_checkpoint
    try:
        _, meta = load_checkpoint(path)
    except ValueError:                           # unreadable: not a toy run we can vouch for
        return None
    extra = meta.get("extra")
    return extra.get("made_by") if isinstance(extra, dict) else None


def _log_made_by(path):
    import json
    try:
        with open(path, encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    return first.get("made_by") if isinstance(first, dict) and first.get("event") == "start" else None


def is_toy_run(folder):
    """Whether every checkpoint and the metrics log in ``folder`` carry the mark of ``npformer
    toy`` (and there is at least one of them)."""
    names = run_files(folder)
    checkpoints = [n for n in names if _CHECKPOINT.fullmatch(n)]
    marked = [os.path.join(folder, n[:-4]) for n in checkpoints]
    if "metrics.jsonl" in names:
        if _log_made_by(os.path.join(folder, "metrics.jsonl")) != TOY_MADE_BY:
            return False
    elif not checkpoints:
        return False
    return all(_checkpoint_made_by(path) == TOY_MADE_BY for path in marked)


def same_path(a, b):
    """Whether two paths name one file or folder (symlinks and ``..`` resolved)."""
    return os.path.realpath(a) == os.path.realpath(b)


class RunFolder:
    """The plan for ``--out``: checked by ``plan_run_folder`` before any work, carried out by
    ``prepare()`` just before the first file of the run is written."""

    def __init__(self, folder, remove=(), note=None):
        self.folder, self.remove, self.note = folder, list(remove), note

    def prepare(self):
        """Remove the replaced run's files and stale temporary files; print what was done."""
        for name in self.remove:
            path = os.path.join(self.folder, name)
            if os.path.exists(path):
                os.remove(path)
        if self.note:
            print(self.note, flush=True)
        remove_stale_temps(self.folder)


def plan_run_folder(out, command, overwrite=False, resume=None):
    """Check ``--out`` against the policy of this module; a ``RunFolder`` to ``prepare()``.

    ``command`` is "train", "lm" or "toy"; ``resume`` the checkpoint a train or lm run resumes,
    if any.
    Raises ValueError naming ``--out`` (or ``--overwrite``) when the folder may not be used.
    """
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out}: is a file; expected a run folder (nothing was written)")
    refuse_output_under_a_file("--out", out)     # (cli.main checks every command's --out too)
    files = run_files(out)
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    if resume is not None and same_path(os.path.dirname(os.path.abspath(resume)), out):
        if overwrite:
            raise ValueError(f"--overwrite: would remove the run in {out} that --resume {resume} "
                             f"continues; leave --overwrite out to resume it in its own folder")
        _check_resuming_the_newest(resume, out)
        return RunFolder(out)                    # the run goes on in its own folder
    if not files:
        return RunFolder(out)
    if overwrite:
        return RunFolder(out, files, f"--overwrite: removed the previous run in {out} ({shown})")
    if command == "toy":
        if is_toy_run(out):
            return RunFolder(out, files, f"replacing the previous toy run in {out}")
        raise ValueError(f"--out {out}: holds a run that npformer toy did not write ({shown}); "
                         f"choose another --out, or give --overwrite to replace it (nothing was "
                         f"written)")
    last = os.path.join(out, "last")
    resume = (f"give --resume {last} to continue it, " if os.path.exists(last + ".npz")
              else "")                           # a run that diverged may have no checkpoint
    raise ValueError(f"--out {out}: already holds a run ({shown}); {resume}give --overwrite to "
                     f"replace it, or another --out (nothing was written)")


def _check_resuming_the_newest(resume, out):
    """Resuming an older checkpoint of a run in its own folder would write over its newer
    ``last``: refuse that (resume ``last``, or write the continuation elsewhere)."""
    from ..checkpoint import checkpoint_paths, load_checkpoint
    last = os.path.join(out, "last")
    if not os.path.exists(last + ".npz") or same_path(checkpoint_paths(resume)[0], last + ".npz"):
        return
    try:
        step = load_checkpoint(last)[1]["training"]["step"]
        resumed = load_checkpoint(resume)[1]["training"]["step"]
    except (ValueError, KeyError, TypeError):    # the resume itself reports a broken checkpoint
        return
    if isinstance(step, int) and isinstance(resumed, int) and step > resumed:
        raise ValueError(f"--resume {resume}: is at step {resumed}, but {last} of the same run is "
                         f"at step {step} and resuming in --out {out} would replace it; resume "
                         f"{last}, or give another --out (nothing was written)")


def refuse_inputs_in_run(out, inputs):
    """No input file may be one of the files the run writes into ``out``: ``inputs`` are
    (option, path) pairs; ValueError naming the first that is."""
    for option, path in inputs:
        if path and is_run_file(path) and same_path(os.path.dirname(os.path.abspath(path)), out):
            raise ValueError(f"{option} {path}: is a file of the run that --out {out} writes; "
                             f"give the input from another place (nothing was written)")


# ----------------------------------------------------------------------------------------------
# what a resume may change

def recorded_options(meta):
    """The train options a checkpoint's run used: its ``extra.options``, or for checkpoints that
    predate them, what its training config, model config and text settings say."""
    extra = meta.get("extra") if isinstance(meta.get("extra"), dict) else {}
    if isinstance(extra.get("options"), dict):
        out = {k: v for k, v in extra["options"].items() if k in RECORDED_OPTIONS}
        if out.get("dataset") == "multi30k" and "preprocess" not in out:  # runs that predate it
            out["preprocess"] = checkpoint_preprocess(extra)
        return _predating(out)
    training = meta.get("training") if isinstance(meta.get("training"), dict) else {}
    config = training.get("config") if isinstance(training.get("config"), dict) else {}
    model = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    out = {k: config[k] for k in ("epochs", "max_steps", "batch_size", "lr", "warmup_steps",
                                  "schedule", "min_lr", "label_smoothing", "weight_decay",
                                  "patience", "stop_metric", "target", "seed", "max_tokens",
                                  "accum_steps", "eval_every_steps", "keep_last", "bucket_size")
           if k in config}
    if "clip_norm" in config:
        out["clip_norm"] = config["clip_norm"] or 0.0          # the CLI's 0: no clipping
    if isinstance(config.get("time_budget"), (int, float)):
        out["time_budget"] = config["time_budget"] / 60.0      # seconds -> minutes
    out.update(TRANSLATION_MODEL.from_config(model))
    if extra.get("dataset") == "multi30k":
        out.update(dataset="multi30k", src=extra.get("src_lang"), tgt=extra.get("tgt_lang"),
                   cased=not extra.get("lowercase", True), subword=extra.get("subword_pieces"),
                   preprocess=checkpoint_preprocess(extra))
    elif extra.get("made_by") == TOY_MADE_BY:
        out["dataset"] = "toy"
    return _predating(out)


def _predating(options):
    """Options a run recorded before they existed, as it used them: the attention and activation
    dropout rates where unrecorded or unset are --dropout's; the bucket size the sampler had then,
    1000 (a TrainConfig's None is the CLI's "all"); no weight decay, which --weight-decay
    came after."""
    options.setdefault("weight_decay", 0.0)
    bucket = options.get("bucket_size", 1000)
    options["bucket_size"] = "all" if bucket is None else bucket
    if "dropout" in options:
        options["attention_dropout"], options["activation_dropout"] = inner_dropout_rates(
            options["dropout"], options.get("attention_dropout"), options.get("activation_dropout"))
    return options


def _equal(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a in (None, False) and b in (None, False))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _refuse_an_optimizer_train_cannot_continue(meta, checkpoint):
    """``--weight-decay`` spells one optimizer per value: plain Adam for 0, else AdamW decaying
    the matrices. A run made through the library with another (Adam's L2 decay, AdamW on every
    parameter) would go on under a different one: refused, naming it."""
    from .common import weight_decay_kwargs
    training = meta.get("training") if isinstance(meta.get("training"), dict) else {}
    config = training.get("config") if isinstance(training.get("config"), dict) else {}
    decay = config.get("weight_decay") or 0.0
    if not decay:                                  # no decay: Adam and AdamW are the same update
        return
    saved = {"optimizer": config.get("optimizer", "adam"), "weight_decay": decay,
             "decay": config.get("decay", "all")}
    if saved != weight_decay_kwargs(decay):
        raise ValueError(f"--resume {checkpoint}: its run used {saved['optimizer']} with "
                         f"weight_decay {decay} on {saved['decay']} parameters, which npformer "
                         f"train cannot continue (--weight-decay is AdamW on the matrices); "
                         f"resume it through the library's Trainer (nothing was written)")


def apply_resume_policy(args, meta, checkpoint, recorded=None, may_change=RESUME_MAY_CHANGE):
    """Options not given take the checkpoint's recorded values; options given with another value
    must be in ``may_change``, else one ValueError lists each (checkpoint's vs given).
    ``recorded``: the options another command's checkpoint recorded, as {name: value} (default:
    ``npformer train``'s, read by ``recorded_options``)."""
    if recorded is None:
        _refuse_an_optimizer_train_cannot_continue(meta, checkpoint)
        recorded = recorded_options(meta)
    refused = []
    for dest, saved in recorded.items():
        given = getattr(args, dest, None)
        if given is None:
            setattr(args, dest, saved)
        elif dest not in may_change and not _equal(given, saved):
            refused.append(dest)
    if not refused:
        return
    parts = [f"{flag(d)} {_show(recorded[d])} in the checkpoint, {_show(getattr(args, d))} given"
             for d in refused]
    swap = ""
    if {"src", "tgt"} <= set(refused) and (recorded["src"], recorded["tgt"]) == (args.tgt, args.src):
        swap = (f" (the checkpoint translates {recorded['src']}->{recorded['tgt']}; it cannot go on "
                f"as {args.src}->{args.tgt})")
    raise ValueError(f"--resume {checkpoint}: a resume cannot change {', '.join(flag(d) for d in refused)}"
                     f"{swap}: {'; '.join(parts)}. Leave them out to keep the checkpoint's values, "
                     f"or start a new run with another --out. A resume may change only "
                     f"{', '.join(flag(d) for d in may_change)}")


def _show(value):
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
