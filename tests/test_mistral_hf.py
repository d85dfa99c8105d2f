"""The Mistral family against transformers: tiny random-weight MistralForCausalLM saved with
save_pretrained (float32, bfloat16, sharded), loaded by ``nf.from_pretrained`` without torch,
with a sliding window (4) shorter than the sequences (13 tokens) so that the window matters:
the same logits (float64 against test_llama_hf's ``exact_reference``, and stock), the loss and
every gradient, greedy tokens and cached steps past the window, and LoRA adapters both ways
with PEFT. A ``sliding_window`` of null is full attention. Reuses test_llama_hf's helpers."""
import json

import numpy as np
import pytest

import npformer as nf
from npformer.hf import read_model_config
import test_llama_hf as llama_tests
from test_llama_hf import batch, build, edited, exact_reference, tokenizer

torch = pytest.importorskip("torch", reason="PyTorch runs the reference; install torch==2.13.0")
transformers = pytest.importorskip("transformers",
                                   reason="the reference models: pip install transformers")

WINDOW = 4
# name: test_llama_hf's case tuple (model_type, heads, key/value heads, head_dim, tied, more)
CASES = {
    "mistral-window": ("mistral", 4, 2, None, False, {"sliding_window": WINDOW}),
    "mistral-full-tied": ("mistral", 4, 1, None, True, {"sliding_window": None}),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{case: (folder, float32 transformers model)}."""
    return {case: (path, build(path, spec, seed=20 + i))
            for i, (case, spec) in enumerate(CASES.items())
            for path in [tmp_path_factory.mktemp(case)]}


def test_the_config_reads_the_window(folders, tmp_path):
    config, _, model_type = read_model_config(folders["mistral-window"][0])
    assert model_type == "mistral" and config.family == "mistral"
    assert config.sliding_window == WINDOW and config.sliding_window_pattern is None
    assert (config.norm, config.ffn, config.activation, config.positions, config.n_kv_heads) \
        == ("rmsnorm", "gated", "silu", "rotary", 2)
    assert not config.qkv_bias and not config.proj_bias
    assert read_model_config(folders["mistral-full-tied"][0])[0].sliding_window is None
    absent = edited(folders["mistral-window"][0], tmp_path, sliding_window=None)
    assert read_model_config(absent)[0].sliding_window == 4096       # transformers' default


@pytest.mark.parametrize("value", [0, "4", 2.5, True])
def test_a_bad_window_is_one_error_naming_file_and_key(folders, tmp_path, value):
    folder = edited(folders["mistral-window"][0], tmp_path, sliding_window=value)
    with pytest.raises(ValueError, match=r"config\.json: sliding_window: expected a positive "
                                         r"integer"):
        nf.from_pretrained(folder)


# Llama's parity tests run on these folders (they read only folders[case])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype,reference,tol", [
    (np.float64, "exact", 1e-10), (np.float64, "stock", 1e-5), (np.float32, "stock", 1e-5)])
def test_logits_equal_transformers(folders, case, dtype, reference, tol):
    llama_tests.test_logits_equal_transformers(folders, case, dtype, reference, tol)


def test_the_window_matters(folders):
    """The same weights with full attention: the logits of the first WINDOW positions equal
    transformers', the later ones differ."""
    path, hf = folders["mistral-window"]
    ids = batch(hf.config.vocab_size)                                  # 13 tokens > WINDOW
    with torch.no_grad():
        expected = exact_reference(hf)(torch.tensor(ids)).logits.numpy()
    full = nf.from_pretrained(path, dtype=np.float64).reconfigured(sliding_window=None)
    got = full.forward(ids)
    np.testing.assert_allclose(got[:, :WINDOW], expected[:, :WINDOW], rtol=1e-10, atol=1e-10)
    assert np.abs(got[:, WINDOW:] - expected[:, WINDOW:]).min(axis=-1).max() > 1e-4


@pytest.mark.parametrize("case", CASES)
def test_loss_and_every_gradient_equal_transformers(folders, case):
    llama_tests.test_loss_and_every_gradient_equal_transformers(folders, case)


@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_and_cached_steps_past_the_window(folders, case):
    """Llama's test (10 new tokens: past the window of 4 twice over, transformers' generate
    with its own sliding cache; every cached step equal to the full forward)."""
    assert len(tokenizer().encode("hello world").ids) + 10 > 2 * WINDOW
    llama_tests.test_greedy_tokens_and_cached_steps(folders, case)


def test_bf16_weights_load_exactly(tmp_path):
    llama_tests.bf16_weights_load_exactly(tmp_path, CASES["mistral-window"])


def test_sharded_weights_load(tmp_path):
    (tmp_path / "sharded").mkdir()
    hf = build(tmp_path / "sharded", CASES["mistral-window"], seed=6, shard="20KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    hf.save_pretrained(tmp_path / "one")
    np.testing.assert_array_equal(
        nf.from_pretrained(tmp_path / "sharded", dtype=np.float64).flat_params,
        nf.from_pretrained(tmp_path / "one", dtype=np.float64).flat_params)


def test_lora_adapters_both_ways_with_peft(folders, tmp_path):
    """test_lora_peft's round trips on the windowed folder (npformer's adapter in PEFT: the same
    logits; PEFT's in npformer: its logits, loss and every lora_A/lora_B gradient, float64),
    then npformer's adapter continues greedily in PEFT as in npformer, past the window."""
    lp = pytest.importorskip("test_lora_peft")
    from npformer import lora_files
    case = "mistral-window"
    lp.test_npformer_adapter_loads_in_peft(folders, tmp_path, case)       # -> tmp_path/adapter
    lp.test_peft_adapter_loads_in_npformer_and_gradients_agree(folders, tmp_path, case)
    path, hf = folders[case]
    model = lora_files.load_peft(nf.from_pretrained(path, dtype=np.float64), tmp_path / "adapter")
    reference = lp.peft.PeftModel.from_pretrained(exact_reference(hf), tmp_path / "adapter")
    llama_tests.greedy_equals_generate(model.eval(), reference.double().eval(),
                                       tokenizer().encode("hello world").ids, 3 * WINDOW)
