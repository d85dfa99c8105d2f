"""A character GPT's training step at a short and a long context with the same tokens per step:
npformer's peak memory and ms/step at each, and PyTorch's with ``F.scaled_dot_product_attention``
on the same cores, in one run.

    python benchmarks/bench_long_context.py [--lengths 128 2048] [--tokens 8192] [--repeats 3]
                                            [--cores N] [--attention-dropout P]
                                            [--only npformer-numba torch-sdpa]

The model is ``bench_train_step.py``'s gpt-char (``nf.GPT``: vocabulary 65, d_model 192, 6 heads,
FFN 768, 4 layers, float32, AdamW), its context set to each length T and its rows to
tokens / T (64 x 128 and 4 x 2,048 by default). At T = 2,048 npformer's attention takes the
blocked path (``npformer.kernels.blocked_attention``): no T x T array is kept. PyTorch's side is
a GPT of the same shape (pre-norm blocks, tanh GELU, learned positions, tied embeddings)
whose attention is ``F.scaled_dot_product_attention(..., is_causal=True)`` (its CPU flash
kernel), with ``torch.set_num_threads`` at the cores npformer's runtime counts. Dropout: 0.1
on the embeddings and residual branches on both sides; attention dropout ``--attention-dropout``
(default 0: PyTorch's CPU flash kernel takes none, and falls back to its T x T path with it).

Each implementation and length runs in its own subprocess, so its peak resident memory
(``resource.getrusage``) is its own. Printed: ms/step (median of ``--repeats`` after two warm-up
steps), tokens/s, peak RSS; then, measured in this run, the long context's memory and time per
token against the short one's, what the extra attention FLOPs allow (the step's matrix-product
FLOPs, ``bench_train_step.step_flops``, at each length, per token; attention counted in full,
and with the causal half only), and npformer against PyTorch at each length. The load average
before and after is printed: the numbers are only as quiet as the machine.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_train_step import (CONFIGS, affinity, cpu_list, gpt_train_step, make_batch,  # noqa: E402
                              step_flops, time_steps)

IMPLEMENTATIONS = ("npformer-numba", "torch-sdpa")


def config(t, tokens):
    c = dict(CONFIGS["gpt-char"], max_len=t, seq_len=t, batch=max(1, tokens // t))
    return c


def attention_flops(c):
    """The attention products' share of ``step_flops``: 4 B T^2 d a layer forward, thrice."""
    return 3 * c["n_layers"] * 4 * c["batch"] * c["seq_len"] ** 2 * c["d_model"]


def run_npformer(c, args):
    sys.path.insert(0, str(ROOT))
    from npformer import backend

    backend.set_backend("numba")
    train_step = gpt_train_step(dict(c, attention_dropout=args.attention_dropout))
    times = time_steps(train_step, args.repeats)
    attention = __import__("npformer.kernels.attention", fromlist=["use_blocked"])
    h, t, d = c["n_heads"], c["seq_len"], c["d_model"] // c["n_heads"]
    blocked = attention.use_blocked((c["batch"], h, t, d), (c["batch"], h, t, d), 4)
    return times, {"blocked attention": bool(blocked)}


