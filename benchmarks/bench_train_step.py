"""Time one full training step (forward, loss, backward, Adam) of npformer (Numba and NumPy
backends) and PyTorch eager on the same architecture, thread count and batch, in one run.

    python benchmarks/bench_train_step.py [--config base|big] [--repeats 7] [--threads 2]
                                          [--blas-threads 1] [--profile] [--choices]

Each implementation runs in its own subprocess, so its peak resident memory
(``resource.getrusage``) is its own. Prints ms/step (median after warm-up), tokens/s (source +
target tokens), achieved GFLOP/s (FLOPs counted analytically) and peak RSS, and ratios vs PyTorch.
PyTorch is skipped, with a message, when it is not installed.

npformer runs under its runtime policy (``npformer.backend.configure_runtime``): Numba kernels on
``--threads``, BLAS on ``--blas-threads`` (default 1, the policy), freed memory kept for reuse.
PyTorch gets ``torch.set_num_threads(--threads)``. ``--profile`` prints, for the npformer numba
path, the 22 functions with the most own time over the timed steps (cProfile). ``--choices``
prints, for the same path, what the matmul dispatcher measured and picked for every product
shape of the step.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONFIGS = {
    "base": dict(d_model=256, n_heads=8, d_ff=512, n_encoder_layers=3, n_decoder_layers=3,
                 src_vocab_size=7853, tgt_vocab_size=5893, batch=128, src_len=14, tgt_len=15),
    "big": dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6,
                src_vocab_size=7853, tgt_vocab_size=5893, batch=32, src_len=14, tgt_len=15),
}
IMPLEMENTATIONS = ("npformer-numba", "npformer-numpy", "torch-eager")


def step_flops(c):
    """Matrix-product FLOPs of one training step: forward, plus two products of the same size
    each in backward (input gradient and weight gradient); element-wise work is not counted."""
    b, s, t, d, f, v = c["batch"], c["src_len"], c["tgt_len"], c["d_model"], c["d_ff"], c["tgt_vocab_size"]
    ns, nt = b * s, b * t
    enc = 2 * ns * d * 3 * d + 2 * ns * d * d + 4 * ns * d * f + 4 * b * s * s * d
    dec = (2 * nt * d * 3 * d + 2 * nt * d * d + 4 * b * t * t * d                  # self-attention
           + 2 * nt * d * d + 2 * ns * d * 2 * d + 2 * nt * d * d + 4 * b * t * s * d  # cross-attention
           + 4 * nt * d * f)                                                          # feed-forward
    forward = c["n_encoder_layers"] * enc + c["n_decoder_layers"] * dec + 2 * nt * d * v
    return 3 * forward


def make_batch(c, np):
    """Token ids with realistic padding (lengths uniform in [len/2, len]); id 0 is <pad>."""
    rng = np.random.default_rng(0)
    b = c["batch"]
    src = rng.integers(3, c["src_vocab_size"], size=(b, c["src_len"]))
    tgt = rng.integers(3, c["tgt_vocab_size"], size=(b, c["tgt_len"] + 1))
    for ids, n in ((src, c["src_len"]), (tgt, c["tgt_len"] + 1)):
        lengths = rng.integers(n // 2, n + 1, size=b)
        ids[np.arange(n)[None, :] >= lengths[:, None]] = 0
    return src, tgt[:, :-1], tgt[:, 1:]


def time_steps(step, repeats):
    for _ in range(2):                                        # warm-up (compiles, allocates)
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return sorted(times)


def print_choices():
    """The matmul dispatcher's trials and picks, one line per product signature (to stderr)."""
    import importlib
    dispatcher = importlib.import_module("npformer.kernels.matmul")
    for sig, times in dispatcher.timings().items():
        cells = ", ".join(f"{name} {1e3 * t:.3f}" for name, t in sorted(times.items(), key=lambda x: x[1]))
        print(f"{str(sig[:-5] if sig[0] != 'large' else sig[:4]):48s} {str(sig[-5:-2]):18s} "
              f"-> {dispatcher._choice[sig]:20s} ({cells} ms)", file=sys.stderr)


