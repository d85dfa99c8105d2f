"""Helpers shared by the CLI commands: checkpoint paths, input lines, model-size options, the
``type=`` functions that check numeric options as they are parsed, and the checks that keep a
command's outputs off its inputs."""
import argparse
import copy
import os

from ..checkpoint import CheckpointError, checkpoint_paths
from ..configs import TransformerConfig, available_memory
from ..data.textfile import write_text_atomic
from ..decoding.search import LENGTH_PENALTY
from ..training.trainer import SCHEDULES, SPANNING
from ..validation import check_int, check_real, describe_int, describe_real
from .model_options import TRANSLATION_MODEL


# ----------------------------------------------------------------------------------------------
# argparse type= functions: a bad value ends in "argument --layers: expected a positive integer,
# got '0'" (argparse adds the option's name), before any work starts. The rules and their wording
# are npformer.validation's check_int / check_real, as for the library's own arguments.

def _integer(text, minimum):
    """``text`` parsed as an int that ``check_int(minimum=...)`` accepts."""
    try:
        return check_int("", int(text), minimum)     # int(): "abc", "0.5", "1e3", "", 5000 digits
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {describe_int(minimum)}, got {text!r}") from None


def _real(text, **bounds):
    """``text`` parsed as a float that ``check_real(**bounds)`` accepts."""
    try:
        return check_real("", float(text), **bounds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {describe_real(**bounds)}, got {text!r}") from None


def positive_int(text):
    """An integer >= 1."""
    return _integer(text, 1)


def bucket_size(text):
    """``all`` or an integer >= 1 (``--bucket-size``)."""
    if text == "all":
        return text
    try:
        return _integer(text, 1)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'all' or a positive integer, got {text!r}") from None


def non_negative_int(text):
    """An integer >= 0."""
    return _integer(text, 0)


def finite_float(text):
    """Any finite number (not nan, inf or -inf)."""
    return _real(text)


def positive_float(text):
    """A finite number > 0."""
    return _real(text, minimum=0, min_open=True)


def non_negative_float(text):
    """A finite number >= 0."""
    return _real(text, minimum=0)


def probability(text):
    """A number in [0, 1) (dropout, label smoothing)."""
    return _real(text, minimum=0, maximum=1, max_open=True)


def real_in(minimum, maximum, min_open=False):
    """The type= function of a finite number in [minimum, maximum] (``min_open``: > minimum)."""
    return lambda text: _real(text, minimum=minimum, maximum=maximum, min_open=min_open)


def int_in(minimum, maximum):
    """The type= function of an integer in [minimum, maximum]."""
    def parse(text):
        try:
            value = _integer(text, minimum)
        except argparse.ArgumentTypeError:
            value = None
        if value is None or value > maximum:
            raise argparse.ArgumentTypeError(f"expected an integer in [{minimum}, {maximum}], "
                                             f"got {text!r}")
        return value
    return parse


def path_argument(text):
    """A file or folder path, not empty: ``--adapter ''`` (an unset shell variable) would
    otherwise stand for the current folder, or fail later with an error that names no option."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty one ('')")
    return text


def resolve_checkpoint(path):
    """A checkpoint path as given ("run/best", "run/best.npz") or a run directory (-> DIR/best)."""
    if os.path.isdir(path):
        candidate = os.path.join(path, "best")
        if not os.path.exists(candidate + ".npz"):
            if os.path.exists(os.path.join(path, "model.bin")):
                raise CheckpointError(f"--checkpoint {path}: a CTranslate2 model folder; run it "
                                      f"with --engine ctranslate2")
            raise CheckpointError(f"--checkpoint {path}: a directory without best.npz "
                                  f"(expected a run directory written by npformer toy/train/lm --out)")
        return candidate
    return path


ENGINES = ("npformer", "ctranslate2")


def add_engine_arg(p):
    """--engine of translate and eval."""
    p.add_argument("--engine", choices=ENGINES, default="npformer",
                   help="decode with npformer (default) or with CTranslate2 (extra ctranslate2; "
                        "--checkpoint is then a folder written by `npformer export --format "
                        "ctranslate2`)")


def load_translation_model(args):
    """The model that --checkpoint names for --engine: an npformer checkpoint
    (``LoadedCheckpoint``) or a CTranslate2 export (``npformer.ct2.ExportedModel``)."""
    if args.engine == "ctranslate2":
        from ..ct2 import load_exported
        return load_exported(args.checkpoint)
    from ..training.checkpointing import load_model_checkpoint
    return load_model_checkpoint(resolve_checkpoint(args.checkpoint))


def checkpoint_files(args):
    """(option, path) of the files --checkpoint stands for under --engine (what an output must
    not overwrite)."""
    if args.engine == "ctranslate2" and os.path.isdir(args.checkpoint):
        return [("--checkpoint", os.path.join(args.checkpoint, name))
                for name in sorted(os.listdir(args.checkpoint))]     # every file of the model
    npz, meta = checkpoint_paths(resolve_checkpoint(args.checkpoint))
    return [("--checkpoint", str(npz)), ("--checkpoint", str(meta))]


def beam_length_penalty(args):
    """``--length-penalty`` of translate/eval: refused without ``--beam`` (it would be ignored);
    beam search's own default when unset."""
    if args.beam is None and args.length_penalty is not None:
        raise ValueError("--length-penalty: only used with --beam N (it would be ignored)")
    return LENGTH_PENALTY if args.length_penalty is None else args.length_penalty


def command_parser(sub, name, doc, help, **options):
    """The parser of the command ``name`` in ``sub`` (``options``: argparse's, e.g. a
    ``formatter_class``): ``help`` is its line in ``npformer --help``; its own ``--help`` is
    described by ``doc``, the command module's docstring, read up to its first blank line, less
    its leading "``npformer NAME``: " and its double backquotes. The docstring says once what
    the command does, for the reader of the code and of the help alike."""
    about = doc.split("\n\n")[0].split(": ", 1)[1].replace("``", "")
    return sub.add_parser(name, help=help, description=about[0].upper() + about[1:], **options)


class NoneDefaultFormatter(argparse.HelpFormatter):
    """Help text: an option whose default is None shows ``none_text`` instead of "None"."""

    none_text = "none"

    def _expand_help(self, action):
        if action.default is None and "%(default)" in (action.help or ""):
            action = copy.copy(action)
            action.default = self.none_text
        return super()._expand_help(action)


class RecipeDefaultsFormatter(NoneDefaultFormatter):
    """For ``train``: an option left unset takes the chosen dataset's recipe."""

    none_text = "from the dataset's recipe"


# a model option's values by its field's type: sizes are positive integers, rates in [0, 1)
_OPTION_TYPES = {int: positive_int, float: probability}


def add_model_options(group, model, defaults, helps, metavars=None):
    """One argument per option of ``model`` (a ``model_options.ModelOptions``), in its order:
    the option's flag, the type of its field's values (or its choices), ``defaults[option]``,
    ``helps.get(option)`` and ``metavars.get(option)``."""
    for option in model.options:
        values = ({"choices": model.choices[option]} if option in model.choices
                  else {"type": _OPTION_TYPES[model.kind(option)]})
        group.add_argument(model.flag(option), default=defaults[option], help=helps.get(option),
                           metavar=(metavars or {}).get(option), **values)


def add_model_args(p, recipe=None):
    """The model options of toy, train and calibrate, defaulting to ``recipe``'s values (a dict of
    ``TransformerConfig`` fields; the dataclass's where it has none); without a recipe, None
    (train: the dataset's recipe fills them once it is known)."""
    defaults = TRANSLATION_MODEL.defaults(recipe)
    inner = {option: f"dropout probability on {where} (default "
                     f"{'--dropout' if defaults[option] is None else defaults[option]})"
             for option, where in (("attention_dropout", "the attention weights"),
                                   ("activation_dropout", "the feed-forward activations"))}
    add_model_options(p.add_argument_group("model"), TRANSLATION_MODEL, defaults, {
        "layers": "encoder and decoder layers each (default %(default)s)",
        "dropout": "dropout probability in [0, 1) on the embeddings and each sublayer's output "
                   "(default %(default)s)",
        **inner,
        "max_len": "longest sentence in tokens (default %(default)s)"})


def physical_memory():
    """Bytes of memory this process may use (``npformer.configs.available_memory``: the
    machine's, or less under a container's or ``ulimit -v``'s limit), or None where nothing
    says."""
    return available_memory()


def check_model_size(args, memory=None):
    """Refuse model options that cannot fit in memory before anything is allocated: a model of
    ``--layers 10**9`` would otherwise spend minutes building layers before running out.

    The estimate is the configuration's own (``TransformerConfig.memory_estimate`` of a model
    in training: weights, gradients and Adam's two moments, and the position table) for
    vocabularies of one token, the data's being unknown yet: a lower bound, so a model it
    refuses could not have trained here anyway."""
    memory = physical_memory() if memory is None else memory
    config = TransformerConfig(src_vocab_size=1, tgt_vocab_size=1,
                               **TRANSLATION_MODEL.config_kwargs(args))
    config.check_memory(training=True, memory=memory, names=TRANSLATION_MODEL.names())


def model_kwargs(args):
    """The Transformer's keyword arguments from the model options (checked to fit in memory)."""
    check_model_size(args)
    return TRANSLATION_MODEL.config_kwargs(args)


def add_train_args(p, defaults):
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=positive_int, default=defaults["epochs"])
    g.add_argument("--max-steps", type=positive_int, default=None)
    g.add_argument("--batch-size", type=positive_int, default=defaults["batch_size"])
    g.add_argument("--lr", type=positive_float, default=defaults["lr"], help="peak learning rate")
    g.add_argument("--warmup-steps", "--warmup", type=non_negative_int,
                   default=defaults["warmup_steps"])
    g.add_argument("--schedule", default=defaults["schedule"],
                   choices=SCHEDULES,
                   help="learning-rate schedule; cosine and linear fall from --lr to --min-lr "
                        "over the run; plateau: divide by 10 after 10 validations without a "
                        "better validation loss, as PyTorch's ReduceLROnPlateau")
    g.add_argument("--min-lr", type=non_negative_float, default=defaults.get("min_lr", 0.0),
                   help="final learning rate of the cosine and linear schedules, floor of the "
                        "plateau one")
    g.add_argument("--label-smoothing", type=probability, default=defaults["label_smoothing"],
                   help="in [0, 1) (default %(default)s)")
    g.add_argument("--weight-decay", type=non_negative_float,
                   default=defaults.get("weight_decay", 0.0),
                   help="decoupled weight decay (AdamW, as torch.optim.AdamW) on the weight "
                        "matrices and embeddings, not on biases or norms; 0: plain Adam "
                        "(default %(default)s)")
    g.add_argument("--clip-norm", type=non_negative_float, default=defaults["clip_norm"],
                   help="clip the gradient norm to this (0: no clipping; default %(default)s)")
    g.add_argument("--patience", type=positive_int, default=None,
                   help="early stopping after N validations without improvement")
    g.add_argument("--stop-metric", default=defaults.get("stop_metric", "exact_match"),
                   choices=["exact_match", "bleu", "loss"],
                   help="validation metric for the best checkpoint and early stopping "
                        "(default %(default)s)")
    g.add_argument("--target", type=finite_float, default=defaults.get("target"),
                   help="stop once the validation --stop-metric reaches this (default %(default)s)")
    g.add_argument("--seed", type=non_negative_int, default=0)
    g.add_argument("--quiet", action="store_true", help="no progress bars")


