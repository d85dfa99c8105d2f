"""GPT-2 in the Hugging Face format against transformers' GPT2LMHeadModel: a small model with random
weights saved with save_pretrained (safetensors) and a tiny byte-level BPE tokenizer.json, loaded
by npformer without torch; same logits (float32 and float64), loss, every gradient, AdamW steps
and greedy generation. Bad folders are clear errors. Skips where transformers or torch are
absent (CI installs them)."""
import copy
import json
import shutil

import numpy as np
import pytest

import npformer as nf
from npformer.cli.main import main
from npformer.families import get as family, tensor_names
from npformer.hf import read_model_config

# GPT-2's Conv1D weights, stored (in, out): transposed on loading
CONV1D_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                     "mlp.c_proj.weight")


def hf_names(config):
    """{npformer parameter: (GPT-2 tensor name, stored transposed)}: GPT-2's tensor map."""
    return {ours: (theirs, transposed)
            for theirs, (ours, _, transposed) in tensor_names(family("gpt2"), config).items()}
from test_gpt import next_token_backward

torch = pytest.importorskip("torch", reason="PyTorch runs the reference; install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="the reference GPT-2: pip install transformers")
tokenizers = pytest.importorskip("tokenizers", reason="extra hf: pip install 'npformer[hf]'")
pytest.importorskip("safetensors", reason="extra hf: pip install 'npformer[hf]'")

torch.set_num_threads(1)

from test_llama_hf import TEXT, fine_tune, tokenizer  # noqa: E402  (after the skips: needs torch)


def make_folder(path, tie=True, activation="gelu_new", seed=0):
    """A GPT-2 of 2 blocks, d_model 32, 4 heads, context 24, with its tokenizer.json (the Llama
    tests' byte-level BPE)."""
    tok = tokenizer()
    vocab = tok.get_vocab_size()
    eos = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=24, n_embd=32, n_layer=2, n_head=4,
                                  activation_function=activation, tie_word_embeddings=tie,
                                  bos_token_id=eos, eos_token_id=eos)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(path, safe_serialization=True)
    tok.save(str(path / "tokenizer.json"))
    return model, tok


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    model, tok = make_folder(path)
    return path, model, tok


def batch(vocab, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=(3, 13))


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_logits_equal_transformers(folder, backend, dtype, tol):
    path, ref, _ = folder
    model = nf.GPT.from_pretrained(path, dtype=dtype)
    assert model.config.activation == "gelu_tanh" and model.config.tie_embeddings
    ids = batch(model.config.vocab_size)
    ref = ref.to(torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    got = model.forward(ids)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("tie", [True, False])
def test_loss_and_every_gradient_equal_transformers(tmp_path, backend, tie):
    ref, _ = make_folder(tmp_path, tie=tie, activation="gelu_pytorch_tanh", seed=1)
    ref = ref.double()
    model = nf.GPT.from_pretrained(tmp_path, dtype=np.float64)
    ids = batch(model.config.vocab_size, seed=1)
    # the loss GPT2LMHeadModel(labels=ids) computes: next-token cross-entropy, mean over tokens
    # (computed here, because transformers' own upcasts float64 logits to float32)
    ref_logits = ref(torch.tensor(ids)).logits
    ref_loss = torch.nn.functional.cross_entropy(ref_logits[:, :-1].reshape(-1, ref_logits.shape[-1]),
                                                 torch.tensor(ids[:, 1:]).reshape(-1))
    ref_loss.backward()
    loss = next_token_backward(model, ids)
    assert abs(loss - ref_loss.item()) < 1e-12
    theirs = {k.removeprefix("transformer."): p.grad.numpy() for k, p in ref.named_parameters()}
    for ours, (name, transposed) in hf_names(model.config).items():
        grad = dict(model.named_parameters())[ours].grad
        np.testing.assert_allclose(grad, theirs[name].T if transposed else theirs[name],
                                   rtol=1e-9, atol=1e-12, err_msg=ours)


def test_adamw_steps_equal_torch(folder):
    """Three AdamW steps (weight decay on every tensor, as torch.optim.AdamW over
    model.parameters()). The attention key bias has an exactly zero true gradient: its
    round-off is what Adam normalises, so it may move by up to lr a step either way."""
    path, ref, _ = folder
    ref = transformers.GPT2LMHeadModel.from_pretrained(path).double()
    ref.eval()
    model = nf.GPT.from_pretrained(path, dtype=np.float64)
    lr, steps = 1e-3, 3
    opt = nf.AdamW(model, lr=lr, weight_decay=0.1)
    topt = torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=0.1)
    for step in range(steps):
        ids = batch(model.config.vocab_size, seed=10 + step)
        topt.zero_grad()
        ref_logits = ref(torch.tensor(ids)).logits
        torch.nn.functional.cross_entropy(ref_logits[:, :-1].reshape(-1, ref_logits.shape[-1]),
                                          torch.tensor(ids[:, 1:]).reshape(-1)).backward()
        topt.step()
        next_token_backward(model, ids)
        opt.step()
    theirs = {k.removeprefix("transformer."): p.detach().numpy() for k, p in ref.named_parameters()}
    d = model.config.d_model
    for ours, (name, transposed) in hf_names(model.config).items():
        mine = dict(model.named_parameters())[ours].data
        expected = theirs[name].T if transposed else theirs[name]
        if ours.endswith("in_proj_bias"):                   # key third: +-lr per step
            np.testing.assert_allclose(mine[d:2 * d], expected[d:2 * d], rtol=0,
                                       atol=lr * steps * 1.001)
            mine, expected = np.delete(mine, np.s_[d:2 * d]), np.delete(expected, np.s_[d:2 * d])
        np.testing.assert_allclose(mine, expected, rtol=1e-9, atol=1e-12, err_msg=ours)


