"""The parts of a decoder block are declared once (npformer.parts): a feed-forward is "mlp" or
"gated" with ``activation`` applying to both (SwiGLU, GeGLU and ReGLU are configuration), the
model builds and initialises from the parts, nothing else compares a field with a kind's name,
and configurations recorded when the gated kind was "swiglu" load and resume to the bit.

tests/data/runs_recorded_with_swiglu holds the last checkpoint of a tiny ``lm --arch llama``
run made by the code before (its configuration says ``ffn: "swiglu"``), in lora/ the last
checkpoint of a LoRA run on it, and, in expected.json, how they were made, the sha256 of their
weights and of the weights of that code's resume of each. The
bits are those of one machine (expected.json's ``machine``); elsewhere the two bit tests skip,
saying why (as tests/test_same_bits.py does).
"""
import json
import re
from pathlib import Path

import numpy as np
import pytest

import npformer as nf
import same_bits
from npformer import functional as F
from npformer import parts
from npformer.checkpoint import load_checkpoint, save_checkpoint
from npformer.cli.main import main
from npformer.configs import GPTConfig
from npformer.nn.feedforward import GatedFeedForward
from npformer.training.checkpointing import load_model_checkpoint
from test_language_model import text_file  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parent.parent
RECORDED = Path(__file__).parent / "data" / "runs_recorded_with_swiglu"
EXPECTED = json.loads((RECORDED / "expected.json").read_text())
RUN = ["--arch", "llama", "--n-kv-heads", "1", "--d-model", "8", "--n-heads", "2", "--layers",
       "1", "--context", "8", "--batch-size", "4", "--warmup-steps", "1", "--eval-every", "2",
       "--sample-tokens", "4", "--quiet"]
SMALL = dict(vocab_size=11, d_model=12, n_heads=2, d_ff=8, n_layers=2, max_len=6, dropout=0.0,
             dtype=np.float64)


def _other_machine():
    """Why the recorded bits cannot be expected here, or None."""
    facts = same_bits.machine_facts()
    if facts["blas"] != EXPECTED["machine"]["blas"]:
        return (f"the recorded bits are those of BLAS {EXPECTED['machine']['blas']}, here "
                f"{facts['blas']}")
    return same_bits.other_cpu(facts, EXPECTED)


def test_a_configuration_recorded_with_swiglu_loads_as_gated_silu():
    stored = json.loads((RECORDED / "last.json").read_text())["meta"]["config"]
    assert (stored["ffn"], stored["activation"]) == ("swiglu", "gelu_tanh")     # as recorded
    recorded = load_model_checkpoint(str(RECORDED / "last")).model.config
    assert (recorded.ffn, recorded.activation) == ("gated", "silu")
    assert recorded == GPTConfig.from_dict(stored)
    # the migration is the configuration's own: from_dict, whatever the recorded activation was
    fields = dict(vocab_size=5, d_model=4, n_heads=2, d_ff=4, ffn="swiglu", activation="gelu")
    config = GPTConfig.from_dict(fields)
    assert (config.ffn, config.activation) == ("gated", "silu")
    assert GPTConfig.from_dict(config.to_dict()) == config
    # given as a field, the old name is refused, saying what it is now
    with pytest.raises(ValueError, match=r"ffn: expected one of mlp, gated, got 'swiglu' "
                                         r"\(which is now ffn='gated', activation='silu'\)"):
        GPTConfig(**fields)


def test_a_run_recorded_with_swiglu_resumes_with_the_bits_of_the_code_that_recorded_it(
        text_file, tmp_path):
    why = _other_machine()
    if why:
        pytest.skip(why)
    out = tmp_path / "resumed"
    assert main(["lm", "--data", str(text_file), "--resume", str(RECORDED / "last"),
                 "--max-steps", "3", "--quiet", "--out", str(out)]) == 0
    assert same_bits.weights_sha256(str(out / "last")) == EXPECTED["resumed_sha256"]


