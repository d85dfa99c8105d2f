"""LoRA against Hugging Face PEFT, both ways, on tiny random-weight Llama and Qwen2 folders
(tests/test_llama_hf.py's): npformer's adapters load with ``PeftModel.from_pretrained`` and give
npformer's logits; PEFT's adapters load into npformer and give PEFT's logits; the gradients of
every lora_A and lora_B equal PEFT's in float64; a merged export loads in transformers (float32,
bfloat16); the commands (lm --lora-rank, sample --adapter, export --format peft / hf --merge)
end to end; bad adapter folders refused naming the file. Float64 comparisons are against
PEFT over test_llama_hf's ``exact_reference`` (RMSNorm and rotary angles without Hugging Face's
float32 casts). Skips where torch, transformers or peft are absent (.ci/run installs them)."""
import json

import numpy as np
import pytest

import npformer as nf
from npformer import lora, lora_files
from npformer.cli.main import main

torch = pytest.importorskip("torch", reason="PyTorch runs the reference; install torch==2.13.0")
transformers = pytest.importorskip("transformers",
                                   reason="the reference models: pip install transformers")
peft = pytest.importorskip("peft", reason="the PEFT round trips: pip install peft accelerate "
                                          "(.ci/run installs them beside torch)")
pytest.importorskip("safetensors", reason="extra hf: pip install 'npformer[hf]'")
from test_llama_hf import TEXT, build, exact_reference  # noqa: E402

torch.set_num_threads(1)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CASES = ("llama-gqa-llama3", "qwen2-mqa")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{case: (folder, float32 transformers model)}."""
    out = {}
    for i, case in enumerate(CASES):
        path = tmp_path_factory.mktemp(case)
        out[case] = path, build(path, case, seed=10 + i)
    return out


def ids_and_targets(vocab, seed=0, shape=(2, 9)):
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, shape), rng.integers(0, vocab, shape)


def randomise(model, seed=1):
    rng = np.random.default_rng(seed)
    for _, m in lora.adapters(model):
        m.B.data[...] = rng.standard_normal(m.B.data.shape) * 0.2
        m.A.data[...] += rng.standard_normal(m.A.data.shape) * 0.1


def peft_logits(peft_model, ids):
    with torch.no_grad():
        return peft_model(torch.tensor(ids)).logits.numpy()


@pytest.mark.parametrize("case", CASES)
def test_npformer_adapter_loads_in_peft(folders, tmp_path, case):
    path, hf = folders[case]
    model = lora.apply(nf.from_pretrained(path, dtype=np.float64), rank=4, alpha=8.0,
                       target_modules=ALL)
    randomise(model)
    lora_files.save_peft(model, tmp_path / "adapter", str(path))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and sorted(config["target_modules"]) \
        == sorted(ALL)
    reference = peft.PeftModel.from_pretrained(exact_reference(hf), tmp_path / "adapter").eval()
    ids, _ = ids_and_targets(model.config.vocab_size)
    np.testing.assert_allclose(model.eval().forward(ids), peft_logits(reference.double(), ids),
                               rtol=0, atol=1e-10)


def peft_made(hf, tmp_path, targets=ALL, r=3, alpha=5.0, seed=0, reference=exact_reference,
              **options):
    """An adapter made by PEFT over the float64 ``reference`` of ``hf`` (``options``: more of
    ``LoraConfig``'s), lora_B random; saved."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                             task_type="CAUSAL_LM", **options)
    pm = peft.get_peft_model(reference(hf), config)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    pm = pm.double()
    pm.save_pretrained(tmp_path / "peft")
    return pm


@pytest.mark.parametrize("case", CASES)
def test_peft_adapter_loads_in_npformer_and_gradients_agree(folders, tmp_path, case):
    """PEFT's adapter file gives PEFT's logits in npformer, and for one batch every lora_A and
    lora_B gradient equals PEFT's (float64)."""
    path, hf = folders[case]
    pm = peft_made(hf, tmp_path)
    model = lora_files.load_peft(nf.from_pretrained(path, dtype=np.float64), tmp_path / "peft")
    assert agrees_with_peft(pm, model, *ids_and_targets(model.config.vocab_size, seed=3)) == \
        2 * len(ALL) * 2


def agrees_with_peft(pm, model, ids, targets):
    """Hold ``model`` (a PEFT adapter loaded in npformer) against PEFT's ``pm``: the logits,
    the loss and, for one batch, every lora_A and lora_B gradient (float64). Returns how many
    gradients were held, every one of PEFT's."""
    pm.eval()
    model.eval()
    logits = pm(torch.tensor(ids)).logits
    np.testing.assert_allclose(model.forward(ids), logits.detach().numpy(), rtol=0, atol=1e-10)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.tensor(targets).reshape(-1))
    loss.backward()
    theirs = {n.replace(".default", ""): p.grad.numpy() for n, p in pm.named_parameters()
              if "lora_" in n}
    model.zero_grad()
    mean, dlogits = nf.cross_entropy(model.forward(ids), targets)
    model.backward(dlogits)
    assert abs(float(mean) - loss.item()) < 1e-12
    names = lora_files.hf_modules(model)
    checked = 0
    for _, m in lora.adapters(model):
        module, _ = names[(lora.weight_name(model, m), m.start, m.stop)]
        for ours, key in ((m.A, "lora_A"), (m.B, "lora_B")):
            ref = theirs[f"{lora_files.PEFT_PREFIX}{module}.{key}.weight"]
            np.testing.assert_allclose(ours.grad, ref, rtol=1e-8, atol=1e-12 * np.abs(ref).max())
            checked += 1
    assert checked == len(theirs)
    return checked


