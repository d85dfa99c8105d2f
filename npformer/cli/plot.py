"""``npformer plot``: draw the training/validation loss of a run's metrics.jsonl (and validation
BLEU against wall time when it has them: ``benchmarks/multi30k_curve.py``'s points), with
--grad-norms each layer's gradient norm against depth, and, with --checkpoint and --sentence,
the attention weights of every head of every layer for one translation, as PNG. Labels in
Chinese, Japanese, Korean, Greek or Cyrillic are drawn with ``npformer.fonts``."""
import math
import os

import numpy as np

from ..training.metrics_log import json_lines, read_metrics_log
from ..checkpoint import checkpoint_paths
from ..fonts import readable_text
from .common import (check_writable, command_parser, path_argument, refuse_output_over_inputs,
                     resolve_checkpoint)


def add_parser(sub, name):
    p = command_parser(sub, name, __doc__,
                       "loss curves, gradient norms and attention heatmaps as PNG (needs matplotlib)")
    p.add_argument("--metrics", type=path_argument, metavar="JSONL",
                   help="a metrics log (e.g. runs/toy/metrics.jsonl)")
    p.add_argument("--curve", type=path_argument, metavar="JSONL", nargs="+",
                   help="BLEU against wall-clock minutes, both metrics, from the JSON lines of "
                        "benchmarks/multi30k_curve.py (one file per run)")
    p.add_argument("--grad-norms", type=path_argument, metavar="JSONL", nargs="+",
                   help="per-layer gradient norms (before clipping) against depth at several "
                        "steps, one panel per run's metrics log: post-norm's pile up in the "
                        "layers near the output, pre-norm's stay even")
    p.add_argument("--checkpoint", type=path_argument, metavar="CKPT",
                   help="checkpoint for the attention heatmaps")
    p.add_argument("--sentence", help="source sentence to translate and show attention for")
    p.add_argument("--out", type=path_argument, default="plots",
                   help="output folder (default %(default)s)")
    p.set_defaults(run=run)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ValueError("matplotlib is not installed; `pip install npformer[plot]` "
                         "(or `pip install matplotlib`) to draw plots") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_losses(plt, metrics_path, out_dir):
    records = read_metrics_log(metrics_path)
    train = [(r["step"], r["loss"]) for r in records if r["event"] == "train" and "loss" in r]
    valid = [(r["step"], r["loss"]) for r in records if r["event"] == "eval" and "loss" in r]
    if not train and not valid:
        raise ValueError(f"--metrics {metrics_path}: no 'train' or 'eval' records with a loss")
    fig, ax = plt.subplots(figsize=(6, 4))
    if train:
        ax.plot(*zip(*train), label="train (label-smoothed)")
    if valid:
        ax.plot(*zip(*valid), "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(os.path.basename(os.path.dirname(os.path.abspath(metrics_path))) or "loss")
    path = os.path.join(out_dir, "loss.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path] + plot_bleu_vs_time(plt, records, metrics_path, out_dir)


def plot_bleu_vs_time(plt, records, metrics_path, out_dir):
    """Validation BLEU against wall time (minutes), if the log has timed "eval" records."""
    points = [(r["seconds"] / 60.0, r["bleu"]) for r in records
              if r["event"] == "eval" and "bleu" in r and "seconds" in r]
    if not points:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(*zip(*points), "o-")
    ax.set_xlabel("wall time (minutes, validations included)")
    ax.set_ylabel("validation BLEU")
    ax.grid(alpha=0.3)
    ax.set_title(os.path.basename(os.path.dirname(os.path.abspath(metrics_path))) or "BLEU")
    path = os.path.join(out_dir, "bleu_vs_time.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


CURVE_KEYS = ("run", "split", "minutes", "bleu")
CURVE_PANELS = (("bleu", "sacreBLEU, lowercased (detokenised text)"),
                ("bleu_papers", "papers' BLEU (lowercased, Moses-tokenised)"))


def read_curve(path):
    """The points of a ``multi30k_curve.py`` JSON-lines file (ValueError naming the line)."""
    try:
        points = json_lines(path, CURVE_KEYS)
    except ValueError as e:
        raise ValueError(f"--curve {e}") from None
    for n, point in enumerate(points, 1):
        for key in ("minutes", "bleu", "bleu_papers"):
            value = point.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"--curve {path}: point {n}: {key} expected a number, got "
                                 f"{value!r:.40}")
    if not points:
        raise ValueError(f"--curve {path}: no points")
    return points


def plot_curves(plt, points, out_dir):
    """BLEU against minutes (``points``: ``read_curve``'s, of one or more files): one line per
    (run, split), sacreBLEU and the papers' BLEU side by side."""
    series = {}
    for point in points:
        label = (f"{point['run']} ({point.get('preset') or '?'}, {point.get('src', '?')}->"
                 f"{point.get('tgt', '?')}) {point['split']}")
        series.setdefault(label, []).append(point)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for ax, (key, title) in zip(axes, CURVE_PANELS):
        for label, line in series.items():
            xy = sorted((p["minutes"], p[key]) for p in line if key in p and not math.isnan(p[key]))
            if xy:
                ax.plot(*zip(*xy), "o-", label=label)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("wall time (minutes of training, validations included)")
        ax.set_ylabel("BLEU")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    path = os.path.join(out_dir, "bleu_curve.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


GRAD_NORM_LINES = 6                      # logged steps drawn per run, first and last among them


def read_grad_norms(path):
    """The "train" records of a metrics log that hold per-layer gradient norms (``grad_norms``:
    {layer: norm}), or a ValueError naming the file."""
    if not os.path.isfile(path):
        raise ValueError(f"--grad-norms {path}: no such file (a run's metrics.jsonl)")
    try:
        records = read_metrics_log(path)
    except ValueError as e:
        raise ValueError(f"--grad-norms {e}") from None
    found = [r for r in records if r.get("event") == "train" and "grad_norms" in r]
    if not found:
        raise ValueError(f"--grad-norms {path}: no 'train' records with per-layer gradient norms "
                         f"('grad_norms'; training logs them at every --log-every steps)")
    for r in found:
        norms = r["grad_norms"]
        if not (isinstance(norms, dict) and norms and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in norms.values())):
            raise ValueError(f"--grad-norms {path}: step {r.get('step')}: grad_norms expected "
                             f"{{layer: number}}, got {str(norms)[:60]!r}")
    return found


def plot_grad_norms(plt, runs, out_dir):
    """One panel per run (``runs``: [(metrics path, read_grad_norms' records)]): each layer's
    gradient norm, in the order of depth, at up to ``GRAD_NORM_LINES`` logged steps."""
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs) + 1, 4.2), sharey=True,
                             squeeze=False)
    labels = []
    for ax, (metrics_path, records) in zip(axes[0], runs):
        layers = list(records[0]["grad_norms"])
        k = min(GRAD_NORM_LINES, len(records))
        picks = sorted({round(i * (len(records) - 1) / max(k - 1, 1)) for i in range(k)})
        cmap = plt.get_cmap("viridis")
        for n, i in enumerate(picks):
            norms = records[i]["grad_norms"]
            ax.plot(range(len(layers)), [norms.get(name, float("nan")) for name in layers],
                    "o-", ms=3, color=cmap(n / max(len(picks) - 1, 1)),
                    label=f"step {records[i].get('step', '?')}")
        ax.set_xticks(range(len(layers)), layers, rotation=90, fontsize=7)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        title = os.path.basename(os.path.dirname(os.path.abspath(metrics_path))) or metrics_path
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
        labels += layers + [title]
    axes[0][0].set_ylabel("gradient norm of the layer (before clipping)")
    fig.suptitle("per-layer gradient norms, input side on the left", fontsize=9)
    path = os.path.join(out_dir, "grad_norms.png")
    with readable_text(labels):
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def attention_maps(model, vocabs, sentence):
    """Greedy-translate ``sentence``, re-run the model on (source, output) and collect
    ``attn_weights`` of every MultiHeadAttention: {name: (H, T, S)}, plus the token labels."""
    from ..decoding.translator import Translator
    if model.config.capability != "seq2seq":
        raise ValueError(f"--checkpoint: attention heatmaps are drawn for a translation model "
                         f"(source, target and cross-attention), got a {model.config.arch!r} model")
    result = Translator(model, vocabs).translate([sentence])[0]
    src_ids, _ = vocabs.src.encode_with_unknowns(sentence.split())
    if not src_ids:
        raise ValueError("--sentence: expected at least one word")
    # an unfinished output may fill max_len: with <bos> before it, re-run what fits
    kept = result.tokens[:model.config.max_len - 1]
    out_ids = [vocabs.tgt.token_to_id(t) for t in kept]
    model.eval()
    model.forward(np.array([src_ids]), np.array([[vocabs.tgt.bos_id] + out_ids]))
    maps = {}
    for i, layer in enumerate(model.encoder.layers):
        maps[f"encoder.{i}.self_attn"] = layer.self_attn.attn_weights[0]
    for i, layer in enumerate(model.decoder.layers):
        maps[f"decoder.{i}.self_attn"] = layer.self_attn.attn_weights[0]
        maps[f"decoder.{i}.cross_attn"] = layer.multihead_attn.attn_weights[0]
    src_tokens = sentence.split()
    tgt_tokens = ["<bos>"] + kept
    return maps, src_tokens, tgt_tokens, result.text