def test_greedy_generation_equals_transformers_generate(folder):
    path, ref, tok = folder
    model = nf.GPT.from_pretrained(path, dtype=np.float64)
    prompt = tok.encode("hello world").ids
    with torch.no_grad():
        expected = ref.double().generate(torch.tensor([prompt]), max_new_tokens=10,
                                         do_sample=False, eos_token_id=None, pad_token_id=0)
    hyp, = nf.decoding.greedy_search(model.decoder_state(np.array([prompt])), max_new_tokens=10)
    assert hyp.ids == expected[0, len(prompt):].tolist()


def test_names_follow_the_explicit_conv1d_list():
    cfg = nf.GPTConfig(vocab_size=10, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=4,
                       tie_embeddings=False)
    names = hf_names(cfg)
    transposed = sorted(theirs for theirs, t in names.values() if t)
    assert transposed == sorted(f"h.0.{w}" for w in CONV1D_TRANSPOSED)
    assert names["generator.weight"] == ("lm_head.weight", False)
    assert set(names) == set(cfg.parameter_shapes())


def test_sample_command_continues_a_prompt(folder, capsys):
    path, _, _ = folder
    argv = ["sample", "--hf", str(path), "--prompt", "hello world", "--max-new-tokens", "6"]
    assert main(argv + ["--greedy"]) == 0
    greedy = capsys.readouterr().out
    assert greedy.startswith("hello world")
    assert main(argv + ["--seed", "3", "--top-p", "0.9", "--temperature", "0.8"]) == 0
    first = capsys.readouterr().out
    assert main(argv + ["--seed", "3", "--top-p", "0.9", "--temperature", "0.8"]) == 0
    assert capsys.readouterr().out == first                       # same seed, same text
    assert main(argv + ["--greedy", "--trace"]) == 0
    trace = capsys.readouterr().out
    assert trace.startswith("prompt: hello world") and " p=" in trace
    assert trace.rstrip().endswith(greedy.rstrip())


# -- bad input -----------------------------------------------------------------------------------
def copy_folder(folder, tmp_path):
    dest = tmp_path / "copy"
    shutil.copytree(folder, dest)
    return dest