def test_merged_export_loads_in_transformers(folders, tmp_path):
    path, hf = folders["llama-gqa-llama3"]
    model = lora.apply(nf.from_pretrained(path), rank=4, alpha=8.0, target_modules=ALL)
    randomise(model)
    ids, _ = ids_and_targets(model.config.vocab_size)
    ours = model.eval().forward(ids)
    lora_files.save_merged(model, path, tmp_path / "f32")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f32").eval()
    with torch.no_grad():
        np.testing.assert_allclose(merged(torch.tensor(ids)).logits.numpy(), ours, atol=2e-5)
    lora_files.save_merged(model, path, tmp_path / "bf16", "bfloat16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    half = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16",
                                                             dtype=torch.bfloat16).eval()
    assert half.model.embed_tokens.weight.dtype == torch.bfloat16
    w = half.model.layers[0].self_attn.q_proj.weight.detach().float().numpy()
    exact = lora_files.merged_tensors(model)["model.layers.0.self_attn.q_proj.weight"]
    np.testing.assert_allclose(w, exact, rtol=2 ** -8, atol=1e-30)      # bf16's rounding


def test_commands_fine_tune_sample_export(folders, tmp_path, capsys):
    """lm --init-from --lora-rank trains adapters only (checkpoints hold them alone), sample
    --hf --adapter gives sample --checkpoint's text, export --format peft loads in PEFT with
    npformer's logits, export --format hf --merge loads in transformers."""
    path, hf = folders["qwen2-mqa"]
    data = tmp_path / "text.txt"
    data.write_text("\n".join(TEXT) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    assert main(["lm", "--data", str(data), "--init-from", str(path), "--out", str(run),
                 "--lora-rank", "4", "--lora-alpha", "8", "--lora-dropout", "0.1",
                 "--lora-targets", "q_proj", "v_proj", "down_proj", "--lr", "0.01",
                 "--context", "16", "--batch-size", "2", "--max-steps", "3", "--eval-every", "3",
                 "--sample-tokens", "0", "--quiet"]) == 0
    capsys.readouterr()
    args = ["--prompt", "hello world", "--max-new-tokens", "4", "--greedy"]
    assert main(["sample", "--hf", str(path), "--adapter", str(run / "best"), *args]) == 0
    with_adapter = capsys.readouterr().out
    assert main(["sample", "--checkpoint", str(run / "best"), *args]) == 0
    assert capsys.readouterr().out == with_adapter
    assert main(["export", "--checkpoint", str(run / "best"), "--format", "peft", "--out",
                 str(tmp_path / "peft")]) == 0
    from npformer.training.checkpointing import load_model_checkpoint
    ours = load_model_checkpoint(run / "best").model
    assert any(np.abs(m.B.data).max() > 0 for _, m in lora.adapters(ours))     # it trained
    ids, _ = ids_and_targets(ours.config.vocab_size)
    pm = peft.PeftModel.from_pretrained(hf, tmp_path / "peft").eval()
    np.testing.assert_allclose(peft_logits(pm, ids), ours.forward(ids), atol=2e-5)
    assert main(["export", "--checkpoint", str(run / "best"), "--format", "hf", "--merge",
                 "--out", str(tmp_path / "merged")]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        np.testing.assert_allclose(merged(torch.tensor(ids)).logits.numpy(),
                                   ours.forward(ids), atol=2e-5)
    export = ["export", "--checkpoint", str(run / "best"), "--format", "peft", "--out"]
    assert main(export + [str(tmp_path / "peft")]) == 1               # never replaced by accident
    assert "already exists" in capsys.readouterr().err
    assert main(export + [str(tmp_path / "peft"), "--overwrite"]) == 0   # an earlier export
    assert peft.PeftModel.from_pretrained(hf, tmp_path / "peft") is not None
    capsys.readouterr()
    assert main(export + [str(path), "--overwrite"]) == 1           # the base model's own folder
    assert "not an npformer --format peft export" in capsys.readouterr().err
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temporaries


def test_a_lora_run_reads_config_json_no_more_than_a_full_fine_tuning(folders, tmp_path,
                                                                      monkeypatch):
    """The base's model_type comes from the reading of config.json that loaded the model, not
    from another; the run records it with the folder."""
    from npformer import hf
    from npformer.training.language_model import lm_trainer
    path, _ = folders["qwen2-mqa"]
    data = tmp_path / "text.txt"
    data.write_text("\n".join(TEXT) + "\n", encoding="utf-8")
    reads, real = [], hf._config_json
    monkeypatch.setattr(hf, "_config_json", lambda folder: reads.append(folder) or real(folder))
    counts = []
    for settings in (None, {"rank": 2, "alpha": 4.0, "dropout": 0.0, "targets": ["q_proj"]}):
        reads.clear()
        trainer, _ = lm_trainer(data, {}, {"max_steps": 1}, context=8, init_from=str(path),
                                sample_tokens=0, lora=settings)
        counts.append(len(reads))
    assert counts[1] == counts[0] > 0
    assert trainer.model.lora.base == {"folder": str(path.resolve()), "kind": "hf",
                                       "model_type": "qwen2"}


# -- bad adapter folders --------------------------------------------------------------------------
def rewrite(folder, edit):
    """Edit the tensors of adapter_model.safetensors with ``edit({name: array})``."""
    from safetensors.numpy import load_file, save_file
    file = folder / "adapter_model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def first(tensors, suffix):
    return next(k for k in sorted(tensors) if k.endswith(suffix))


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.pop(first(t, "lora_A.weight")), "missing"),
    (lambda t: t.__setitem__("base_model.model.lm_head.lora_A.weight", np.zeros((3, 32))),
     "unexpected"),
    (lambda t: t.__setitem__(first(t, "lora_B.weight"), np.zeros((5, 3))), "expected shape"),
    (lambda t: t.__setitem__(first(t, "lora_A.weight"),
                             np.full(t[first(t, "lora_A.weight")].shape, np.inf)),
     r"lora_A.weight: expected finite weights \(in float64\), got inf"),
    (lambda t: t.__setitem__(first(t, "lora_A.weight"),
                             t[first(t, "lora_A.weight")].astype(np.int32)),
     r"expected floating-point weights \(F64, F32, F16, BF16\), got I32"),
])
def test_bad_adapter_tensors_are_refused(folders, tmp_path, edit, message):
    path, hf = folders["llama-gqa-llama3"]
    peft_made(hf, tmp_path, targets=["q_proj", "v_proj"])
    rewrite(tmp_path / "peft", edit)
    with pytest.raises(ValueError, match=message):
        lora_files.load_peft(nf.from_pretrained(path, dtype=np.float64), tmp_path / "peft")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_bfloat16_adapter_loads_as_its_values_widened(folders, tmp_path, dtype):
    """PEFT saves adapters in the dtype of its model, bfloat16 too: they load through the
    reader of the model's weights, every value its float32 up-cast exactly."""
    from safetensors.torch import load_file, save_file
    path, hf = folders["llama-gqa-llama3"]
    peft_made(hf, tmp_path, targets=["q_proj", "v_proj", "down_proj"])
    file = tmp_path / "peft" / "adapter_model.safetensors"
    half = {k: v.to(torch.bfloat16) for k, v in load_file(file).items()}
    save_file(half, file, metadata={"format": "pt"})
    assert {t.dtype for t in nf.hf.read_header(file).values()} == {"BF16"}
    model = lora_files.load_peft(nf.from_pretrained(path, dtype=dtype), tmp_path / "peft")
    names = lora_files.hf_modules(model)
    checked = 0
    for _, m in lora.adapters(model):
        module, _ = names[(lora.weight_name(model, m), m.start, m.stop)]
        for ours, key in ((m.A, "lora_A"), (m.B, "lora_B")):
            widened = half[f"{lora_files.PEFT_PREFIX}{module}.{key}.weight"].float().numpy()
            assert ours.data.dtype == dtype and np.abs(widened).max() > 0
            np.testing.assert_array_equal(ours.data, widened.astype(dtype))
            checked += 1
    assert checked == len(half) == 2 * 3 * 2


