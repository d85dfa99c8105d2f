"""One fine-tuning step and its peak memory: LoRA (rank 8 on q_proj and v_proj, the base frozen)
against full fine-tuning, in npformer and in transformers + PEFT (eager attention), on a random
Llama-style model of about 100 M parameters.

    python benchmarks/bench_lora.py                       # the four runs, a table at the end
    python benchmarks/bench_lora.py --runs npformer-lora npformer-full --repeats 5
    python benchmarks/bench_lora.py --json out.json

Each run is a fresh process (so that its peak resident memory, ``VmHWM``, is its own): it
builds the model with random weights, reports its resident memory then (``built``), runs one
untimed step (the first allocates the gradient buffers, Adam's moments, the kernels' scratch),
then ``--repeats`` timed steps (zero_grad, forward, cross-entropy, backward, AdamW), and
reports the median step (and the fastest: on a shared machine the median moves with the
neighbours' load) and the peak. ``step memory`` is the peak less ``built``: what training
added to the weights. Both libraries use the cores npformer's runtime policy picks.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RUNS = ("npformer-full", "npformer-lora", "torch-full", "torch-peft")
SHAPE = dict(vocab_size=32000, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, d_ff=2048)
LORA = dict(rank=8, alpha=16.0, targets=["q_proj", "v_proj"])


def memory_kib(field):
    """``VmRSS`` or ``VmHWM`` of this process, in KiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def make_batch(np, a):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, SHAPE["vocab_size"], (a.batch, a.context + 1))
    return ids[:, :-1].copy(), ids[:, 1:].copy()


def npformer_step(a, use_lora):
    import numpy as np

    sys.path.insert(0, ROOT)
    import npformer as nf
    from npformer import lora

    model = nf.GPT(vocab_size=SHAPE["vocab_size"], d_model=SHAPE["d_model"],
                   n_layers=SHAPE["n_layers"], n_heads=SHAPE["n_heads"],
                   n_kv_heads=SHAPE["n_kv_heads"], d_ff=SHAPE["d_ff"], max_len=a.context,
                   dropout=0.0, positions="rotary", norm="rmsnorm", ffn="gated",
                   activation="silu", qkv_bias=False, proj_bias=False, tie_embeddings=True)
    if use_lora:
        lora.apply(model, rank=LORA["rank"], alpha=LORA["alpha"], target_modules=LORA["targets"])
    model.train()
    trained = int(model.flat_params.size)
    total = model.num_parameters()
    opt = nf.AdamW(model, lr=1e-4, weight_decay=0.0)
    inputs, targets = make_batch(np, a)

    def step():
        model.zero_grad()
        _, dlogits = nf.cross_entropy(model.forward(inputs), targets)
        model.backward(dlogits)
        opt.step()
    return step, trained, total


def torch_step(a, use_lora):
    import numpy as np
    import torch
    import transformers

    sys.path.insert(0, ROOT)
    from npformer.runtime import available_cores
    torch.set_num_threads(available_cores()[0])
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=SHAPE["vocab_size"], hidden_size=SHAPE["d_model"],
        intermediate_size=SHAPE["d_ff"], num_hidden_layers=SHAPE["n_layers"],
        num_attention_heads=SHAPE["n_heads"], num_key_value_heads=SHAPE["n_kv_heads"],
        max_position_embeddings=a.context, tie_word_embeddings=True,
        attn_implementation="eager")).train()
    total = sum(p.numel() for p in model.parameters())
    if use_lora:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=LORA["rank"], lora_alpha=LORA["alpha"], target_modules=LORA["targets"],
            lora_dropout=0.0, task_type="CAUSAL_LM"))
        total = sum(p.numel() for p in model.parameters())
    params = [p for p in model.parameters() if p.requires_grad]
    trained = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    inputs, targets = (torch.from_numpy(x) for x in make_batch(np, a))

    def step():
        opt.zero_grad()
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        loss.backward()
        opt.step()
    return step, trained, total


def child(a):
    """One run in this process: a JSON line on standard output."""
    library, kind = a.child.split("-")
    make = npformer_step if library == "npformer" else torch_step
    step, trained, total = make(a, kind in ("lora", "peft"))
    built = memory_kib("VmRSS")
    step()                                           # untimed: buffers, moments, scratch
    times = []
    for _ in range(a.repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = memory_kib("VmHWM")
    print(json.dumps({"run": a.child, "step_s": statistics.median(times), "times": times,
                      "trained": trained, "parameters": total, "built_mib": built / 1024,
                      "peak_mib": peak / 1024, "step_mib": (peak - built) / 1024}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    results = []
    for run in a.runs:
        out = subprocess.run([sys.executable, __file__, "--child", run, "--batch", str(a.batch),
                              "--context", str(a.context), "--repeats", str(a.repeats)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{run}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(f"{r['run']:14s} step {r['step_s']:7.3f} s (min {min(r['times']):6.3f})  "
              f"peak {r['peak_mib']:7.0f} MiB  "
              f"(weights built {r['built_mib']:6.0f} MiB, step +{r['step_mib']:6.0f} MiB)  "
              f"trained {r['trained']:,} of {r['parameters']:,}", flush=True)
    print(f"batch {a.batch} x context {a.context}, median of {a.repeats} steps after one "
          f"untimed; LoRA r={LORA['rank']} alpha={LORA['alpha']:g} on "
          f"{', '.join(LORA['targets'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