def run_npformer(c, backend_name, repeats, threads, blas_threads, profile=False, choices=False):
    import numpy as np

    sys.path.insert(0, str(ROOT))
    import npformer as nf
    from npformer import backend

    backend.set_backend(backend_name)
    backend.configure_runtime(threads=threads, blas_threads=blas_threads)
    model = nf.Transformer(c["src_vocab_size"], c["tgt_vocab_size"], d_model=c["d_model"],
                           n_heads=c["n_heads"], d_ff=c["d_ff"],
                           n_encoder_layers=c["n_encoder_layers"],
                           n_decoder_layers=c["n_decoder_layers"], dropout=0.1, max_len=64,
                           dtype=np.float32, seed=0)
    opt = nf.Adam(model, lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    src, tgt_in, tgt_out = make_batch(c, np)

    def train_step():
        model.zero_grad()
        logits = model.forward(src, tgt_in)
        _, dlogits = nf.cross_entropy(logits, tgt_out, ignore_index=0, label_smoothing=0.1)
        model.backward(dlogits)
        opt.step()
    if not profile:
        times = time_steps(train_step, repeats)
        if choices:
            print_choices()
        return times
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    times = time_steps(lambda: (prof.enable(), train_step(), prof.disable()), repeats)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
    print(out.getvalue(), file=sys.stderr)
    return times


def run_torch(c, threads, repeats):
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    from torch_reference import ReferenceSeq2Seq

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = dict(c, dropout=0.1, pad_id=0, activation="relu", layer_norm_eps=1e-5,
                  norm_first=False, tie_embeddings=False, max_len=64)
    model = ReferenceSeq2Seq(config).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    src, tgt_in, tgt_out = (torch.from_numpy(a) for a in make_batch(c, np))

    def train_step():
        opt.zero_grad()
        logits = model(src, tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 tgt_out.reshape(-1), ignore_index=0,
                                                 label_smoothing=0.1)
        loss.backward()
        opt.step()
    return time_steps(train_step, repeats)


def worker(args):
    c = CONFIGS[args.config]
    if args.worker == "torch-eager":
        times = run_torch(c, args.threads, args.repeats)
    else:
        numba = args.worker == "npformer-numba"
        times = run_npformer(c, args.worker.split("-")[1], args.repeats, args.threads,
                             args.blas_threads, args.profile and numba, args.choices and numba)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss      # Linux: kilobytes
    print(json.dumps({"times": times, "peak_mb": peak_kb / 1024}))


def launch(name, args):
    env = dict(os.environ)
    for var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    cmd = [sys.executable, __file__, "--worker", name, "--config", args.config,
           "--repeats", str(args.repeats), "--threads", str(args.threads),
           "--blas-threads", str(args.blas_threads)] + (["--profile"] if args.profile else []) \
        + (["--choices"] if args.choices else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        if name == "torch-eager" and "No module named 'torch'" in out.stderr:
            print("torch-eager: skipped, PyTorch is not installed")
            return None
        raise RuntimeError(f"{name} failed:\n{out.stderr[-2000:]}")
    if (args.profile or args.choices) and out.stderr.strip():
        print(f"--- {'profile' if args.profile else 'matmul choices'} of {name} ---\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="base")
    ap.add_argument("--repeats", type=int, default=7, help="timed steps per implementation (>= 5)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="npformer's BLAS threads (default 1: npformer's policy)")
    ap.add_argument("--profile", action="store_true", help="cProfile the npformer numba steps")
    ap.add_argument("--choices", action="store_true",
                    help="print the matmul dispatcher's picks for the npformer numba step")
    ap.add_argument("--only", choices=IMPLEMENTATIONS, action="append",
                    help="run only these implementations (repeatable)")
    ap.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error(f"--repeats: expected at least 5, got {args.repeats}")
    if args.threads < 1 or args.blas_threads < 1:
        ap.error(f"--threads, --blas-threads: expected positive counts, got {args.threads}, "
                 f"{args.blas_threads}")
    if args.worker:
        return worker(args)

    c = CONFIGS[args.config]
    flops = step_flops(c)
    tokens = c["batch"] * (c["src_len"] + c["tgt_len"])
    print(f"config {args.config}: {c}")
    print(f"{flops / 1e9:.1f} GFLOP/step (matrix products), {tokens} tokens/step, "
          f"{args.threads} threads (npformer BLAS: {args.blas_threads}), median of {args.repeats} "
          f"steps after 2 warm-up steps; load average {os.getloadavg()[0]:.2f}")
    results = {}
    for name in args.only or IMPLEMENTATIONS:
        res = launch(name, args)
        if res is not None:
            results[name] = res
    print(f"{'implementation':16s} {'ms/step':>9s} {'(min)':>8s} {'tokens/s':>9s} {'GFLOP/s':>8s} "
          f"{'peak RSS MB':>12s} {'vs torch':>9s}")
    ref = results.get("torch-eager")
    for name, res in results.items():
        t = res["times"]
        med = t[len(t) // 2]
        ratio = f"{(ref['times'][len(ref['times']) // 2]) / med:8.2f}x" if ref else "      n/a"
        print(f"{name:16s} {1e3 * med:9.1f} {1e3 * t[0]:8.1f} {tokens / med:9.0f} "
              f"{flops / med / 1e9:8.1f} {res['peak_mb']:12.0f} {ratio}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
