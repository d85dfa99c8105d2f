"""Peak memory of loading a Hugging Face Llama-style model with ``npformer.from_pretrained``,
against the size of its float32 weights (and, where transformers is installed, against
``LlamaForCausalLM.from_pretrained`` of the same folder in float32).

    python benchmarks/bench_load_memory.py                      # ~100 M parameters, bf16, 2 shards
    python benchmarks/bench_load_memory.py --dtype F32 --shards 1
    python benchmarks/bench_load_memory.py --initialised        # also: the model built with
                                                                # random weights first (as before)

The script writes a random model of the shape asked (config.json and safetensors shards,
written tensor by tensor by the few lines below, no PyTorch) into a temporary folder, then
loads it in a fresh process per loader. Each process reports its resident memory after its
imports (the baseline) and its peak (``VmHWM``) after the load, so the ratios are measured in
the same run: peak over the float32 weights, and peak less baseline over them (what the load
itself cost).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_lora import memory_kib  # noqa: E402  (VmRSS / VmHWM of this process, KiB)


def tensor_shapes(a):
    """{Hugging Face name: shape} of a LlamaForCausalLM with these sizes."""
    head = a.d_model // a.heads
    shapes = {"model.embed_tokens.weight": (a.vocab, a.d_model)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (a.heads * head, a.d_model),
            p + "self_attn.k_proj.weight": (a.kv_heads * head, a.d_model),
            p + "self_attn.v_proj.weight": (a.kv_heads * head, a.d_model),
            p + "self_attn.o_proj.weight": (a.d_model, a.heads * head),
            p + "mlp.gate_proj.weight": (a.d_ff, a.d_model),
            p + "mlp.up_proj.weight": (a.d_ff, a.d_model),
            p + "mlp.down_proj.weight": (a.d_model, a.d_ff),
            p + "input_layernorm.weight": (a.d_model,),
            p + "post_attention_layernorm.weight": (a.d_model,),
        })
    shapes["model.norm.weight"] = (a.d_model,)
    if not a.tied:
        shapes["lm_head.weight"] = (a.vocab, a.d_model)
    return shapes


def encoded(values, dtype):
    """The bytes of float32 ``values`` stored as ``dtype`` ("F32" or "BF16": the upper 16 bits,
    rounded to nearest even)."""
    if dtype == "F32":
        return values.astype("<f4").tobytes()
    sys.path.insert(0, os.path.dirname(HERE))
    from npformer.formats.safetensors import to_bfloat16
    return to_bfloat16(values).astype("<u2").tobytes()


def write_model(folder, a):
    """config.json and ``a.shards`` safetensors files (with an index when more than one) of a
    random model; returns the parameter count."""
    shapes = tensor_shapes(a)
    names = list(shapes)
    groups = [names[i::a.shards] for i in range(a.shards)] if a.shards > 1 else [names]
    itemsize = 4 if a.dtype == "F32" else 2
    rng = np.random.default_rng(0)
    weight_map = {}
    for k, group in enumerate(groups):
        file = ("model.safetensors" if a.shards == 1
                else f"model-{k + 1:05d}-of-{a.shards:05d}.safetensors")
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name in group:
            n = int(np.prod(shapes[name])) * itemsize
            header[name] = {"dtype": a.dtype, "shape": list(shapes[name]),
                            "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = file
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(folder, file), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for name in group:                             # one tensor in memory at a time
                shape = shapes[name]
                values = (np.ones(shape, np.float32) if len(shape) == 1 else
                          (rng.standard_normal(shape, dtype=np.float32) * 0.02))
                f.write(encoded(values, a.dtype))
    if a.shards > 1:
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "hidden_size": a.d_model, "intermediate_size": a.d_ff,
              "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
              "num_hidden_layers": a.layers, "vocab_size": a.vocab,
              "max_position_embeddings": a.context, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": a.tied, "hidden_act": "silu",
              "torch_dtype": "bfloat16" if a.dtype == "BF16" else "float32",
              "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return sum(int(np.prod(s)) for s in shapes.values())


# -- the measuring process ---------------------------------------------------------------------
def measure(loader, folder):
    """Runs in its own process: imports, baseline RSS, the load, peak RSS; prints JSON."""
    if loader == "torch":
        import torch
        import transformers
        torch.set_num_threads(1)
        base = memory_kib("VmRSS")
        model = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
        count = sum(p.numel() for p in model.parameters())
    else:
        import npformer as nf
        if loader == "npformer-initialised":         # the model built with random weights
            import contextlib
            import npformer.nn.init as init
            init.uninitialised = contextlib.nullcontext
        base = memory_kib("VmRSS")
        model = nf.from_pretrained(folder)
        count = model.num_parameters()
    print(json.dumps({"baseline_kib": base, "peak_kib": memory_kib("VmHWM"),
                      "parameters": int(count)}))


def run_loader(loader, folder):
    # a fresh process: its peak is the load's alone. VmHWM counts from the process start, so the
    # imports' own peak is in it too (small against the weights).
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", loader, folder],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{loader}: failed\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--untied", dest="tied", action="store_false",
                   help="an lm_head of its own (default: tied to the embedding)")
    p.add_argument("--dtype", choices=("BF16", "F32"), default="BF16")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--initialised", action="store_true",
                   help="also load with the model built with random weights first")
    p.add_argument("--no-torch", action="store_true", help="skip transformers' loader")
    p.add_argument("--measure", nargs=2, metavar=("LOADER", "DIR"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.measure:
        return measure(*a.measure)
    with tempfile.TemporaryDirectory(prefix="npformer-load-") as folder:
        count = write_model(folder, a)
        weights = count * 4
        files = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        print(f"a random Llama-style model: {count / 1e6:.1f} M parameters (d_model {a.d_model}, "
              f"{a.layers} layers, {a.heads} heads / {a.kv_heads} key-value, d_ff {a.d_ff}, "
              f"vocabulary {a.vocab}, {'tied' if a.tied else 'untied'}), {a.dtype} in "
              f"{a.shards} shard(s): {files / 2**20:,.0f} MiB of files, "
              f"{weights / 2**20:,.0f} MiB of float32 weights")
        loaders = ["npformer"] + (["npformer-initialised"] if a.initialised else [])
        if not a.no_torch:
            try:
                import transformers  # noqa: F401
                loaders.append("torch")
            except ImportError:
                print("transformers is not installed: its loader is not measured")
        print(f"{'loader':<22} {'baseline MiB':>13} {'peak MiB':>9} {'peak / weights':>15} "
              f"{'(peak - baseline) / weights':>28}")
        for loader in loaders:
            r = run_loader(loader, folder)
            if r["parameters"] != count:
                raise SystemExit(f"{loader}: loaded {r['parameters']} parameters, wrote {count}")
            base, peak = r["baseline_kib"] * 1024, r["peak_kib"] * 1024
            name = {"torch": "transformers (torch)"}.get(loader, loader)
            print(f"{name:<22} {base / 2**20:>13,.0f} {peak / 2**20:>9,.0f} "
                  f"{peak / weights:>14.2f}x {(peak - base) / weights:>27.2f}x", flush=True)


if __name__ == "__main__":
    main()