def test_a_lora_run_on_a_base_recorded_with_swiglu_resumes_with_the_bits_of_before(
        text_file, tmp_path):
    """A LoRA run whose base (./last) and whose own configuration were recorded with ffn
    "swiglu": both migrate, they still match, and the run goes on as the code that recorded it
    did. (Its checkpoint names the base by the absolute path it had; the copy written here,
    the same arrays, names the base where it lies now, as putting a base back does.)"""
    why = _other_machine()
    if why:
        pytest.skip(why)
    run = tmp_path / "lora" / "last"
    arrays, meta = load_checkpoint(RECORDED / "lora" / "last")
    assert meta["config"]["ffn"] == "swiglu"
    meta["lora"]["base"]["folder"] = str(RECORDED / "last")
    save_checkpoint(run, arrays, meta)
    assert same_bits.weights_sha256(str(run)) == EXPECTED["lora_recorded_sha256"]
    out = tmp_path / "resumed"
    assert main(["lm", "--data", str(text_file), "--resume", str(run), "--max-steps", "3",
                 "--quiet", "--out", str(out)]) == 0
    assert same_bits.weights_sha256(str(out / "last")) == EXPECTED["lora_resumed_sha256"]


def test_a_new_llama_run_has_the_bits_of_the_code_before(text_file, tmp_path):
    why = _other_machine()
    if why:
        pytest.skip(why)
    out = tmp_path / "new"
    assert main(["lm", "--data", str(text_file), *RUN, "--max-steps", "2", "--out", str(out)]) == 0
    assert same_bits.weights_sha256(str(out / "last")) == EXPECTED["recorded_sha256"]
    config = load_model_checkpoint(str(out / "last")).model.config
    assert (config.ffn, config.activation) == ("gated", "silu")


@pytest.mark.parametrize("activation", sorted(F.GATED_ACTIVATIONS))
def test_every_gated_activation_checks_by_central_differences(activation):
    rng = np.random.default_rng(0)
    h = rng.standard_normal((2, 3, 10))
    if activation == "relu":                     # away from the kink at 0
        h += np.sign(h) * 0.1

    def gated(h):
        out, cache = F.gated_forward(h, activation)
        return out, lambda d: F.gated_backward(d, cache)
    assert nf.gradcheck(gated, [h])
    act, _ = F.GATED_ACTIVATIONS[activation]
    out, _ = F.gated_forward(h, activation)
    np.testing.assert_array_equal(out, act(h[..., :5])[0] * h[..., 5:])


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu", "relu", "silu"])
def test_geglu_and_reglu_are_configuration_and_their_models_check(activation):
    """GeGLU and ReGLU are ffn "gated" with another activation: the same shapes as SwiGLU, the
    reference pair on the Numba backend (the fused SwiGLU kernel only for silu), gradients that
    check, and the same outputs on both backends."""
    model = nf.GPT(**SMALL, ffn="gated", activation=activation, seed=3)
    assert model.blocks[0].ffn._fused == (activation == "silu")
    assert model.config.parameter_count() == sum(p.data.size for _, p in
                                                 model.named_parameters())
    ids = np.array([[1, 4, 5, 6], [3, 0, 2, 10]])
    before = nf.get_backend()
    try:
        nf.set_backend("numpy")
        reference = model.forward(ids)
        nf.set_backend("numba")
        np.testing.assert_allclose(model.forward(ids), reference, rtol=1e-12, atol=1e-12)
    finally:
        nf.set_backend(before)
    assert nf.testing.check_model(model, (ids, np.roll(ids, -1, axis=1))).ok


def test_an_activation_the_feed_forward_cannot_apply_is_refused_by_name():
    with pytest.raises(ValueError, match=r"activation: expected one of relu, gelu, gelu_tanh "
                                         r"for ffn='mlp', got 'silu'"):
        GPTConfig(vocab_size=5, d_model=4, n_heads=2, d_ff=4, activation="silu")
    with pytest.raises(ValueError, match=r"activation: expected one of .*for a gated "
                                         r"feed-forward, got 'tanh'"):
        GatedFeedForward(4, 4, activation="tanh", rng=np.random.default_rng(0))


