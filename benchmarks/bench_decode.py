"""Decoding speed: npformer's decoder against CTranslate2 (float32 and int8) on the same model,
sentences, cores and batches, in one run.

    python benchmarks/bench_decode.py [--checkpoint ../shared/checkpoints/m30k-de-en/averaged]
                                      [--data-dir DIR] [--split test_2016_flickr]
                                      [--methods greedy beam5] [--repeats 3] [--cores N]
                                      [--engines npformer ct2-float32 ct2-int8] [--toy] [--profile]
                                      [--sections] [--exact] [--ct2-batch greedy=500 beam5=128]
                                      [--expect FILE] [--write-expected FILE]

``--data-dir`` defaults to the folder that ``npformer download multi30k`` fills
(``$NPFORMER_DATA``, else ``~/.cache/npformer/multi30k``).

The checkpoint is exported to CTranslate2 (``npformer.ct2``) into a temporary folder, once per
quantization. Each engine then runs in its own subprocess (so one engine's threads never wait
on the cores while another runs), translating the whole split as ``npformer eval`` does (the
same tokenisation, the sentences sorted by length in ``Translator``'s batches by tokens: both
engines get the same batches) ``--repeats`` times after one warm-up pass; the table gives
the median seconds, output tokens per second, the ratio to
CTranslate2 float32 in the same run, and whether greedy output is token for token npformer's.

CTranslate2 is also timed at its own best batch size: ``--ct2-batch METHOD=N[,N...]`` (default
``greedy=500 beam5=128``, the sizes of the issue's CTranslate2 figures) runs each CTranslate2
engine again over batches of N sentences (sorted by length, no limit by tokens), and the table
gives each as ``ct2-float32@N``; the ratio column ``x ct2-best`` divides by the fastest
CTranslate2 float32 time of the method, same batches or its own.

Cores: the workers inherit this process's CPU affinity; ``--cores N`` pins them to the first N
CPUs of it with ``taskset``. npformer's runtime and CTranslate2 (``intra_threads``) both take
the cores the process may use.

``--toy`` also times npformer translating 1,000 sentences of the toy zh->en corpus greedily (the
model of ``npformer toy``, trained here with its defaults unless ``--toy-checkpoint`` names one).
``--profile`` prints where npformer's pass of each method of ``--methods`` spends its time
(cProfile, 25 functions by own time, each profile headed by its method's name). ``--sections``
runs one more npformer pass of each method with clocks around its parts and prints, for each,
the seconds spent in: the encoder (each source length at its own width),
the cross-attention keys and values (once per source), the decoder layers' steps, the final
norm and output projection, the top log-softmax (``step_top``'s selection), the reordering of
the caches, and the rest (the search's own bookkeeping, embedding, batching), and how often
the fast path of decoding needed the exact one (``npformer.decoding.FAST_PATH``: searches
redone exactly, rows taken exactly). Only ``--engines npformer`` is needed for it. ``--exact``
makes npformer decode on the exact path (the float64 top log-softmax at every step) instead of
its backend's default (Numba: the fast path, the same tokens).

Output unchanged: ``--write-expected FILE`` stores a digest of npformer's tokens for every
sentence of each method (JSON), and ``--expect FILE`` compares a later run's with them: the
table then says, for npformer, how many sentences differ, and the command exits with status 1
if any does. (Outputs depend on the machine's rounding: compare runs on one machine.
``benchmarks/decode_expected.json`` holds test_2016_flickr's greedy and beam 5 of the shared
model, Numba backend, on the 2-core AMD EPYC machine with OpenBLAS's Haswell kernels that the
issue's figures come from.)
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
CHECKPOINT = SHARED / "checkpoints" / "m30k-de-en" / "averaged"
sys.path.insert(0, str(ROOT))


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _method(name):
    if name == "greedy":
        return "greedy", 1
    if name.startswith("beam") and name[4:].isdigit():
        return "beam", int(name[4:])
    raise SystemExit(f"--methods: expected greedy or beamN, got {name!r}")


def _ct2_batches(specs):
    """``["greedy=500", "beam5=64,128"]`` -> {"greedy": [500], "beam5": [64, 128]}."""
    sizes = {}
    for spec in specs:
        name, _, values = spec.partition("=")
        try:
            _method(name)
            sizes[name] = [int(v) for v in values.split(",")]
        except (SystemExit, ValueError):
            raise SystemExit(f"--ct2-batch: expected METHOD=N[,N...] (greedy=500), got {spec!r}")
        if not sizes[name] or min(sizes[name]) < 1:
            raise SystemExit(f"--ct2-batch: expected batch sizes of at least 1, got {spec!r}")
    return sizes


def worker(args):
    """One engine in this process: print {method: {"seconds": [...], "tokens": n, "output": [...]}}."""
    from npformer.training.checkpointing import load_model_checkpoint
    from npformer.training.multi30k import (checkpoint_text_settings, load_split, make_translator,
                                            text_pipeline)
    if args.worker == "npformer":
        loaded = load_model_checkpoint(args.checkpoint)
    else:
        from npformer.ct2 import load_exported
        loaded = load_exported(args.export)
    settings = checkpoint_text_settings(loaded)
    pipeline = text_pipeline(loaded, settings)
    sources = [s for s, _ in load_split(args.data_dir, args.split, settings["src_lang"],
                                        settings["tgt_lang"])]
    translator = make_translator(loaded, pipeline.tokenize, pipeline.tokenised_text)
    if args.worker == "npformer" and args.exact:
        translator.exact = True                  # the float64 top log-softmax at every step
    warnings.filterwarnings("ignore", message=".*unknown words mapped to <unk>")   # as eval does
    out = {}
    for name in args.methods:
        method, beams = _method(name)

        def run():
            return translator.translate(sources, method=method, beam_size=beams, truncate=True)
        run()                                                          # warm-up (JIT, caches)
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            results = run()
            seconds.append(time.perf_counter() - start)
        if args.sections and args.worker == "npformer":
            print(f"{name}: " + section_times(loaded.model, run), file=sys.stderr)
        if args.profile and args.worker == "npformer":
            profile_pass(name, run)
        out[name] = {"seconds": seconds, "tokens": sum(len(r.tokens) + r.finished for r in results),
                     "output": [r.tokens for r in results]}
        if args.worker != "npformer":
            for size in _ct2_batches(args.ct2_batch).get(name, ()):
                own = translator.batch_size, translator.max_tokens
                translator.batch_size, translator.max_tokens = size, 1 << 40
                try:
                    run()
                    seconds = []
                    for _ in range(args.repeats):
                        start = time.perf_counter()
                        results = run()
                        seconds.append(time.perf_counter() - start)
                finally:
                    translator.batch_size, translator.max_tokens = own
                out[f"{name}@{size}"] = {
                    "seconds": seconds, "tokens": sum(len(r.tokens) + r.finished for r in results),
                    "output": [r.tokens for r in results]}
    if args.toy_checkpoint and args.worker == "npformer":
        out["toy"] = toy_seconds(args.toy_checkpoint, args.repeats)
    print(json.dumps(out))


def profile_pass(name, run, stream=None, limit=25):
    """One more ``run()`` under cProfile: the ``limit`` functions of most own time, after a line
    naming the method ``name``, on ``stream`` (None: stderr)."""
    import cProfile
    import pstats
    stream = sys.stderr if stream is None else stream
    prof = cProfile.Profile()
    prof.runcall(run)
    print(f"{name}: cProfile of one pass, {limit} functions by own time", file=stream)
    pstats.Stats(prof, stream=stream).sort_stats("tottime").print_stats(limit)


SECTIONS = ("encoder", "cross k/v", "decoder layers", "norm+generator", "top log-softmax",
            "reorder")


def section_times(model, run):
    """One more ``run()`` with a clock around each of ``SECTIONS``: "name s" for each, the rest
    and the total. The clocks wrap the model's own objects (and the backend's
    ``top_log_softmax``, the state's ``reorder``) for this pass only."""
    from npformer.backend import ops
    from npformer.decoding import FAST_PATH
    from npformer.nn import transformer
    spent = dict.fromkeys(SECTIONS, 0.0)
    wrapped = []                  # (owner, attribute, its own value before, or None if inherited)

    def clock(owner, attr, section):
        inner = getattr(owner, attr)

        def timed(*a, **k):
            start = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                spent[section] += time.perf_counter() - start
        wrapped.append((owner, attr, vars(owner).get(attr)))
        setattr(owner, attr, timed)

    clock(transformer, "_encode_by_length", "encoder")
    for layer in model.decoder.layers:
        clock(layer.multihead_attn, "memory_cache", "cross k/v")
        clock(layer, "step", "decoder layers")
    clock(model.decoder.norm, "forward", "norm+generator")
    clock(model.generator, "forward", "norm+generator")
    clock(ops(), "top_log_softmax", "top log-softmax")
    if hasattr(ops(), "top_log_softmax_bounded"):
        clock(ops(), "top_log_softmax_bounded", "top log-softmax")
    clock(transformer.TranslationState, "reorder", "reorder")
    FAST_PATH.reset()
    try:
        start = time.perf_counter()
        run()
        total = time.perf_counter() - start
    finally:
        for owner, attr, was in reversed(wrapped):
            if was is None:
                delattr(owner, attr)              # an instance: its class's method again
            else:
                setattr(owner, attr, was)
    rest = total - sum(spent.values())
    return (", ".join(f"{k} {v:.2f}" for k, v in spent.items())
            + f", rest {rest:.2f} (total {total:.2f} s); fast path: {FAST_PATH}")


