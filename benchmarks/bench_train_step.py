"""Time one full training step (forward, loss, backward, Adam) of npformer (Numba and NumPy
backends) and PyTorch eager on the same architecture, cores and batch, in one run.

    python benchmarks/bench_train_step.py [--config tiny|base|big|gpt2|gpt2-llmc|gpt-char|
                                                    llama-char] [--batch B] [--repeats 7]
                                          [--cores N] [--runtime-call] [--nondeterministic]
                                          [--profile] [--choices] [--only IMPL ...] [--no-peak]

Each implementation runs in its own subprocess, so its peak resident memory
(``resource.getrusage``) is its own. Prints ms/step (median after two warm-up steps), tokens/s
(source + target tokens), achieved GFLOP/s (matrix-product FLOPs counted analytically), peak RSS,
and each implementation's speed relative to PyTorch eager in the same run. PyTorch is skipped,
with a message, when it is not installed. Then, unless ``--no-peak``, the machine's own float32
matrix-product rate (NumPy's matmul, its BLAS on the same cores, in a subprocess) on the step's
three largest product shapes, weighed as the step weighs them, and npformer's whole-step GFLOP/s
as a share of it: how near the machine's peak the step runs.

Cores: the workers inherit this process's CPU affinity; ``--cores N`` re-executes them pinned to
the first N CPUs of that affinity with ``taskset -c`` (CPUs 0-(N-1) on an unrestricted machine).
The workers inherit the environment as it is (no thread variable is set for them); the header
prints the cores used and the thread variables that are set.

npformer runs as the README's library example does: no runtime call, its runtime
(``npformer.runtime``) applies itself on first use of the engine, deterministic dispatch.
``--runtime-call`` calls ``nf.configure_runtime(keep_memory=True)`` first (glibc keeps freed
memory for reuse: a process-wide setting the runtime makes only when asked);
``--nondeterministic`` calls ``npformer.runtime.set_deterministic(False)`` before the first step
(the matmul dispatcher times its candidates once per shape and keeps the fastest). The output
shows the numba worker's ``npformer.runtime.describe()`` (thread policy and BLAS in force) once.
PyTorch gets ``torch.set_num_threads(N)``, N = the cores npformer's runtime counts (affinity,
cgroup quota, thread caps: ``npformer.runtime.available_cores``).

``--profile`` prints, for the npformer numba path, the 22 functions with the most own time over
the timed steps (cProfile). ``--choices`` prints, for the same path, the variant picked for every
product shape of the step (``npformer.runtime.choices()``) and, where the dispatcher measured
them (``--nondeterministic``), the candidates' times.

Configs: ``tiny`` is Transformer-Tiny (4+4 layers, d_model 128, 4 heads, FFN 256, source and
target vocabularies of 10,000, batch 256 x 14 source x 15 target tokens); ``base`` and ``big``
are as defined in ``CONFIGS`` below. The decoder-only ones train a GPT (``nf.GPT``) with AdamW
on next-token prediction: ``gpt2`` is GPT-2 small (124M parameters, random weights, 4 x 256
tokens), ``gpt2-llmc`` the same model at llm.c's ``train_gpt2.c`` shape and settings (4 x 64
tokens, no dropout, AdamW without weight decay; benchmarks/bench_llmc.py runs it against llm.c),
``gpt-char`` a character-level model (4 layers, d_model 192, context 128); PyTorch's
side is transformers' ``GPT2LMHeadModel`` of the same shape (skipped, with a message, where
transformers is not installed). ``llama-char`` is the same character model with Llama's block
(RMSNorm, SwiGLU of 512 so its feed-forward holds as many weights as gpt-char's 768, 6 query heads
over 2 key/value heads, rotary positions, no biases, no dropout) against transformers'
``LlamaForCausalLM`` of the same shape. ``--batch B`` replaces a config's rows (its sequence lengths
stay), e.g. ``--config tiny --batch 128`` for the half batches of ``--max-tokens 3700``: compare
tokens/s between two runs at different B, each against PyTorch at the same B.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONFIGS = {
    "tiny": dict(d_model=128, n_heads=4, d_ff=256, n_encoder_layers=4, n_decoder_layers=4,
                 src_vocab_size=10000, tgt_vocab_size=10000, batch=256, src_len=14, tgt_len=15),
    "base": dict(d_model=256, n_heads=8, d_ff=512, n_encoder_layers=3, n_decoder_layers=3,
                 src_vocab_size=7853, tgt_vocab_size=5893, batch=128, src_len=14, tgt_len=15),
    "big": dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6,
                src_vocab_size=7853, tgt_vocab_size=5893, batch=32, src_len=14, tgt_len=15),
    "gpt2": dict(model="gpt", vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12,
                 max_len=1024, batch=4, seq_len=256),
    "gpt2-llmc": dict(model="gpt", vocab_size=50257, d_model=768, n_heads=12, d_ff=3072,
                      n_layers=12, max_len=1024, batch=4, seq_len=64, dropout=0.0,
                      weight_decay=0.0),
    "gpt-char": dict(model="gpt", vocab_size=65, d_model=192, n_heads=6, d_ff=768, n_layers=4,
                     max_len=128, batch=64, seq_len=128),
    "llama-char": dict(model="llama", vocab_size=65, d_model=192, n_heads=6, n_kv_heads=2,
                       d_ff=512, n_layers=4, max_len=128, batch=64, seq_len=128),
}
DECODERS = ("gpt", "llama")                  # configs of a decoder-only model
# each decoder's block kinds (GPTConfig fields; "gpt": the defaults, GPT-2's block)
DECODER_BLOCKS = {"gpt": {},
                  "llama": dict(norm="rmsnorm", ffn="gated", activation="silu", positions="rotary",
                                qkv_bias=False, proj_bias=False)}


def ffn_gates(c):
    """How many d_ff-wide projections a decoder config's feed-forward starts with: 2 where its
    kind is gated (gate and up, fused), else 1 (``npformer.parts``)."""
    import npformer as nf
    ffn = DECODER_BLOCKS[c["model"]].get("ffn", nf.GPTConfig.ffn)
    return 2 if nf.parts.FFNS[ffn].gated else 1
IMPLEMENTATIONS = ("npformer-numba", "npformer-numpy", "torch-eager")
THREAD_VARS = ("NPFORMER_NUM_THREADS", "NPFORMER_RUNTIME", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS",
               "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_THREADING_LAYER")


def affinity():
    """The CPUs this process may run on, sorted."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_list(cpus):
    """taskset's list syntax for ``cpus``: ranges where consecutive ("0-3,8")."""
    parts, start = [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            parts.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(parts)


def step_flops(c):
    """Matrix-product FLOPs of one training step: forward, plus two products of the same size
    each in backward (input gradient and weight gradient); element-wise work is not counted."""
    d, f = c["d_model"], c["d_ff"]
    if c.get("model") in DECODERS:
        b, t, v = c["batch"], c["seq_len"], c["vocab_size"]
        n = b * t
        kv = d * c.get("n_kv_heads", c["n_heads"]) // c["n_heads"]        # key/value width
        matrices = ffn_gates(c) + 1                                 # (gate,) up, down
        block = 2 * n * d * (d + 2 * kv) + 2 * n * d * d + 2 * matrices * n * d * f \
            + 4 * b * t * t * d
        return 3 * (c["n_layers"] * block + 2 * n * d * v)
    b, s, t, v = c["batch"], c["src_len"], c["tgt_len"], c["tgt_vocab_size"]
    ns, nt = b * s, b * t
    enc = 2 * ns * d * 3 * d + 2 * ns * d * d + 4 * ns * d * f + 4 * b * s * s * d
    dec = (2 * nt * d * 3 * d + 2 * nt * d * d + 4 * b * t * t * d                  # self-attention
           + 2 * nt * d * d + 2 * ns * d * 2 * d + 2 * nt * d * d + 4 * b * t * s * d  # cross-attention
           + 4 * nt * d * f)                                                          # feed-forward
    forward = c["n_encoder_layers"] * enc + c["n_decoder_layers"] * dec + 2 * nt * d * v
    return 3 * forward


def step_products(c):
    """The forward's linear products of one step as {(M, K, N): count}: M rows times a (K, N)
    weight (the attention's per-head products, many small batched ones, are left out). The
    backward runs two products of each shape's size (its transposes), so these shapes carry
    most of ``step_flops``."""
    d, f = c["d_model"], c["d_ff"]
    out = {}

    def add(m, k, n, count):
        out[(m, k, n)] = out.get((m, k, n), 0) + count

    if c.get("model") in DECODERS:
        n, v = c["batch"] * c["seq_len"], c["vocab_size"]
        kv = d * c.get("n_kv_heads", c["n_heads"]) // c["n_heads"]
        layers = c["n_layers"]
        add(n, d, d + 2 * kv, layers)                                   # q, k, v
        add(n, d, d, layers)                                            # attention output
        add(n, d, ffn_gates(c) * f, layers)                             # (gate and) up, fused
        add(n, f, d, layers)                                            # down
        add(n, d, v, 1)                                                 # the output head
        return out
    b, s, t, v = c["batch"], c["src_len"], c["tgt_len"], c["tgt_vocab_size"]
    ns, nt, enc, dec = b * s, b * t, c["n_encoder_layers"], c["n_decoder_layers"]
    add(ns, d, 3 * d, enc), add(ns, d, d, enc), add(ns, d, f, enc), add(ns, f, d, enc)
    add(nt, d, 3 * d, dec), add(nt, d, d, 3 * dec), add(ns, d, 2 * d, dec)
    add(nt, d, f, dec), add(nt, f, d, dec), add(nt, d, v, 1)
    return out


def largest_products(c, n=3):
    """The ``n`` shapes of ``step_products`` with the most FLOPs in the step, largest first."""
    products = step_products(c)
    return sorted(products, key=lambda mkn: -products[mkn] * mkn[0] * mkn[1] * mkn[2])[:n]


def sgemm_rates(shapes, seconds=0.3):
    """{shape: GFLOP/s} of NumPy's float32 matmul (its BLAS, on every core this process may
    use) on each (M, K, N): the best of repeated products over about ``seconds`` each."""
    import numpy as np
    rng = np.random.default_rng(0)
    rates = {}
    for m, k, n in shapes:
        a = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        out = np.empty((m, n), dtype=np.float32)
        np.matmul(a, w, out=out)                                        # warm-up
        best, spent = float("inf"), 0.0
        while spent < seconds or best == float("inf"):
            t0 = time.perf_counter()
            np.matmul(a, w, out=out)
            dt = time.perf_counter() - t0
            best, spent = min(best, dt), spent + dt
        rates[(m, k, n)] = 2 * m * k * n / best / 1e9
    return rates


def machine_rate(c, rates):
    """The step's largest products at the machine's sgemm rates, as one rate: their FLOPs in
    the step over the time those rates give them (a FLOP-weighted harmonic mean), GFLOP/s."""
    products = step_products(c)
    work = {mkn: products[mkn] * 2 * mkn[0] * mkn[1] * mkn[2] for mkn in rates}
    return sum(work.values()) / sum(work[mkn] / (rates[mkn] * 1e9) for mkn in rates) / 1e9


def step_tokens(c):
    """Tokens a step trains on: source + target, or the language model's positions."""
    if c.get("model") in DECODERS:
        return c["batch"] * c["seq_len"]
    return c["batch"] * (c["src_len"] + c["tgt_len"])


def make_batch(c, np):
    """Token ids with realistic padding (lengths uniform in [len/2, len]); id 0 is <pad>.
    A language model's batch: (inputs, next tokens), no padding."""
    rng = np.random.default_rng(0)
    b = c["batch"]
    if c.get("model") in DECODERS:
        ids = rng.integers(0, c["vocab_size"], size=(b, c["seq_len"] + 1))
        return ids[:, :-1], ids[:, 1:]
    src = rng.integers(3, c["src_vocab_size"], size=(b, c["src_len"]))
    tgt = rng.integers(3, c["tgt_vocab_size"], size=(b, c["tgt_len"] + 1))
    for ids, n in ((src, c["src_len"]), (tgt, c["tgt_len"] + 1)):
        lengths = rng.integers(n // 2, n + 1, size=b)
        ids[np.arange(n)[None, :] >= lengths[:, None]] = 0
    return src, tgt[:, :-1], tgt[:, 1:]


def transformer_and_adam(c):
    """npformer's encoder-decoder of config ``c`` (float32, dropout 0.1) and its Adam."""
    import numpy as np

    import npformer as nf
    model = nf.Transformer(c["src_vocab_size"], c["tgt_vocab_size"], d_model=c["d_model"],
                           n_heads=c["n_heads"], d_ff=c["d_ff"],
                           n_encoder_layers=c["n_encoder_layers"],
                           n_decoder_layers=c["n_decoder_layers"], dropout=0.1, max_len=64,
                           dtype=np.float32, seed=0)
    return model, nf.Adam(model, lr=1e-4, betas=(0.9, 0.98), eps=1e-9)


def transformer_train_step(c):
    """One training step of ``transformer_and_adam(c)`` on ``make_batch(c)``, as a callable:
    forward, cross-entropy (label smoothing 0.1, padding ignored), backward, Adam."""
    import numpy as np

    import npformer as nf
    model, opt = transformer_and_adam(c)
    src, tgt_in, tgt_out = make_batch(c, np)

    def train_step():
        model.zero_grad()
        logits = model.forward(src, tgt_in)
        _, dlogits = nf.cross_entropy(logits, tgt_out, ignore_index=0, label_smoothing=0.1)
        model.backward(dlogits)
        opt.step()
    return train_step


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
    """The variant used for every product key of the step and, where the dispatcher measured
    them (non-deterministic mode), the candidates' best times (to stderr)."""
    import importlib
    from npformer import runtime
    dispatcher = importlib.import_module("npformer.kernels.matmul")   # the module, not the function
    picks, timings = runtime.choices(), dispatcher.timings()
    print(f"{len(picks)} product keys ({'measured' if timings else 'no timings: deterministic'}"
          f" dispatch)", file=sys.stderr)
    for key in sorted(picks):
        cells = ""
        if key in timings:
            cells = "  (" + ", ".join(f"{name} {1e3 * t:.3f}" for name, t in
                                      sorted(timings[key].items(), key=lambda x: x[1])) + " ms)"
        print(f"{key:52s} -> {picks[key]}{cells}", file=sys.stderr)
    for key in sorted(set(timings) - set(picks)):
        print(f"{key:52s} -> (timed, not recorded) {timings[key]}", file=sys.stderr)


def run_npformer(c, backend_name, args):
    sys.path.insert(0, str(ROOT))
    import npformer as nf
    from npformer import backend

    numba = backend_name == "numba"
    backend.set_backend(backend_name)
    if args.runtime_call:
        nf.configure_runtime(keep_memory=True)               # process-wide mallopt, on request
    if args.nondeterministic:
        nf.runtime.set_deterministic(False)
    if c.get("model") in DECODERS:
        train_step = gpt_train_step(c)
    else:
        train_step = transformer_train_step(c)
    if args.profile and numba:
        import cProfile
        import io
        import pstats
        prof = cProfile.Profile()
        times = time_steps(lambda: (prof.enable(), train_step(), prof.disable()), args.repeats)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
        print(out.getvalue(), file=sys.stderr)
    else:
        times = time_steps(train_step, args.repeats)
    if args.choices and numba:
        print_choices()
    # the runtime in force during the steps (the numba backend applied it on first use; read
    # afterwards so that reading it changes nothing the steps saw)
    return times, (nf.runtime.describe() if numba else None)


def gpt_train_step(c):
    """One step of a decoder config: ``nf.GPT`` with GPT-2's block (the config's ``dropout`` and
    ``attention_dropout`` where given) or Llama's, AdamW, next-token cross-entropy."""
    import numpy as np

    import npformer as nf
    if c["model"] == "llama":
        block = dict(DECODER_BLOCKS["llama"], n_kv_heads=c.get("n_kv_heads"), dropout=0.0,
                     layer_norm_eps=1e-6)
    else:
        block = dict(dropout=c.get("dropout", 0.1))
        if "attention_dropout" in c:
            block["attention_dropout"] = c["attention_dropout"]
    model = nf.GPT(c["vocab_size"], d_model=c["d_model"], n_heads=c["n_heads"], d_ff=c["d_ff"],
                   n_layers=c["n_layers"], max_len=c["max_len"], dtype=np.float32, seed=0, **block)
    opt = nf.AdamW(model, lr=1e-4, weight_decay=c.get("weight_decay", 0.1))
    inputs, targets = make_batch(c, np)

    def train_step():
        model.zero_grad()
        logits = model.forward(inputs)
        _, dlogits = nf.cross_entropy(logits, targets)
        model.backward(dlogits)
        opt.step()
    return train_step


def torch_gpt(c):
    """transformers' GPT2LMHeadModel of the config's shape (dropout 0.1 everywhere, as nf.GPT's
    defaults, or the config's ``dropout``), its AdamW, and the step."""
    import transformers

    p = c.get("dropout", 0.1)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=c["vocab_size"], n_positions=c["max_len"], n_embd=c["d_model"],
        n_layer=c["n_layers"], n_head=c["n_heads"], n_inner=c["d_ff"], resid_pdrop=p,
        embd_pdrop=p, attn_pdrop=p)).train()
    return torch_lm_step(model, c)