def peft_made_with(folders, tmp_path, key, value):
    """A PEFT adapter over the llama-gqa-llama3 base in tmp_path/peft, its adapter_config.json
    edited to ``key: value``; returns the base's folder."""
    path, hf = folders["llama-gqa-llama3"]
    peft_made(hf, tmp_path, targets=["q_proj", "v_proj"])
    file = tmp_path / "peft" / "adapter_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), key: value}))
    return path


@pytest.mark.parametrize("key, value, message", [
    ("use_dora", True, "use_dora: npformer's LoRA reads False only"),
    ("target_modules", ".*proj", "target_modules: expected a list of module names"),
    ("r", 0, "r: expected a positive integer, got 0"),           # the file's own keys
    ("lora_alpha", -1, "lora_alpha: expected a finite positive number"),
    ("lora_dropout", 1.5, r"lora_dropout: expected a finite number in \[0, 1\)"),
    ("r", 99, r"r: expected at most 16, the width of the narrowest targeted layer \(v_proj"),
    ("exclude_modules", ["q_proj"], r"exclude_modules: npformer's LoRA reads None only, got "
                                    r"\['q_proj'\]"),
    ("layer_replication", [[0, 2]], "layer_replication: npformer's LoRA reads None only"),
    ("trainable_token_indices", [0, 1], "trainable_token_indices: npformer's LoRA reads None"),
    ("use_bdlora", True, "use_bdlora: npformer's LoRA reads None only, got True"),
])
def test_bad_adapter_configs_are_refused(folders, tmp_path, key, value, message):
    path = peft_made_with(folders, tmp_path, key, value)
    with pytest.raises(ValueError, match=f"adapter_config.json: {message}"):
        lora_files.load_peft(nf.from_pretrained(path, dtype=np.float64), tmp_path / "peft")


