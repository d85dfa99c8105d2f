"""Helpers shared by the CLI commands: checkpoint paths, input lines, model-size options, and the
checks that keep a command's outputs off its inputs."""
import os
import sys

from ..checkpoint import CheckpointError, checkpoint_paths


def resolve_checkpoint(path):
    """A checkpoint path as given ("run/best", "run/best.npz") or a run directory (-> DIR/best)."""
    if os.path.isdir(path):
        candidate = os.path.join(path, "best")
        if not os.path.exists(candidate + ".npz"):
            raise CheckpointError(f"--checkpoint {path}: a directory without best.npz "
                                  f"(expected a run directory written by npformer toy/train --out)")
        return candidate
    return path


def read_lines(path):
    """Lines of a UTF-8 text file (or stdin for "-"), newline stripped; errors name the file."""
    if path == "-":
        return [line.rstrip("\n") for line in sys.stdin]
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: expected UTF-8 text ({e})") from None


def add_model_args(p, defaults):
    g = p.add_argument_group("model")
    g.add_argument("--d-model", type=int, default=defaults["d_model"])
    g.add_argument("--n-heads", type=int, default=defaults["n_heads"])
    g.add_argument("--d-ff", type=int, default=defaults["d_ff"])
    g.add_argument("--layers", type=int, default=defaults["n_encoder_layers"],
                   help="encoder and decoder layers each (default %(default)s)")
    g.add_argument("--dropout", type=float, default=defaults["dropout"])
    g.add_argument("--max-len", type=int, default=defaults["max_len"])


def model_kwargs(args):
    return dict(d_model=args.d_model, n_heads=args.n_heads, d_ff=args.d_ff,
                n_encoder_layers=args.layers, n_decoder_layers=args.layers,
                dropout=args.dropout, max_len=args.max_len)


def add_train_args(p, defaults):
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=int, default=defaults["epochs"])
    g.add_argument("--max-steps", type=int, default=None)
    g.add_argument("--batch-size", type=int, default=defaults["batch_size"])
    g.add_argument("--lr", type=float, default=defaults["lr"], help="peak learning rate")
    g.add_argument("--warmup-steps", "--warmup", type=int, default=defaults["warmup_steps"])
    g.add_argument("--schedule", default=defaults["schedule"],
                   choices=["inverse_sqrt", "cosine", "noam", "constant"])
    g.add_argument("--min-lr", type=float, default=defaults.get("min_lr", 0.0),
                   help="final learning rate of the cosine schedule")
    g.add_argument("--label-smoothing", type=float, default=defaults["label_smoothing"])
    g.add_argument("--clip-norm", type=float, default=defaults["clip_norm"])
    g.add_argument("--patience", type=int, default=None,
                   help="early stopping after N validations without improvement")
    g.add_argument("--stop-metric", default=defaults.get("stop_metric", "exact_match"),
                   choices=["exact_match", "bleu", "loss"],
                   help="validation metric for the best checkpoint and early stopping "
                        "(default %(default)s)")
    g.add_argument("--target", type=float, default=defaults.get("target"),
                   help="stop once the validation --stop-metric reaches this (default %(default)s)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--resume", metavar="CKPT", help="continue a run from its checkpoint (bit for bit)")
    g.add_argument("--quiet", action="store_true", help="no progress bars")


def train_kwargs(args):
    return dict(epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size,
                lr=args.lr, warmup_steps=args.warmup_steps, schedule=args.schedule, min_lr=args.min_lr,
                label_smoothing=args.label_smoothing,
                clip_norm=args.clip_norm if args.clip_norm and args.clip_norm > 0 else None,
                patience=args.patience, stop_metric=args.stop_metric, target=args.target,
                seed=args.seed, quiet=args.quiet)


def write_json(path, obj):
    import json
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


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


def check_writable(option, path):
    """Fail now, not after an hour of work, if ``path`` cannot be written: its folder must exist
    or be creatable, and the path must not be a folder."""
    if os.path.isdir(path):
        raise ValueError(f"{option} {path}: expected a file path, got a folder")
    parent = os.path.dirname(os.path.abspath(path))
    probe = parent
    while not os.path.exists(probe):             # the nearest existing ancestor must be a folder
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ValueError(f"{option} {path}: cannot be written: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{option} {path}: cannot be written (permission denied)")
