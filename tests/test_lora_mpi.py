"""LoRA under mpiexec: a two-rank ``npformer lm --lora-rank`` run reduces the adapters' gradients
alone (the frozen base is read by every rank from its folder, not broadcast) and writes one run
whose checkpoints hold the adapters; ranks whose bases differ are refused, naming it. Skips
where mpiexec or mpi4py is absent (the ``mpi`` extra)."""
import json

import numpy as np

import npformer as nf
from npformer.checkpoint import load_checkpoint
from npformer.data.characters import CharTokenizer
from npformer.data.vocab import Vocabularies
from npformer.training.checkpointing import save_model_checkpoint
from test_mpi import PLAIN, mpirun, needs_mpi

TEXT = "the quick brown fox jumps over the lazy dog. hello world, hello npformer.\n" * 40


def base_checkpoint(path, seed=0):
    """An npformer GPT with Llama's block over the text's characters: the base to adapt."""
    tokenizer = CharTokenizer.from_text(TEXT)
    model = nf.GPT(vocab_size=len(tokenizer), d_model=32, n_heads=4, n_kv_heads=2, d_ff=48,
                   n_layers=2, max_len=32, dropout=0.0, positions="rotary", norm="rmsnorm",
                   ffn="gated", activation="silu", qkv_bias=False, proj_bias=False, seed=seed)
    save_model_checkpoint(path, model, Vocabularies.joint(tokenizer.vocab))
    return path


def lm(data, base, out):
    return ["lm", "--data", data, "--init-from", base, "--out", out, "--lora-rank", "2",
            "--lora-targets", "q_proj", "v_proj", "o_proj", "--context", "16", "--batch-size",
            "4", "--max-steps", "3", "--eval-every", "3", "--sample-tokens", "0", "--quiet"]


@needs_mpi
def test_two_rank_lora_run_trains_the_adapters_alone(tmp_path):
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    base = base_checkpoint(tmp_path / "base")
    r = mpirun((2, PLAIN + lm(data, base, tmp_path / "run")))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("done:") == 1
    arrays, meta = load_checkpoint(tmp_path / "run" / "last")
    weights = [k for k in arrays if k.startswith("model/")]
    assert weights and all(k.endswith((".A", ".B")) for k in weights)
    assert arrays["optim/exp_avg"].size == sum(arrays[k].size for k in weights)
    assert any(np.abs(arrays[k]).max() > 0 for k in weights if k.endswith(".B"))   # it learnt
    assert meta["lora"]["rank"] == 2 and meta["lora"]["base"]["sha256"]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records if r["event"] == "eval"] == [3]


@needs_mpi
def test_ranks_with_other_bases_are_refused(tmp_path):
    """The same command line in two folders whose base checkpoints differ (same shapes): the
    ranks compare the hashes of their bases before the first step."""
    for seed, folder in enumerate((tmp_path / "a", tmp_path / "b")):
        folder.mkdir()
        (folder / "text.txt").write_text(TEXT)
        base_checkpoint(folder / "base", seed=seed)
    argv = PLAIN + lm("text.txt", "base", "run")
    r = mpirun((1, argv, tmp_path / "a"), (1, argv, tmp_path / "b"))
    assert r.returncode != 0
    assert "LoRA adapters or base weights" in r.stderr, r.stderr[-2000:]
