"""GPT-2 goes through the same loader and the same LoRA files as the Llama family: a bfloat16
folder loads; an npformer adapter leaves as PEFT's files (``fan_in_fan_out``: GPT-2's Conv1D
layers store their weights transposed) that PEFT loads, a PEFT adapter loads in npformer with
PEFT's logits and gradients, and the merged export loads in transformers (float64 references,
as tests/test_lora_peft.py holds the Llama adapters)."""
import json

import numpy as np
import pytest

import npformer as nf
from npformer import lora, lora_files

torch = pytest.importorskip("torch", reason="PyTorch runs the reference; install torch==2.13.0")
transformers = pytest.importorskip("transformers",
                                   reason="the reference models: pip install transformers")
peft = pytest.importorskip("peft", reason="the PEFT round trips: pip install peft accelerate")
pytest.importorskip("safetensors", reason="extra hf: pip install 'npformer[hf]'")
from test_lora_peft import agrees_with_peft, peft_made, randomise  # noqa: E402

torch.set_num_threads(1)
TARGETS = ["c_attn", "c_proj", "c_fc"]        # PEFT's names of GPT-2's Conv1D layers


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(folder, float32 GPT2LMHeadModel) of a tiny random GPT-2."""
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)).eval()
    path = tmp_path_factory.mktemp("gpt2")
    ref.save_pretrained(path, safe_serialization=True)
    return path, ref


def ids_and_targets(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 50, (2, 7)), rng.integers(0, 50, (2, 7))


def reference(hf):
    """A float64 copy of the transformers model."""
    copy = transformers.GPT2LMHeadModel(hf.config)
    copy.load_state_dict(hf.state_dict())
    return copy.double().eval()


def test_a_gpt2_model_records_its_family_and_adapts_c_attn_by_default(gpt2):
    model = nf.from_pretrained(gpt2[0])
    assert model.config.family == "gpt2"
    lora.apply(model, rank=2)
    assert model.lora.targets == ("c_attn",)
    assert lora.available_targets(nf.from_pretrained(gpt2[0]))[:3] == TARGETS


def test_a_bfloat16_gpt2_folder_loads_through_the_one_loader(gpt2, tmp_path):
    path, hf = gpt2
    half = transformers.GPT2LMHeadModel(hf.config)
    half.load_state_dict(hf.state_dict())
    half.to(torch.bfloat16).save_pretrained(tmp_path, safe_serialization=True)
    model = nf.from_pretrained(tmp_path, dtype=np.float64)
    widened = half.transformer.h[1].attn.c_attn.weight.detach().float().numpy()
    np.testing.assert_array_equal(model.blocks[1].self_attn.in_proj_weight.data, widened.T)


def test_npformer_gpt2_adapter_loads_in_peft(gpt2, tmp_path):
    path, hf = gpt2
    model = lora.apply(nf.from_pretrained(path, dtype=np.float64), rank=3, alpha=6.0,
                       target_modules=TARGETS)
    randomise(model)
    lora_files.save_peft(model, tmp_path / "adapter", str(path))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["fan_in_fan_out"] is True and sorted(config["target_modules"]) == \
        ["attn.c_proj", "c_attn", "c_fc", "mlp.c_proj"]
    theirs = peft.PeftModel.from_pretrained(reference(hf), tmp_path / "adapter").eval()
    ids, _ = ids_and_targets()
    with torch.no_grad():
        expected = theirs(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(model.eval().forward(ids), expected, rtol=0, atol=1e-10)


def test_peft_gpt2_adapter_loads_in_npformer_and_gradients_agree(gpt2, tmp_path):
    path, hf = gpt2
    pm = peft_made(hf, tmp_path, TARGETS, reference=reference, fan_in_fan_out=True)
    model = lora_files.load_peft(nf.from_pretrained(path, dtype=np.float64), tmp_path / "peft")
    assert agrees_with_peft(pm, model, *ids_and_targets(seed=3)) == 2 * 2 * 4   # 4 modules


def test_a_gpt2_adapter_that_says_its_layers_are_not_transposed_is_refused(gpt2, tmp_path):
    path, _ = gpt2
    model = lora.apply(nf.from_pretrained(path, dtype=np.float64), rank=2)
    lora_files.save_peft(model, tmp_path / "peft", str(path))
    file = tmp_path / "peft" / "adapter_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "fan_in_fan_out": False}))
    with pytest.raises(ValueError, match=r"adapter_config\.json: fan_in_fan_out: expected true "
                                         r"for transformer\.h\.0\.attn\.c_attn of a GPT-2 base"):
        lora_files.load_peft(nf.from_pretrained(path, dtype=np.float64), tmp_path / "peft")


def test_gpt2_merged_export_loads_in_transformers(gpt2, tmp_path):
    path, _ = gpt2
    model = lora.apply(nf.from_pretrained(path), rank=3, alpha=6.0, target_modules=TARGETS)
    randomise(model)
    ids, _ = ids_and_targets()
    ours = model.eval().forward(ids)
    lora_files.save_merged(model, path, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        np.testing.assert_allclose(merged(torch.tensor(ids)).logits.numpy(), ours, atol=2e-5)
