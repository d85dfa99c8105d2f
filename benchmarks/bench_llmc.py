"""Time GPT-2 124M's training step at llm.c's shape (4 x 64 tokens, AdamW) in llm.c's C
reference (``train_gpt2.c``), npformer (Numba backend) and PyTorch eager, on the same cores,
in one run.

    git clone https://github.com/karpathy/llm.c
    python benchmarks/bench_llmc.py --llmc llm.c [--cores N] [--steps 8] [--llmc-steps 6]
                                    [--repeats 1]

Nothing is downloaded. In a temporary directory the script compiles the checkout's
``train_gpt2.c`` as llm.c's Makefile compiles it for the CPU (``gcc -Ofast -march=native -fopenmp
-DOMP``, its warning flags, ``-lm -lgomp``) and writes the files it reads from its working
directory: ``gpt2_124M.bin``, GPT-2 small with seeded random weights (normal, std 0.02; biases 0,
layer-norm gains 1) in llm.c's checkpoint format (a 256 x int32 header: magic 20240326, version 3,
maxT, V, L, NH, C, padded V; then float32 parameters in llm.c's order); the tiny Shakespeare
train and val token files in llm.c's data format (a 256 x int32 header: magic 20240520, version
1, token count; then uint16 tokens), random ids below 50,257; and ``gpt2_tokenizer.bin``, a
placeholder vocabulary ("<id>"), so that the sampling llm.c interleaves has its end-of-text
token. Random weights and tokens: a timing, not a training run.

llm.c's ``main`` trains 41 steps (0-40) and, outside the timed part of each step, estimates the
validation loss every 10 steps (5 forward passes) and samples 63 tokens at steps 20 and 40. On a
small machine that is many minutes (a step takes over 10 s on 2 cores), so the copy compiled
here runs steps 0 to ``--llmc-steps`` (its loop bound, ``step <= 40``, is the only line changed;
the step itself is llm.c's, untouched).
Its time per step is the median of the "took X ms" lines it prints (the forward with loss,
backward and update, as llm.c times them), step 0 left out (it allocates the gradients and
Adam's moments).

npformer and PyTorch run ``bench_train_step.py``'s workers on its ``gpt2-llmc`` config: the same
model (12 layers, d_model 768, 12 heads, vocabulary 50,257, context 1,024, tied embeddings, tanh
GELU, no dropout, as llm.c has none), the same 4 x 64 random tokens, AdamW with llm.c's
hyper-parameters (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0); npformer's ``nf.GPT``
as the README's example runs it, PyTorch's transformers ``GPT2LMHeadModel``. Their time per step
is the median of ``--steps`` steps after two warm-up steps.

Each engine runs in its own process, pinned with ``taskset -c`` to the first ``--cores`` CPUs of
this process's affinity (default: all of it); llm.c gets ``OMP_NUM_THREADS`` = that count,
PyTorch ``torch.set_num_threads`` of it, npformer's runtime counts it from the affinity.
``--repeats R`` runs the three R times, interleaved, and reports the median of each engine's
R medians. The table shows ms/step, tokens/s, peak resident memory, and the ratios llm.c /
npformer and PyTorch / npformer (above 1: npformer is the faster), of the medians and, as a
check on a busy machine, of the fastest steps. The defaults take about 4 minutes on 2 cores.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train_step as bts                       # noqa: E402  (its workers, same directory)
sys.path.insert(1, str(bts.ROOT))                    # npformer from this checkout if not installed
from npformer.checkpoint import write_file_atomic   # noqa: E402

CONFIG = "gpt2-llmc"
MODEL_MAGIC, MODEL_VERSION = 20240326, 3             # gpt2_build_from_checkpoint
DATA_MAGIC, DATA_VERSION = 20240520, 1               # llmc/dataloader.h
TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2     # llmc/tokenizer.h
HEADER_INTS = 256
EOT = 50256                                          # GPT-2's <|endoftext|>
# llm.c's Makefile for the CPU target with gcc: CFLAGS, the flag it adds when the compiler takes
# it, OpenMP's flags, LDLIBS
CFLAGS = ["-Ofast", "-Wno-unused-result", "-Wno-ignored-pragmas", "-Wno-unknown-attributes",
          "-march=native", "-fopenmp", "-DOMP"]
LDLIBS = ["-lm", "-lgomp"]
STEP_LOOP = "for (int step = 0; step <= 40; step++)"
TOOK = re.compile(r"^step (\d+): train loss (\S+) \(took ([0-9.]+) ms\)", re.M)
PARAMETER_NAMES = ("wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                   "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb")


def padded_vocab(vocab, multiple=128):
    """llm.c's padded vocabulary (train_gpt2.py pads V up to a multiple of 128: 50,304)."""
    return -(-vocab // multiple) * multiple


def parameter_sizes(max_len, vocab, n_layers, channels, padded=None):
    """The float counts of llm.c's 16 parameter tensors, in its order (fill_in_parameter_sizes):
    [(name, count)]."""
    vp = padded_vocab(vocab) if padded is None else padded
    L, C = n_layers, channels
    counts = (vp * C, max_len * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
              L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C)
    return list(zip(PARAMETER_NAMES, counts))


def write_checkpoint(path, max_len=1024, vocab=50257, n_layers=12, n_heads=12, channels=768,
                     seed=0):
    """A GPT-2 checkpoint in llm.c's format with seeded random weights: matrices and embeddings
    normal with std 0.02 (the padded vocabulary rows 0), biases 0, layer-norm gains 1. Returns
    the number of parameters (llm.c's num_parameters, padded rows included)."""
    if channels % n_heads:
        raise ValueError(f"channels: expected a multiple of n_heads={n_heads}, got {channels}")
    vp = padded_vocab(vocab)
    sizes = parameter_sizes(max_len, vocab, n_layers, channels, vp)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = (MODEL_MAGIC, MODEL_VERSION, max_len, vocab, n_layers, n_heads, channels, vp)
    rng = np.random.default_rng(seed)

    def write(f):
        f.write(header.tobytes())
        for name, count in sizes:
            if name in ("ln1w", "ln2w", "lnfw"):
                values = np.ones(count, dtype="<f4")
            elif name.endswith("b"):
                values = np.zeros(count, dtype="<f4")
            else:
                values = rng.standard_normal(count, dtype=np.float32)
                values *= np.float32(0.02)
                if name == "wte":
                    values[vocab * channels:] = 0.0                   # padded rows
            f.write(values.astype("<f4", copy=False).tobytes())
    write_file_atomic(Path(path), write)
    return sum(count for _, count in sizes)


def write_tokens(path, n_tokens, vocab=50257, seed=0):
    """A token file in llm.c's data format: random uint16 ids below ``vocab``."""
    if not 0 < vocab <= 65536:
        raise ValueError(f"vocab: expected 1 to 65,536 (uint16 ids), got {vocab}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (DATA_MAGIC, DATA_VERSION, n_tokens)
    tokens = np.random.default_rng(seed).integers(0, vocab, size=n_tokens).astype("<u2")
    write_file_atomic(Path(path),
                      lambda f: (f.write(header.tobytes()), f.write(tokens.tobytes())))


def write_tokenizer(path, vocab=50257, eot=EOT):
    """A placeholder tokenizer in llm.c's format (version 2): token i decodes to "<i>"."""
    header = np.zeros(HEADER_INTS, dtype="<u4")
    header[:4] = (TOKENIZER_MAGIC, TOKENIZER_VERSION, vocab, eot)
    body = b"".join(bytes([len(t)]) + t for t in (f"<{i}>".encode() for i in range(vocab)))
    write_file_atomic(Path(path), lambda f: (f.write(header.tobytes()), f.write(body)))


def step_times(output):
    """The "took X ms" of every step llm.c printed after step 0, in seconds, in step order."""
    return [float(ms) / 1e3 for step, _, ms in TOOK.findall(output) if int(step) > 0]


def limit_steps(source, last_step):
    """llm.c's train_gpt2.c with its training loop ending at step ``last_step`` instead of 40."""
    if source.count(STEP_LOOP) != 1:
        raise ValueError(f"train_gpt2.c: expected its training loop '{STEP_LOOP}' once, found it "
                         f"{source.count(STEP_LOOP)} times (a newer llm.c?)")
    return source.replace(STEP_LOOP, STEP_LOOP.replace("<= 40", f"<= {last_step}"))


def source_shape(source):
    """(B, T) and the gpt2_update call as train_gpt2.c's main has them."""
    b = re.search(r"\bint B = (\d+);", source)
    t = re.search(r"\bint T = (\d+);", source)
    update = re.search(r"gpt2_update\(&model,[^;]*\);", source)
    if not (b and t and update):
        raise ValueError("train_gpt2.c: expected 'int B = ...;', 'int T = ...;' and a "
                         "gpt2_update(&model, ...) call in its main, did not find them")
    return int(b.group(1)), int(t.group(1)), update.group(0)


def fail(message):
    """A one-line error, exit status 2 (as argparse's)."""
    print(f"{Path(__file__).name}: error: {message}", file=sys.stderr)
    sys.exit(2)


def build_llmc(llmc, build, last_step):
    """Compile the checkout's train_gpt2.c (its loop ending at ``last_step``) in ``build`` and
    write the files it reads there. Returns (the gpt2_update call, parameters)."""
    source = (llmc / "train_gpt2.c").read_text()
    b, t, update = source_shape(source)
    c = bts.CONFIGS[CONFIG]
    if (b, t) != (c["batch"], c["seq_len"]):
        raise ValueError(f"train_gpt2.c: expected llm.c's batch 4 x 64 tokens, it has {b} x {t}")
    (build / "train_gpt2.c").write_text(limit_steps(source, last_step))
    cmd = ["gcc", *CFLAGS, "-I", str(llmc), "train_gpt2.c", *LDLIBS, "-o", "train_gpt2"]
    out = subprocess.run(cmd, cwd=build, capture_output=True, text=True)
    if out.returncode != 0:
        first = next((line for line in out.stderr.splitlines() if "error" in line),
                     out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "no output")
        raise ValueError(f"gcc could not compile {llmc / 'train_gpt2.c'}: {first}")
    params = write_checkpoint(build / "gpt2_124M.bin", c["max_len"], c["vocab_size"],
                              c["n_layers"], c["n_heads"], c["d_model"])
    data = build / "dev" / "data" / "tinyshakespeare"
    data.mkdir(parents=True)
    tokens_per_batch = b * t
    write_tokens(data / "tiny_shakespeare_train.bin", 64 * tokens_per_batch + 1, seed=1)
    write_tokens(data / "tiny_shakespeare_val.bin", 8 * tokens_per_batch + 1, seed=2)
    write_tokenizer(build / "gpt2_tokenizer.bin")
    return update, params


def run_llmc(build, pin):
    """Run the compiled train_gpt2 on ``pin`` with OMP_NUM_THREADS=len(pin): its step times
    (after step 0), step 0's loss and its peak resident memory in MB."""
    env = dict(os.environ, OMP_NUM_THREADS=str(len(pin)))
    with open(build / "stdout.txt", "w") as log:
        proc = subprocess.Popen(["taskset", "-c", bts.cpu_list(pin), "./train_gpt2"], cwd=build,
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)              # this child's own rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
    output = (build / "stdout.txt").read_text(errors="replace")
    if proc.returncode != 0:
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        raise ValueError(f"llm.c's train_gpt2 exited with status {proc.returncode}: {last}")
    times = step_times(output)
    if not times:
        raise ValueError("llm.c's train_gpt2 printed no 'step N: train loss ... (took X ms)' "
                         "line after step 0")
    losses = [float(loss) for step, loss, _ in TOOK.findall(output) if int(step) == 0]
    return {"times": sorted(times), "peak_mb": usage.ru_maxrss / 1024,
            "loss0": losses[0] if losses else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--llmc", required=True, metavar="DIR",
                    help="a checkout of https://github.com/karpathy/llm.c (its train_gpt2.c and "
                         "llmc/ are used; nothing is downloaded)")
    ap.add_argument("--cores", type=int, metavar="N",
                    help="pin every engine to the first N CPUs of this process's affinity "
                         "(default: all of them)")
    ap.add_argument("--steps", type=int, default=8,
                    help="timed steps of npformer and PyTorch, after 2 warm-up steps (>= 5)")
    ap.add_argument("--llmc-steps", type=int, default=6, metavar="S",
                    help="llm.c runs steps 0 to S (its own 40 takes minutes on a small "
                         "machine); steps 1 to S are timed (>= 5, <= 40)")
    ap.add_argument("--repeats", type=int, default=1, metavar="R",
                    help="run the three engines R times, interleaved; report the median of "
                         "each one's R medians")
    args = ap.parse_args()
    if args.steps < 5:
        ap.error(f"--steps: expected at least 5, got {args.steps}")
    if not 5 <= args.llmc_steps <= 40:
        ap.error(f"--llmc-steps: expected 5 to 40, got {args.llmc_steps}")
    if args.repeats < 1:
        ap.error(f"--repeats: expected at least 1, got {args.repeats}")
    llmc = Path(args.llmc)
    for need in ("train_gpt2.c", "llmc"):
        if not (llmc / need).exists():
            fail(f"--llmc {args.llmc}: expected a checkout of llm.c with {need}, not found "
                 f"(git clone https://github.com/karpathy/llm.c)")
    for tool, why in (("gcc", "compiles llm.c"), ("taskset", "pins the engines (util-linux)")):
        if shutil.which(tool) is None:
            fail(f"{tool} is not on PATH; it {why}")
    cpus = bts.affinity()
    cores = len(cpus) if args.cores is None else args.cores
    if not 1 <= cores <= len(cpus):
        fail(f"--cores {args.cores}: expected 1 to {len(cpus)}, the CPUs this process may use "
             f"({bts.cpu_list(cpus)})")
    pin = cpus[:cores]
    c = bts.CONFIGS[CONFIG]
    tokens = bts.step_tokens(c)
    worker_args = argparse.Namespace(config=CONFIG, repeats=args.steps, batch=None,
                                     runtime_call=False, nondeterministic=False, profile=False,
                                     choices=False)

    with tempfile.TemporaryDirectory(prefix="bench_llmc-") as tmp:
        build = Path(tmp)
        t0 = time.perf_counter()
        try:
            update, params = build_llmc(llmc, build, args.llmc_steps)
        except ValueError as e:
            fail(str(e))
        commit = subprocess.run(["git", "-C", str(llmc), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "not a git tree"
        print(f"llm.c {llmc} ({commit}): train_gpt2.c compiled with gcc {' '.join(CFLAGS)} "
              f"{' '.join(LDLIBS)} in {time.perf_counter() - t0:.0f} s (with its input files); "
              f"its loop runs steps 0-{args.llmc_steps} instead of 0-40, nothing else changed")
        print(f"GPT-2 124M ({params:,} parameters in llm.c, its vocabulary padded to "
              f"{padded_vocab(c['vocab_size'])}), RANDOM weights and tokens (a timing, not "
              f"training); {c['batch']} x {c['seq_len']} tokens; llm.c's {update}")
        print(f"{cores} core{'s' * (cores != 1)} (taskset -c {bts.cpu_list(pin)}); llm.c "
              f"OMP_NUM_THREADS={cores}, median of steps 1-{args.llmc_steps}; npformer and "
              f"torch median of {args.steps} steps after 2 warm-up steps; {args.repeats} "
              f"round{'s' * (args.repeats != 1)}; load average {os.getloadavg()[0]:.2f}")
        rounds = {"llm.c": [], "npformer-numba": [], "torch-eager": []}
        peak = {}
        for r in range(args.repeats):
            try:
                res = run_llmc(build, pin)
            except ValueError as e:
                fail(str(e))
            rounds["llm.c"].append(res["times"])
            peak["llm.c"] = max(peak.get("llm.c", 0), res["peak_mb"])
            if r == 0:
                print(f"llm.c step 0 loss {res['loss0']} (random weights: about ln(50257) = "
                      f"{np.log(50257):.2f})")
            for name in ("npformer-numba", "torch-eager"):
                try:
                    res = bts.launch(name, worker_args, pin)
                except RuntimeError as e:
                    fail(str(e).splitlines()[-1] if str(e).strip() else f"{name} failed")
                if res is None:                               # torch or transformers missing
                    rounds.pop(name, None)
                    continue
                if name in rounds:
                    rounds[name].append(res["times"])
                    peak[name] = max(peak.get(name, 0), res["peak_mb"])
            if args.repeats > 1:
                print(f"round {r + 1}: " + ", ".join(f"{name} {1e3 * statistics.median(t[-1]):.0f}"
                                                     for name, t in rounds.items()) + " ms/step")

    ms = {name: 1e3 * statistics.median([statistics.median(t) for t in ts])
          for name, ts in rounds.items()}
    best = {name: 1e3 * min(min(t) for t in ts) for name, ts in rounds.items()}
    print(f"{'engine':16s} {'ms/step':>9s} {'(min)':>8s} {'tokens/s':>9s} {'peak RSS MB':>12s}")
    for name in rounds:
        print(f"{name:16s} {ms[name]:9.1f} {best[name]:8.1f} {tokens / ms[name] * 1e3:9.0f} "
              f"{peak[name]:12.0f}")
    for ref in ("llm.c", "torch-eager"):
        label = ref.split("-")[0]
        if ref in ms:
            print(f"{label} / npformer: {ms[ref] / ms['npformer-numba']:.2f}x (fastest steps: "
                  f"{best[ref] / best['npformer-numba']:.2f}x)")
        else:
            print(f"{label} / npformer: n/a ({ref} skipped)")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