def refuse_min_lr_above_lr(args):
    """A schedule that falls from --lr to --min-lr (cosine, linear) cannot end above its peak:
    refused naming both options, before the TrainConfig would refuse it by its field names."""
    if args.schedule in SPANNING and args.min_lr is not None \
            and args.lr is not None and args.min_lr > args.lr:
        raise ValueError(f"--min-lr {args.min_lr}: expected at most --lr {args.lr} (the "
                         f"{args.schedule} schedule falls from --lr to --min-lr)")


def train_kwargs(args):
    """The TrainConfig keyword arguments from the training options; options that contradict each
    other are refused here, naming both, before any data is read."""
    refuse_min_lr_above_lr(args)
    return dict(epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size,
                lr=args.lr, warmup_steps=args.warmup_steps, schedule=args.schedule, min_lr=args.min_lr,
                label_smoothing=args.label_smoothing, **weight_decay_kwargs(args.weight_decay),
                clip_norm=args.clip_norm if args.clip_norm else None,      # 0: no clipping
                patience=args.patience, stop_metric=args.stop_metric, target=args.target,
                seed=args.seed, quiet=args.quiet)


def weight_decay_kwargs(weight_decay):
    """The TrainConfig fields of ``--weight-decay``: AdamW's decoupled decay on the weight
    matrices and embeddings (as ``npformer lm``), or plain Adam for 0 (or None: not given)."""
    if not weight_decay:
        return {"optimizer": "adam", "weight_decay": 0.0}
    return {"optimizer": "adamw", "weight_decay": weight_decay, "decay": "matrices"}