@pytest.mark.parametrize("key, value", [("exclude_modules", None), ("layer_replication", None),
                                        ("trainable_token_indices", None), ("use_bdlora", False),
                                        ("use_bdlora", None), ("exclude_modules", [])])
def test_unimplemented_peft_settings_at_their_defaults_load(folders, tmp_path, key, value):
    """PEFT writes the settings npformer does not implement as null, false or absent: those
    load (only a value that changes the adapter is refused)."""
    path = peft_made_with(folders, tmp_path, key, value)
    assert lora.settings(lora_files.load_peft(nf.from_pretrained(path), tmp_path / "peft")).rank == 3


def test_an_adapter_naming_another_base_folder_warns_once(folders, tmp_path, capsys):
    """base_model_name_or_path naming another folder than the base it is applied to: one
    warning naming both (the shapes fit, so it loads); the same folder, or a hub name that is
    no folder here, loads quietly."""
    import warnings
    path, hf = folders["llama-gqa-llama3"]
    other = folders["qwen2-mqa"][0]
    peft_made(hf, tmp_path, targets=["q_proj", "v_proj"])
    file = tmp_path / "peft" / "adapter_config.json"
    config = json.loads(file.read_text())
    for named, warns in ((str(other), True), (f"{path}/.", False), ("org/some-model", False)):
        file.write_text(json.dumps({**config, "base_model_name_or_path": named}))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lora_files.load_peft(nf.from_pretrained(path), tmp_path / "peft")
        said = [str(w.message) for w in caught if "base_model_name_or_path" in str(w.message)]
        assert len(said) == warns, (named, said)
        if warns:
            assert str(other) in said[0] and str(path) in said[0]
    file.write_text(json.dumps({**config, "base_model_name_or_path": str(other)}))
    assert main(["sample", "--hf", str(path), "--adapter", str(tmp_path / "peft"),
                 "--prompt", "hello", "--max-new-tokens", "2", "--greedy"]) == 0
    err = capsys.readouterr().err
    assert err.count("base_model_name_or_path") == 1 and str(other) in err