def rewrite_tensors(path, change):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize("case,match", [
    ("no config", "no config.json"),
    ("not gpt2", f"model_type: expected one of {', '.join(nf.families.names())}, got 'bert'"),
    ("pickle only", "pytorch_model.bin, a pickle, which npformer never loads"),
    ("missing", r"missing \['h.1.mlp.c_fc.bias'\]"),
    ("extra", r"unexpected \['h.0.attn.rotary'\]"),
    ("mis-shaped", r"wrong \[h.0.attn.c_attn.weight: expected \(32, 96\), got \(96, 32\)\]"),
    ("activation", "activation_function: expected one of"),
    ("activation list", r"activation_function: expected one of .*, got \['gelu'\]"),
    ("n_embd null", "n_embd: expected a positive integer, got None"),
    ("tie string", "tie_word_embeddings: expected True or False, got 'false'"),
    ("pdrop", "attn_pdrop: expected"),
])
def test_bad_folders_are_clear_errors(folder, tmp_path, case, match):
    path = copy_folder(folder[0], tmp_path)
    config = json.loads((path / "config.json").read_text())
    if case == "no config":
        (path / "config.json").unlink()
    elif case == "not gpt2":
        (path / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    elif case in ("activation", "activation list", "n_embd null", "tie string", "pdrop"):
        key, value = {"activation": ("activation_function", "swish"),
                      "activation list": ("activation_function", ["gelu"]),
                      "n_embd null": ("n_embd", None), "tie string": ("tie_word_embeddings", "false"),
                      "pdrop": ("attn_pdrop", 1.5)}[case]
        (path / "config.json").write_text(json.dumps({**config, key: value}))
    elif case == "pickle only":
        (path / "model.safetensors").rename(path / "pytorch_model.bin")
    elif case == "missing":
        rewrite_tensors(path, lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"))
    elif case == "extra":
        rewrite_tensors(path, lambda t: t.update({"transformer.h.0.attn.rotary": np.zeros(3, np.float32)}))
    elif case == "mis-shaped":
        rewrite_tensors(path, lambda t: t.update({"transformer.h.0.attn.c_attn.weight":
                                                  t["transformer.h.0.attn.c_attn.weight"].T.copy()}))
    with pytest.raises(ValueError, match=match):
        nf.GPT.from_pretrained(path)


def test_a_stray_tensor_named_like_a_bias_is_not_taken_for_a_mask_buffer(folder, tmp_path):
    path = copy_folder(folder[0], tmp_path)
    rewrite_tensors(path, lambda t: t.update({"transformer.h.7.attn.c_attn.bias": np.zeros(3, np.float32)}))
    with pytest.raises(ValueError, match=r"unexpected \['h.7.attn.c_attn.bias'\]"):
        nf.GPT.from_pretrained(path)


def test_config_and_eos_are_read_with_hugging_faces_names(folder):
    config, eos, _ = read_model_config(folder[0])
    assert (config.d_model, config.n_layers, config.n_heads, config.max_len) == (32, 2, 4, 24)
    assert eos == folder[2].token_to_id("<|endoftext|>")
    assert nf.GPT.from_pretrained(folder[0]).eos_id == eos


def test_an_end_id_past_the_vocabulary_loads_with_one_warning(tmp_path, capsys):
    """Issue 77: GPT2Config(vocab_size=101) keeps GPT-2's eos_token_id 50256. transformers
    loads such a folder; so does npformer, warning once that the end id cannot be produced,
    and generation stops at its length limit (library and command)."""
    import warnings
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=101, n_positions=24, n_embd=16, n_layer=1, n_head=2)).eval()
    assert ref.config.eos_token_id == 50256
    ref.save_pretrained(tmp_path, safe_serialization=True)
    for load in (nf.from_pretrained, nf.GPT.from_pretrained):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = load(tmp_path, dtype=np.float64)
        assert [str(w.message) for w in caught] == [
            f"{tmp_path / 'config.json'}: eos_token_id: 50256 cannot be produced by a model of "
            f"vocab_size=101 (ids 0 to 100); generation stops only at the length limit"]
        assert model.eos_id is None
    ids = batch(101)
    with torch.no_grad():
        expected = ref.double()(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(model.forward(ids), expected, rtol=1e-10, atol=1e-10)
    hyp, = nf.decoding.greedy_search(model.decoder_state(ids[:1], eos_id=model.eos_id),
                                     max_new_tokens=5)
    assert len(hyp.ids) == 5 and not hyp.finished
    from test_hf_bad_input import word_tokenizer
    word_tokenizer([f"w{i}" for i in range(101)]).save(str(tmp_path / "tokenizer.json"))
    assert main(["sample", "--hf", str(tmp_path), "--prompt", "w1 w2", "--max-new-tokens", "4",
                 "--greedy"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("w1") and err.count("warning:") == 1 and "50256" in err, err


def test_older_files_mask_buffers_are_ignored(folder, tmp_path):
    """The original gpt2 files store each block's causal mask (h.N.attn.bias) and no
    'transformer.' prefix: they load all the same."""
    path = copy_folder(folder[0], tmp_path)
    rewrite_tensors(path, lambda t: t.update(
        {**{k.removeprefix("transformer."): t.pop(k) for k in list(t)},
         "h.0.attn.bias": np.tril(np.ones((1, 1, 24, 24), np.float32))}))
    model = nf.GPT.from_pretrained(path, dtype=np.float64)
    reference = nf.GPT.from_pretrained(folder[0], dtype=np.float64)
    np.testing.assert_array_equal(model.flat_params, reference.flat_params)


def test_sample_command_bad_input_is_one_line(folder, tmp_path, capsys):
    path = folder[0]
    long_prompt = " ".join(["hello"] * 30)
    assert main(["sample", "--hf", str(path), "--prompt", long_prompt, "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "longer than the model's context of 24" in err and len(err.strip().splitlines()) == 1
    assert main(["sample", "--hf", str(path), "--prompt", "hi", "--greedy", "--top-k", "3"]) == 1
    assert "--top-k: only used when sampling" in capsys.readouterr().err
    assert main(["sample", "--hf", str(tmp_path), "--prompt", "hi"]) == 1
    assert "no tokenizer.json" in capsys.readouterr().err


def test_lm_fine_tunes_gpt2_with_its_tokenizer_and_sample_reads_the_run(folder, tmp_path, capsys):
    """``npformer lm --init-from`` a GPT-2 folder: the text goes through the folder's tokenizer,
    training starts from its weights (the first validation equals the loss transformers gives on
    the same windows), the run keeps the tokenizer.json, and ``npformer sample --checkpoint``
    continues a prompt with the fine-tuned model."""
    path, hf_model, tok = folder
    data, out = fine_tune(path, tmp_path, sample_tokens=5)
    assert (out / "tokenizer.json").read_bytes() == (path / "tokenizer.json").read_bytes()
    ids = tok.encode(data.read_text(encoding="utf-8")).ids
    valid = ids[len(ids) - round(len(ids) * 0.1):]
    from npformer.training.language_model import LanguageModelTask
    task = LanguageModelTask(ids[:len(ids) - len(valid)], valid, 16, sample_tokens=0)
    ours = task.evaluate(nf.GPT.from_pretrained(path, dtype=np.float64))["val_loss"]
    reference = copy.deepcopy(hf_model).double()
    total = 0.0
    with torch.no_grad():                    # (its own loss= would round through float32)
        for start in range(0, len(valid) - 1, 16):
            window = torch.tensor(valid[start:start + 17])
            logits = reference(window[None, :-1]).logits[0]
            total += float(torch.nn.functional.cross_entropy(logits, window[1:],
                                                             reduction="sum"))
    assert ours == pytest.approx(total / (len(valid) - 1), rel=1e-10)
    first = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in first if r["event"] == "eval"] == [2]
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(out / "best"), "--prompt", "hello world",
                 "--max-new-tokens", "4", "--greedy"]) == 0
    assert capsys.readouterr().out.startswith("hello world")