def digests(outputs):
    """One short digest of each sentence's output tokens (a list of lists of str)."""
    return [hashlib.sha256("\x1f".join(tokens).encode("utf-8")).hexdigest()[:16]
            for tokens in outputs]


def read_expected(path):
    """``--expect``'s file: {"split": ..., "methods": {name: [digest per sentence]}}."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        methods = data["methods"]
        if not all(isinstance(v, list) for v in methods.values()):
            raise ValueError("a method's entry is not a list")
        return data
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"--expect {path}: expected a file written by --write-expected "
                         f"({type(e).__name__}: {e})")


def toy_seconds(checkpoint, repeats):
    from npformer.data.toy import generate_toy_corpus
    from npformer.training.checkpointing import load_model_checkpoint
    from npformer.training.multi30k import translator_for
    loaded = load_model_checkpoint(checkpoint)
    corpus = generate_toy_corpus(seed=1, n_train=1000)
    sentences = [zh for zh, _ in corpus.train][:1000]
    translator = translator_for(loaded)
    translator.translate(sentences)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        translator.translate(sentences)
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds, "sentences": len(sentences)}


def train_toy(folder):
    from npformer.training.toy import run_toy
    run_toy(seed=0, out_dir=str(folder), quiet=True, n_examples=0)
    return str(Path(folder) / "best")


def parse_args(argv=None):
    """The command line; ``--data-dir`` defaults to the download's folder (resolve_data_dir)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=str(CHECKPOINT))
    p.add_argument("--data-dir", default=None,
                   help="the Multi30k files (default: where `npformer download multi30k` puts "
                        "them: $NPFORMER_DATA, else ~/.cache/npformer/multi30k)")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--methods", nargs="+", default=["greedy", "beam5"])
    p.add_argument("--engines", nargs="+", default=["npformer", "ct2-float32", "ct2-int8"],
                   choices=["npformer", "ct2-float32", "ct2-int8"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cores", type=int, default=None)
    p.add_argument("--toy", action="store_true")
    p.add_argument("--toy-checkpoint", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--sections", action="store_true")
    p.add_argument("--exact", action="store_true",
                   help="npformer decodes on the exact path (float64 top log-softmax at every "
                        "step) instead of its backend's default")
    p.add_argument("--expect", default=None, metavar="FILE")
    p.add_argument("--write-expected", default=None, metavar="FILE")
    p.add_argument("--ct2-batch", nargs="*", default=["greedy=500", "beam5=128"],
                   metavar="METHOD=N[,N...]")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--export", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.data_dir is None:
        from npformer.data.multi30k import resolve_data_dir
        args.data_dir = str(resolve_data_dir())
    return args


def main():
    args = parse_args()
    if args.worker:
        return worker(args)
    for name in args.methods:
        _method(name)
    _ct2_batches(args.ct2_batch)
    expected = read_expected(args.expect) if args.expect else None
    if expected and expected.get("split") != args.split:
        raise SystemExit(f"--expect {args.expect}: holds the outputs of split "
                         f"{expected.get('split')!r}, not of --split {args.split!r}")
    if (expected or args.write_expected) and "npformer" not in args.engines:
        raise SystemExit("--expect, --write-expected: expected npformer among --engines")
    if not Path(args.checkpoint + ".npz").exists():
        raise SystemExit(f"--checkpoint {args.checkpoint}: not found (see "
                         f"shared/checkpoints/m30k-de-en/README.md)")

    from npformer import runtime
    from npformer.ct2 import export_ctranslate2
    from npformer.training.checkpointing import load_model_checkpoint
    affinity = sorted(os.sched_getaffinity(0))
    cores = args.cores or runtime.available_cores()[0]
    pin = ["taskset", "-c", ",".join(map(str, affinity[:args.cores]))] if args.cores else []
    tmp = Path(tempfile.mkdtemp(prefix="bench_decode."))
    try:
        loaded = load_model_checkpoint(args.checkpoint)
        exports = {}
        for engine in args.engines:
            if engine.startswith("ct2-"):
                quant = engine[4:]
                exports[engine] = export_ctranslate2(loaded, tmp / engine,
                                                     None if quant == "float32" else quant)
        toy = None
        if args.toy and "npformer" in args.engines:
            toy = args.toy_checkpoint or train_toy(tmp / "toy")
        print(f"bench_decode: {args.checkpoint}, {args.split}, {cores} cores, repeats "
              f"{args.repeats}, {time.strftime('%Y-%m-%d %H:%M')}, load "
              f"{os.getloadavg()[0]:.2f}")
        results = {}
        for engine in args.engines:
            cmd = pin + [sys.executable, __file__, "--worker", engine, "--checkpoint",
                         args.checkpoint, "--data-dir", args.data_dir, "--split", args.split,
                         "--repeats", str(args.repeats), "--methods", *args.methods]
            if engine in exports:
                cmd += ["--export", str(exports[engine])]
            if toy and engine == "npformer":
                cmd += ["--toy-checkpoint", toy]
            if args.profile:
                cmd += ["--profile"]
            if args.sections and engine == "npformer":
                cmd += ["--sections"]
            if args.exact and engine == "npformer":
                cmd += ["--exact"]
            if engine != "npformer":
                cmd += ["--ct2-batch", *args.ct2_batch]
            done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
            results[engine] = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n{'method':8s} {'engine':18s} {'seconds':>8s} {'tokens/s':>9s} {'x ct2-f32':>9s} "
          f"{'x ct2-best':>10s}  same output as npformer")
    for name in args.methods:
        ref = results.get("ct2-float32", {}).get(name)
        own = [r for key, r in results.get("ct2-float32", {}).items()
               if key == name or key.startswith(name + "@")]
        best = min((_median(r["seconds"]) for r in own), default=None)
        mine = results.get("npformer", {}).get(name, {}).get("output")
        for engine, res in results.items():
            for key, r in res.items():
                if key != name and not key.startswith(name + "@"):
                    continue
                sec = _median(r["seconds"])
                ratio = f"{sec / _median(ref['seconds']):.2f}" if ref else "-"
                to_best = f"{sec / best:.2f}" if best else "-"
                same = ("-" if engine == "npformer" or mine is None else
                        "yes" if r["output"] == mine else "no")
                label = engine + key[len(name):]
                print(f"{name:8s} {label:18s} {sec:8.2f} {r['tokens'] / sec:9.0f} {ratio:>9s} "
                      f"{to_best:>10s}  {same}")
    differ = 0
    if expected:
        own = results["npformer"]
        for name in args.methods:
            want = expected["methods"].get(name)
            if want is None:
                print(f"{name}: not in --expect {args.expect}")
                continue
            got = digests(own[name]["output"])
            n = (sum(a != b for a, b in zip(got, want)) if len(got) == len(want)
                 else max(len(got), len(want)))
            differ += n
            print(f"{name}: npformer output as expected ({args.expect}): "
                  + ("yes" if n == 0 else f"no, {n} of {len(want)} sentences differ"))
    if args.write_expected:
        from npformer.data.textfile import write_text_atomic
        write_text_atomic(args.write_expected, json.dumps(
            {"split": args.split, "checkpoint": Path(args.checkpoint).name,
             "methods": {name: digests(results["npformer"][name]["output"])
                         for name in args.methods}}, indent=0) + "\n")
        print(f"wrote {args.write_expected}")
    if toy:
        t = results["npformer"]["toy"]
        print(f"\ntoy: {t['sentences']} sentences greedy in {_median(t['seconds']):.3f} s "
              f"(median of {len(t['seconds'])})")
    if differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