def test_adapter_for_another_base_is_refused(folders, tmp_path, capsys):
    """A PEFT adapter of the Llama onto the Qwen2 (other shapes), and an npformer run's adapter
    onto a base whose weights differ (same shapes: the hash) are refused naming the adapter."""
    llama, qwen = folders["llama-gqa-llama3"], folders["qwen2-mqa"]
    peft_made(llama[1], tmp_path, targets=["q_proj", "v_proj"])
    with pytest.raises(ValueError, match="adapter_model.safetensors: does not hold this "
                                         "model's adapters: .*v_proj.*expected shape"):
        lora_files.load_peft(nf.from_pretrained(qwen[0], dtype=np.float64), tmp_path / "peft")
    model = lora.apply(nf.from_pretrained(llama[0]), rank=2)
    model.lora.base = {"folder": str(llama[0]), "kind": "hf", "model_type": "llama"}
    from npformer.training.checkpointing import save_model_checkpoint
    save_model_checkpoint(tmp_path / "run", model, None)
    other = tmp_path / "other"
    build(other, "llama-gqa-llama3", seed=99)
    assert main(["sample", "--hf", str(other), "--adapter", str(tmp_path / "run"),
                 "--prompt", "hello", "--max-new-tokens", "2", "--greedy"]) == 1
    assert "is an adapter for another base model" in capsys.readouterr().err


def test_an_adapter_that_is_no_hugging_face_module_is_refused_by_the_export(tmp_path):
    """npformer's own in_proj adapts the fused q, k and v rows, which no Llama module holds
    alone: PEFT's format cannot name it, and the export says what to adapt instead (GPT-2's
    c_attn is exactly those rows, so there it is c_attn)."""
    for family, refused in (("llama", True), ("gpt2", False)):
        model = lora.apply(nf.GPT(vocab_size=19, d_model=12, n_heads=3, d_ff=20, n_layers=1,
                                  max_len=8, family=family), rank=2, target_modules=["in_proj"])
        if refused:
            with pytest.raises(ValueError, match="is no Hugging Face module of Llama .*adapt "
                                                 "q_proj, k_proj, v_proj, o_proj"):
                lora_files.save_peft(model, tmp_path / family)
        else:
            lora_files.save_peft(model, tmp_path / family)
            config = json.loads((tmp_path / family / "adapter_config.json").read_text())
            assert config["target_modules"] == ["c_attn"] and config["fan_in_fan_out"]