def torch_gpt(c, attention_dropout):
    """A GPT of the config's shape in PyTorch, attention by F.scaled_dot_product_attention."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    d, h = c["d_model"], c["n_heads"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.fc2 = nn.Linear(d, c["d_ff"]), nn.Linear(c["d_ff"], d)
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=attention_dropout if self.training
                                               else 0.0)
            x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
            return x + self.drop(self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(c["vocab_size"], d), nn.Embedding(c["max_len"], d)
            self.blocks = nn.ModuleList(Block() for _ in range(c["n_layers"]))
            self.ln, self.drop = nn.LayerNorm(d), nn.Dropout(0.1)

        def forward(self, ids):
            x = self.drop(self.tok(ids) + self.pos(torch.arange(ids.shape[1])))
            for block in self.blocks:
                x = block(x)
            return self.ln(x) @ self.tok.weight.T                       # tied embeddings
    return GPT().train()


def run_torch(c, args):
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT))
    from npformer.runtime import available_cores
    torch.set_num_threads(available_cores()[0])      # the cores npformer's policy uses, too
    torch.manual_seed(0)
    model = torch_gpt(c, args.attention_dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    inputs, targets = (torch.from_numpy(a) for a in make_batch(c, np))

    def train_step():
        opt.zero_grad()
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        loss.backward()
        opt.step()
    return time_steps(train_step, args.repeats), {"torch_threads": torch.get_num_threads()}


def worker(args):
    c = config(args.length, args.tokens)
    run = run_torch if args.worker == "torch-sdpa" else run_npformer
    times, info = run(c, args)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss      # Linux: kilobytes
    print(json.dumps({"times": times, "peak_mb": peak_kb / 1024, "info": info}))


def launch(name, t, args, pin):
    cmd = [sys.executable, __file__, "--worker", name, "--length", str(t), "--tokens",
           str(args.tokens), "--repeats", str(args.repeats), "--attention-dropout",
           str(args.attention_dropout)]
    if pin is not None:
        cmd = ["taskset", "-c", cpu_list(pin)] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        if name == "torch-sdpa" and "No module named 'torch'" in out.stderr:
            print("torch-sdpa: skipped, torch is not installed")
            return None
        raise RuntimeError(f"{name} at T={t} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def fail(message):
    print(f"{Path(__file__).name}: error: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--lengths", type=int, nargs=2, default=[128, 2048], metavar=("SHORT", "LONG"))
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per step (rows x length)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cores", type=int, default=None)
    ap.add_argument("--attention-dropout", type=float, default=0.0)
    ap.add_argument("--only", nargs="+", choices=IMPLEMENTATIONS, default=list(IMPLEMENTATIONS))
    ap.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    short, long = args.lengths
    if not 1 <= short < long or args.tokens < long:
        fail(f"--lengths: expected 1 <= SHORT < LONG <= --tokens={args.tokens}, got {short} {long}")
    if args.repeats < 1:
        fail(f"--repeats: expected at least 1, got {args.repeats}")
    if not 0.0 <= args.attention_dropout < 1.0:
        fail(f"--attention-dropout: expected a probability in [0, 1), got {args.attention_dropout}")
    cpus = affinity()
    if args.cores is not None and not 1 <= args.cores <= len(cpus):
        fail(f"--cores: expected 1 to {len(cpus)} (this process's CPUs), got {args.cores}")
    pin = cpus[:args.cores] if args.cores else None
    print(f"char GPT (d_model 192, 6 heads, 4 layers, vocab 65), {args.tokens} tokens a step, "
          f"CPUs {cpu_list(pin or cpus)}, load average {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    results = {}
    for t in (short, long):
        for name in args.only:
            res = launch(name, t, args, pin)
            if res is None:
                continue
            results[name, t] = res
            c = config(t, args.tokens)
            ms = 1e3 * res["times"][len(res["times"]) // 2]
            extra = ", ".join(f"{k} {v}" for k, v in res["info"].items())
            print(f"{name:15s} T={t:5d} B={c['batch']:3d}: {ms:9.1f} ms/step "
                  f"{c['batch'] * t / ms * 1e3:9.0f} tokens/s  peak RSS {res['peak_mb']:7.0f} MB"
                  f"  ({extra})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    flops = {t: step_flops(config(t, args.tokens)) for t in (short, long)}
    causal = {t: flops[t] - attention_flops(config(t, args.tokens)) / 2 for t in (short, long)}
    print(f"step FLOPs per token, T={long} over T={short}: {flops[long] / flops[short]:.2f}x "
          f"(attention in full), {causal[long] / causal[short]:.2f}x (its causal half)")
    for name in args.only:
        if (name, short) in results and (name, long) in results:
            a, b = results[name, short], results[name, long]
            ms_a, ms_b = (1e3 * r["times"][len(r["times"]) // 2] for r in (a, b))
            print(f"{name}: T={long} over T={short}: memory {b['peak_mb'] / a['peak_mb']:.2f}x, "
                  f"time per token {ms_b / ms_a:.2f}x")
    for t in (short, long):
        if ("npformer-numba", t) in results and ("torch-sdpa", t) in results:
            ms_n, ms_t = (1e3 * results[n, t]["times"][len(results[n, t]["times"]) // 2]
                          for n in ("npformer-numba", "torch-sdpa"))
            print(f"T={t}: npformer {ms_t / ms_n:.2f}x torch-sdpa's speed, peak RSS "
                  f"{results['npformer-numba', t]['peak_mb']:.0f} vs "
                  f"{results['torch-sdpa', t]['peak_mb']:.0f} MB")


if __name__ == "__main__":
    main()
