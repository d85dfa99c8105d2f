"""Per-layer gradient norms: the metric (``npformer.training.grad_norms``), its "train" records in
every run's metrics log, and ``npformer plot --grad-norms``."""
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import npformer as nf
from npformer.cli.main import main
from npformer.optim.clip import grad_norm
from npformer.training.grad_norms import layer_grad_norms, layer_of
from npformer.training.metrics_log import read_metrics_log

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, layer", [
    ("encoder.layers.0.ffn.linear1.weight", "encoder.layers.0"),
    ("decoder.layers.11.multihead_attn.in_proj_bias", "decoder.layers.11"),
    ("blocks.3.norm1.weight", "blocks.3"),
    ("decoder.norm.weight", "decoder.norm"),
    ("src_embed.weight", "src_embed"),
    ("weight", "weight")])
def test_layer_of(name, layer):
    assert layer_of(name) == layer


def test_the_layers_norms_make_up_the_whole_norm_in_the_order_of_depth():
    model = nf.Transformer(30, 31, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
                           n_decoder_layers=2, max_len=12, dtype=np.float64)
    rng = np.random.default_rng(0)
    logits = model.forward(rng.integers(1, 30, (3, 7)), rng.integers(1, 31, (3, 6)))
    _, dlogits = nf.cross_entropy(logits, rng.integers(1, 31, (3, 6)), ignore_index=0)
    model.zero_grad()
    model.backward(dlogits)
    before = model.flat_grads.copy()
    norms = layer_grad_norms(model)
    assert list(norms) == ["src_embed", "tgt_embed", "encoder.layers.0", "encoder.layers.1",
                           "encoder.norm", "decoder.layers.0", "decoder.layers.1",
                           "decoder.norm", "generator"]
    assert math.isclose(math.sqrt(sum(v * v for v in norms.values())), grad_norm(model),
                        rel_tol=1e-12)
    by_hand = np.sqrt(sum(np.sum(p.grad ** 2) for n, p in model.named_parameters()
                          if n.startswith("encoder.layers.1.")))
    assert math.isclose(norms["encoder.layers.1"], by_hand, rel_tol=1e-12)
    assert np.array_equal(model.flat_grads, before)           # read, never changed


def test_frozen_parameters_are_left_out():
    model = nf.Transformer(30, 31, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
                           n_decoder_layers=1, max_len=12, dtype=np.float64)
    model.encoder.layers[0].freeze()
    model.src_embed.weight.freeze()
    rng = np.random.default_rng(0)
    logits = model.forward(rng.integers(1, 30, (2, 5)), rng.integers(1, 31, (2, 4)))
    _, dlogits = nf.cross_entropy(logits, rng.integers(1, 31, (2, 4)), ignore_index=0)
    model.zero_grad()
    model.backward(dlogits)
    norms = layer_grad_norms(model)
    assert "encoder.layers.0" not in norms and "src_embed" not in norms
    assert "encoder.layers.1" in norms
    assert math.isclose(math.sqrt(sum(v * v for v in norms.values())),
                        float(np.sqrt(np.sum(model.flat_grads ** 2))), rel_tol=1e-12)


def test_every_train_record_holds_the_norms_before_clipping(run_dir):
    out, _ = run_dir                                         # log_every=1
    train = [r for r in read_metrics_log(out / "metrics.jsonl") if r["event"] == "train"]
    assert train and all("grad_norms" in r for r in train)
    for r in train:
        layers = r["grad_norms"]
        assert "encoder.layers.0" in layers and "decoder.layers.0" in layers
        assert all(v > 0 for v in layers.values())
        whole = math.sqrt(sum(v * v for v in layers.values()))
        assert math.isclose(whole, r["grad_norm"], rel_tol=1e-4)   # float32 sums


def test_plot_grad_norms_draws_one_panel_per_run(run_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out, _ = run_dir
    log = str(out / "metrics.jsonl")
    assert main(["plot", "--grad-norms", log, log, "--out", str(tmp_path / "p")]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(tmp_path / "p" / "grad_norms.png")]
    assert (tmp_path / "p" / "grad_norms.png").stat().st_size > 1000
    assert "warning" not in captured.err


def test_plot_grad_norms_of_a_log_without_them_is_one_line(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    log = tmp_path / "old" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text(json.dumps({"event": "train", "step": 1, "loss": 2.0}) + "\n")
    assert main(["plot", "--grad-norms", str(log), "--out", str(tmp_path / "p")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(log) in err and "grad_norms" in err
    log.write_text(json.dumps({"event": "train", "step": 1, "grad_norms": {"a": "x"}}) + "\n")
    assert main(["plot", "--grad-norms", str(log), "--out", str(tmp_path / "p")]) == 1
    assert "step 1: grad_norms expected" in capsys.readouterr().err
    assert main(["plot", "--grad-norms", str(tmp_path / "nothing.jsonl")]) == 1
    assert "--grad-norms " + str(tmp_path / "nothing.jsonl") + ": no such file" in capsys.readouterr().err


MPIEXEC = shutil.which("mpiexec")


@pytest.mark.skipif(MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
                    reason="needs mpiexec and mpi4py: pip install 'npformer[mpi]'")
def test_under_mpi_rank_0_logs_the_norms_of_the_summed_gradient(tmp_path):
    """2 ranks, a batch each per update, against one process accumulating the same 2 batches:
    the logged per-layer norms are those of the whole update's gradient (rank 0's own half
    would be another), and one log is written."""
    toy = [sys.executable, "-m", "npformer", "train", "--dataset", "toy", "--quiet",
           "--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--layers", "1", "--dropout", "0",
           "--batch-size", "16", "--max-steps", "10", "--reduce", "ordered"]
    env = {**os.environ, "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))}
    r = subprocess.run([MPIEXEC, "-n", "2"] + toy + ["--out", str(tmp_path / "two")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run(toy + ["--accum-steps", "2", "--out", str(tmp_path / "one")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    two, one = ([rec for rec in read_metrics_log(tmp_path / run / "metrics.jsonl")
                 if rec["event"] == "train"] for run in ("two", "one"))
    assert [rec["step"] for rec in two] == [rec["step"] for rec in one] == [10]
    assert two[0]["grad_norms"].keys() == one[0]["grad_norms"].keys()
    for layer, norm in one[0]["grad_norms"].items():
        assert math.isclose(two[0]["grad_norms"][layer], norm, rel_tol=1e-4), layer