def torch_lm_step(model, c):
    """One step of a transformers causal language model: AdamW (weight decay 0.1, or the
    config's), next-token cross-entropy."""
    import numpy as np
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=c.get("weight_decay", 0.1))
    inputs, targets = (torch.from_numpy(a) for a in make_batch(c, np))

    def train_step():
        opt.zero_grad()
        logits = model(inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        loss.backward()
        opt.step()
    return train_step


def torch_llama(c):
    """transformers' LlamaForCausalLM of the config's shape (no dropout, as Llama), its AdamW,
    and the step."""
    import transformers

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=c["vocab_size"], hidden_size=c["d_model"], intermediate_size=c["d_ff"],
        num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
        num_key_value_heads=c["n_kv_heads"], max_position_embeddings=c["max_len"],
        tie_word_embeddings=True, attn_implementation="eager")).train()
    return torch_lm_step(model, c)


def run_torch(c, repeats):
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    from torch_reference import ReferenceSeq2Seq

    from npformer.runtime import available_cores
    torch.set_num_threads(available_cores()[0])      # the cores npformer's policy uses, too
    torch.manual_seed(0)
    if c.get("model") in DECODERS:
        step = torch_llama(c) if c["model"] == "llama" else torch_gpt(c)
        return time_steps(step, repeats), {"torch_threads": torch.get_num_threads()}
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
    times = time_steps(train_step, repeats)
    return times, {"torch_threads": torch.get_num_threads()}