def plot_attention(plt, ckpt, sentence, out_dir):
    from ..training.checkpointing import load_model_checkpoint
    loaded = load_model_checkpoint(resolve_checkpoint(ckpt))
    maps, src_tokens, tgt_tokens, text = attention_maps(loaded.model, loaded.vocabs, sentence)
    paths = []
    with readable_text(src_tokens + tgt_tokens + [text]):    # CJK too; names missing glyphs
        for name, weights in maps.items():
            paths.append(_heatmap(plt, name, weights, src_tokens, tgt_tokens, sentence, text, out_dir))
    return paths


def _heatmap(plt, name, weights, src_tokens, tgt_tokens, sentence, text, out_dir):
    """One PNG: a row of heads, each a (T, S) grid of attention weights (H, T, S)."""
    rows = src_tokens if name.startswith("encoder") else tgt_tokens
    cols = tgt_tokens if name.endswith("self_attn") and name.startswith("decoder") else src_tokens
    h = weights.shape[0]
    fig, axes = plt.subplots(1, h, figsize=(2.6 * h + 1, 2.8), squeeze=False)
    for k, ax in enumerate(axes[0]):
        ax.imshow(weights[k], vmin=0, vmax=1, cmap="viridis")
        ax.set_title(f"head {k}", fontsize=8)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows)), rows if k == 0 else [""] * len(rows), fontsize=7)
    fig.suptitle(f"{name}: {sentence} -> {text}", fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, f"attention_{name.replace('.', '_')}.png")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def check_out_folder(args):
    """--out must be a folder (or creatable as one) and the PNGs written there must not be the
    --metrics log or the checkpoint read."""
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out}: is a file, expected a folder for the PNGs")
    check_writable("--out", os.path.join(args.out, "loss.png"))
    inputs = ([("--metrics", args.metrics)] + [("--curve", c) for c in args.curve or ()]
              + [("--grad-norms", g) for g in args.grad_norms or ()])
    if args.checkpoint:
        inputs += [("--checkpoint", str(p)) for p in checkpoint_paths(resolve_checkpoint(args.checkpoint))]
    for name in ("loss.png", "bleu_vs_time.png", "bleu_curve.png", "grad_norms.png"):
        refuse_output_over_inputs("--out", os.path.join(args.out, name), inputs)


def run(args):
    if not (args.metrics or args.checkpoint or args.curve or args.grad_norms):
        raise ValueError("give --metrics JSONL (loss curves), --curve JSONL (BLEU against "
                         "minutes), --grad-norms JSONL (per-layer gradient norms) and/or "
                         "--checkpoint CKPT --sentence TEXT")
    if bool(args.checkpoint) != bool(args.sentence):
        raise ValueError("--checkpoint and --sentence: the attention heatmaps need both")
    check_out_folder(args)
    curves = [point for path in args.curve or () for point in read_curve(path)]
    grad_runs = [(path, read_grad_norms(path)) for path in args.grad_norms or ()]
    plt = _pyplot()
    os.makedirs(args.out, exist_ok=True)
    paths = []
    if args.metrics:
        paths += plot_losses(plt, args.metrics, args.out)
    if args.curve:
        paths += plot_curves(plt, curves, args.out)
    if grad_runs:
        paths += plot_grad_norms(plt, grad_runs, args.out)
    if args.checkpoint:
        paths += plot_attention(plt, args.checkpoint, args.sentence, args.out)
    for path in paths:
        print(path)
    return 0