def test_a_new_norm_kind_is_one_entry_whose_starting_values_the_init_reads(monkeypatch):
    """Gemma's norm, say: an RMSNorm whose weight starts at 0 (its gain is 1 + w). One entry in
    the table: the configuration accepts it, the model builds it, the init starts it at 0."""
    monkeypatch.setitem(parts.NORMS, "zero_rmsnorm", parts.Part(
        "zero_rmsnorm", "rmsnorm.RMSNorm", ("weight",), {"weight": 0.0}))
    model = nf.GPT(**SMALL, norm="zero_rmsnorm")
    norms = [model.norm] + [n for block in model.blocks for n in block.norms()]
    assert all(isinstance(n, nf.nn.RMSNorm) and not n.weight.data.any() for n in norms)
    # the other parameters are drawn as before: the same draws as a model of rmsnorm's
    usual = nf.GPT(**SMALL, norm="rmsnorm")
    for (name, p), (_, q) in zip(model.named_parameters(), usual.named_parameters()):
        if p.data.ndim > 1:
            np.testing.assert_array_equal(p.data, q.data, err_msg=name)


def test_a_norm_with_a_gain_of_one_plus_w_is_one_entry_too():
    """Gemma's RMSNorm (gain 1 + w, w starting at 0) is a part: the module's option and the
    starting value. It computes what the plain RMSNorm does at the start, and its gradients
    check in float64 (the weight's is the gain's)."""
    assert parts.NORMS["rmsnorm_1p"] == parts.Part(
        "rmsnorm_1p", "rmsnorm.RMSNorm", ("weight",), {"weight": 0.0},
        options={"gain_offset": 1.0})
    model, usual = nf.GPT(**SMALL, norm="rmsnorm_1p"), nf.GPT(**SMALL, norm="rmsnorm")
    assert not model.norm.weight.data.any() and model.norm.gain_offset == 1.0
    ids = np.array([[1, 4, 5, 6], [3, 0, 2, 10]])
    np.testing.assert_array_equal(model.forward(ids), usual.forward(ids))
    model.norm.weight.data[...] = np.random.default_rng(1).standard_normal(12) * 0.1
    assert nf.testing.check_model(model, (ids, np.roll(ids, -1, axis=1))).ok


def test_parameter_count_is_one_blocks_shapes_times_the_layers():
    config = GPTConfig(vocab_size=10**6, n_layers=10**6, ffn="gated", activation="silu")
    one = config.replace(n_layers=1).parameter_shapes()
    block = sum(int(np.prod(s)) for n, s in one.items() if n.startswith("blocks.0."))
    assert block == 4 * 768 * 768 + 4 * 768 + 3 * 768 * 3072 + 2 * 3072 + 768 + 2 * 2 * 768
    assert config.parameter_count() == sum(int(np.prod(s)) for s in one.values()) \
        + (10**6 - 1) * block


def _comparisons(names):
    """A search for a comparison of a value with one of ``names`` quoted: == "x", != "x",
    "x" ==, or in (..., "x", ...) (a loop's ``for v in (...)`` is not one)."""
    quoted = "|".join(re.escape(name) for name in names)
    pattern = re.compile(rf"""(==|!=)\s*["']({quoted})["']|["']({quoted})["']\s*(==|!=)|"""
                         rf"""\bin\s*[\(\[{{][^\)\]}}]*["']({quoted})["']""")
    return lambda line: pattern.search(re.sub(r"\bfor\s+[\w, ()]+?\s+in\b", "for", line))


def test_no_code_but_the_part_specs_compares_with_a_block_kinds_name():
    """What a kind implies is read from npformer.parts, never re-derived from its name, in the
    package and the benchmarks. (The exercises are left out: their "swiglu" is an exercise's
    name, not a block kind; the tests state the values they expect.)"""
    kinds = set(parts.NORMS) | set(parts.FFNS) | set(parts.POSITIONS) | set(parts.RECORDED_FFNS)
    pattern = _comparisons(kinds)
    files = [p for p in sorted((ROOT / "npformer").rglob("*.py"))
             if p.name != "parts.py" and "exercises" not in p.parts]
    files += sorted((ROOT / "benchmarks").glob("*.py"))
    found = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
             for path in files for i, line in enumerate(path.read_text().splitlines(), 1)
             if pattern(line)]
    assert not found, "\n".join(found)
    finds = _comparisons(["rmsnorm", "swiglu"])                              # (it finds them)
    assert finds('if c.norm == "rmsnorm":') and finds("ffn in ('mlp', 'swiglu')")
    assert not finds('for name in ("rmsnorm", "swiglu"):')