def config(args):
    """The benchmarked shape: ``CONFIGS[args.config]``, its rows replaced by ``--batch``."""
    c = dict(CONFIGS[args.config])
    if args.batch is not None:
        c["batch"] = args.batch
    return c


def worker(args):
    c = config(args)
    if args.worker == "sgemm":
        rates = sgemm_rates(largest_products(c))
        print(json.dumps({"rates": [[list(k), v] for k, v in rates.items()]}))
        return
    if args.worker == "torch-eager":
        times, info = run_torch(c, args.repeats)
    else:
        times, info = run_npformer(c, args.worker.split("-")[1], args)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss      # Linux: kilobytes
    print(json.dumps({"times": times, "peak_mb": peak_kb / 1024, "cpus": affinity(),
                      "info": info}, default=str))


def launch(name, args, pin):
    """Run one implementation in a subprocess (pinned with taskset to ``pin`` if given)."""
    cmd = [sys.executable, __file__, "--worker", name, "--config", args.config,
           "--repeats", str(args.repeats)]
    if args.batch is not None:
        cmd += ["--batch", str(args.batch)]
    for flag in ("runtime_call", "nondeterministic", "profile", "choices"):
        if getattr(args, flag):
            cmd.append("--" + flag.replace("_", "-"))
    if pin is not None:
        cmd = ["taskset", "-c", cpu_list(pin)] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True)       # the environment as it is
    if out.returncode != 0:
        for package in ("torch", "transformers"):
            if name == "torch-eager" and f"No module named '{package}'" in out.stderr:
                print(f"torch-eager: skipped, {package} is not installed")
                return None
        raise RuntimeError(f"{name} failed:\n{out.stderr[-2000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["info"] is not None:
        label = "npformer.runtime.describe()" if name.startswith("npformer") else "torch"
        print(f"{name} on CPUs {cpu_list(res['cpus'])}: {label} {json.dumps(res['info'])}")
    if out.stderr.strip():
        parts = [w for w, on in (("profile", args.profile), ("matmul choices", args.choices))
                 if on and name == "npformer-numba"]
        what = " and ".join(parts) or "stderr"
        print(f"--- {what} of {name} ---\n{out.stderr.rstrip()}")
    return res


def fail(message):
    """A one-line error, exit status 2 (as argparse's)."""
    print(f"{Path(__file__).name}: error: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--config", choices=sorted(CONFIGS), default="base")
    ap.add_argument("--batch", type=int, metavar="B",
                    help="rows of the batch, replacing the config's (its lengths stay)")
    ap.add_argument("--repeats", type=int, default=7, help="timed steps per implementation (>= 5)")
    ap.add_argument("--cores", type=int, metavar="N",
                    help="pin the workers to the first N CPUs of this process's affinity "
                         "(taskset -c); default: they inherit the affinity")
    ap.add_argument("--runtime-call", action="store_true",
                    help="call nf.configure_runtime(keep_memory=True) first (glibc mallopt) "
                         "(default: no call, the runtime applies itself)")
    ap.add_argument("--nondeterministic", action="store_true",
                    help="npformer.runtime.set_deterministic(False) before the first step "
                         "(measured matmul dispatch)")
    ap.add_argument("--profile", action="store_true", help="cProfile the npformer numba steps")
    ap.add_argument("--choices", action="store_true",
                    help="print the matmul variant picked per product key for the npformer "
                         "numba step (and the timings, where measured)")
    ap.add_argument("--only", choices=IMPLEMENTATIONS, action="append",
                    help="run only these implementations (repeatable)")
    ap.add_argument("--no-peak", action="store_true",
                    help="skip measuring the machine's sgemm rate on the step's largest product "
                         "shapes (by default measured after the steps, on the same cores, and "
                         "npformer's share of it printed)")
    ap.add_argument("--worker", choices=IMPLEMENTATIONS + ("sgemm",), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error(f"--repeats: expected at least 5, got {args.repeats}")
    if args.batch is not None and args.batch < 1:
        ap.error(f"--batch: expected a positive number of rows, got {args.batch}")
    if args.worker:
        return worker(args)

    cpus = affinity()
    pin = None
    if args.cores is not None:
        if args.cores < 1 or args.cores > len(cpus):
            fail(f"--cores {args.cores}: expected 1 to {len(cpus)}, the CPUs this process may "
                 f"use ({cpu_list(cpus)})")
        if shutil.which("taskset") is None:
            fail(f"--cores {args.cores}: needs taskset (util-linux), which is not on PATH")
        pin = cpus[:args.cores]
    cores = len(pin if pin is not None else cpus)

    c = config(args)
    flops = step_flops(c)
    tokens = step_tokens(c)
    print(f"config {args.config}: {c}")
    where = (f"pinned with taskset -c {cpu_list(pin)}" if pin is not None
             else f"inherited affinity, CPUs {cpu_list(cpus)}")
    mode = ("nf.configure_runtime(keep_memory=True)" if args.runtime_call
            else "no runtime call (applies itself)")
    mode += ", non-deterministic dispatch" if args.nondeterministic else ", deterministic dispatch"
    env = ", ".join(f"{v}={os.environ[v]}" for v in THREAD_VARS if v in os.environ) or "none"
    print(f"{flops / 1e9:.1f} GFLOP/step (matrix products), {tokens} tokens/step, "
          f"{cores} core{'s' * (cores != 1)} ({where}); median of {args.repeats} steps after 2 "
          f"warm-up steps")
    print(f"npformer: {mode}; torch: set_num_threads({cores}); variables set: {env}; "
          f"load average {os.getloadavg()[0]:.2f}")
    results = {}
    for name in args.only or IMPLEMENTATIONS:
        res = launch(name, args, pin)
        if res is not None:
            if len(res["cpus"]) != cores:
                print(f"note: {name} ran on {len(res['cpus'])} CPUs, not {cores}")
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
    if not args.no_peak:
        peak = machine_peak(args, c, pin)
        for name, res in results.items():
            if name.startswith("npformer"):
                t = res["times"]
                achieved = flops / t[len(t) // 2] / 1e9
                print(f"{name}: {achieved:.1f} GFLOP/s over the whole step = "
                      f"{100 * achieved / peak:.0f}% of the machine's sgemm rate on the step's "
                      f"largest products ({peak:.1f} GFLOP/s)")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


def machine_peak(args, c, pin):
    """The machine's float32 matrix-product rate on the step's largest product shapes
    (``largest_products``), measured in a subprocess on the same cores as the steps: each
    shape's rate, then their FLOP-weighted rate (``machine_rate``), which is returned."""
    cmd = [sys.executable, __file__, "--worker", "sgemm", "--config", args.config]
    if args.batch is not None:
        cmd += ["--batch", str(args.batch)]
    if pin is not None:
        cmd = ["taskset", "-c", cpu_list(pin)] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rates = {tuple(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1])["rates"]}
    shown = ", ".join(f"({m}x{k})@({k}x{n}) {r:.0f}" for (m, k, n), r in rates.items())
    rate = machine_rate(c, rates)
    print(f"the machine's sgemm (NumPy float32 matmul on these cores), GFLOP/s: {shown}; "
          f"as the step weighs them: {rate:.1f}")
    return rate


if __name__ == "__main__":
    main()