def write_json(path, obj):
    """Write ``obj`` as JSON, all or nothing (an existing file survives a failed write)."""
    import json
    write_text_atomic(path, json.dumps(obj, indent=1, ensure_ascii=False) + "\n")


def write_lines(path, lines):
    """Write one line per string, all or nothing (an existing file survives a failed write)."""
    write_text_atomic(path, "".join(line + "\n" for line in lines))


def _identity(path, checkpoint):
    """What a path names on disk: the real path of the file (a checkpoint's npz for checkpoints)."""
    if checkpoint:
        path = checkpoint_paths(path)[0]
    return os.path.realpath(path)


def refuse_output_over_inputs(out_option, out_path, inputs, checkpoint=False):
    """Raise ValueError if the output ``out_path`` names one of ``inputs`` ((option, path) pairs).

    ``checkpoint=True`` compares checkpoints by the npz they name ("run/last", "run/last.npz" and
    "run/last.json" are one checkpoint). No command may write over what it reads.
    """
    target = _identity(out_path, checkpoint)
    for option, path in inputs:
        if path is not None and _identity(path, checkpoint) == target:
            raise ValueError(f"{out_option} {out_path}: names the input {option} {path}; write the "
                             f"output to another path (nothing was written)")


def refuse_output_under_a_file(option, path):
    """The nearest folder that exists above the output ``path`` (a file or a folder to write);
    ValueError naming ``option`` where a file stands in its way (``--out notes.txt/run``), which
    creating its folders would report as "File exists" or "Not a directory"."""
    probe = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(probe):             # the nearest existing ancestor must be a folder
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ValueError(f"{option} {path}: cannot be written: {probe} is a file, not a folder")
    return probe


def check_writable(option, path):
    """Fail now, not after an hour of work, if ``path`` cannot be written: its folder must exist
    or be creatable, and the path must not be a folder."""
    if os.path.isdir(path):
        raise ValueError(f"{option} {path}: expected a file path, got a folder")
    probe = refuse_output_under_a_file(option, path)
    if not os.access(probe, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{option} {path}: cannot be written (permission denied)")


def add_text_args(p):
    """--preprocess and --cased/--lowercase of ``translate`` and ``eval``: the input's text
    settings, by default the Multi30k checkpoint's own."""
    from ..training.multi30k import PREPROCESS

    p.add_argument("--preprocess", choices=list(PREPROCESS), default=None,
                   help="how raw text becomes tokens (default: as the checkpoint was trained; "
                        "another choice warns)")
    case = p.add_mutually_exclusive_group()
    case.add_argument("--cased", dest="lowercase", action="store_false", default=None,
                      help="keep the input's case (default: as the checkpoint was trained; "
                           "another choice warns)")
    case.add_argument("--lowercase", dest="lowercase", action="store_true", default=None,
                      help="lowercase the input (default: as the checkpoint was trained)")


def refuse_text_args(args, why):
    """--preprocess/--cased/--lowercase given where they cannot act: a ValueError saying ``why``."""
    for option, value in (("--preprocess", args.preprocess), ("--cased/--lowercase", args.lowercase)):
        if value is not None:
            raise ValueError(f"{option}: {why}")


def resolve_text_settings(args, loaded):
    """The text settings from --preprocess/--cased/--lowercase over a loaded checkpoint's (None
    for a checkpoint that is not a Multi30k model, which refuses them)."""
    from ..training.multi30k import is_multi30k, text_settings_for

    if not is_multi30k(loaded):
        refuse_text_args(args, f"only for Multi30k checkpoints; checkpoint {loaded.path} "
                               f"translates whitespace-tokenised text")
        return None
    return text_settings_for(loaded, lowercase=args.lowercase, preprocess=args.preprocess)
