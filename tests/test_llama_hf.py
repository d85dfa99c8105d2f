"""The Llama family (Llama, Qwen2, Qwen3) in the Hugging Face format against transformers: tiny
random-weight LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM saved with save_pretrained
(safetensors: float32, bfloat16, sharded) and a tiny byte-level BPE tokenizer.json, loaded by
``nf.from_pretrained`` without torch; the same logits (float64 and float32), loss, every
gradient, AdamW steps, greedy tokens, and cached decoding equal to the full forward. The cases
cover grouped-query ratios 1, 2 and n_heads (multi-query), tied and untied embeddings, rotary
scaling on (Llama 3's) and off, and a head size apart from hidden_size / heads (Qwen3).

Hugging Face computes RMSNorm and the rotary angles in float32 even inside a float64 model, so
float64 is held at 1e-10 against a reference with those casts removed (``exact_reference``)
and at 1e-5 against stock transformers. Bad folders are clear errors naming the file. Skips
where transformers or torch are absent (CI installs them), the Qwen3 cases where transformers
predates Qwen3."""
import copy
import json
import pickle
import shutil
import types

import numpy as np
import pytest

import npformer as nf
from npformer.cli.main import main
from npformer.families import get as family, names, parameter_of, tensor_names
from npformer.hf import read_model_config
from npformer.training.checkpointing import load_model_checkpoint

LLAMA = family("llama")


def llama_names(config):
    """{Hugging Face tensor name: (npformer parameter, rows)}: the Llama family's tensor map."""
    return {theirs: (ours, rows) for theirs, (ours, rows, _) in tensor_names(LLAMA, config).items()}


def hf_parameter(config, name):
    return parameter_of(LLAMA, config, name)[:2]
from test_gpt import next_token_backward

torch = pytest.importorskip("torch", reason="PyTorch runs the reference; install torch==2.13.0")
transformers = pytest.importorskip("transformers",
                                   reason="the reference models: pip install transformers")
pytest.importorskip("tokenizers", reason="extra hf: pip install 'npformer[hf]'")
pytest.importorskip("safetensors", reason="extra hf: pip install 'npformer[hf]'")

torch.set_num_threads(1)
HAS_QWEN3 = hasattr(transformers, "Qwen3ForCausalLM")
needs_qwen3 = pytest.mark.skipif(not HAS_QWEN3, reason="this transformers has no Qwen3 "
                                                        "(Qwen3ForCausalLM came in 4.51)")
TEXT = ["the quick brown fox jumps over the lazy dog", "hello world, hello npformer",
        "a man in an orange hat starring at something ."] * 20
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
# name: (model_type, heads, key/value heads, head_dim, tied, more config). hidden 32, 2 layers.
CASES = {
    "llama-mha": ("llama", 4, 4, None, False, {}),
    "llama-gqa-llama3": ("llama", 4, 2, None, True, {"rope_scaling": LLAMA3,
                                                     "max_position_embeddings": 96}),
    "qwen2-mqa": ("qwen2", 4, 1, None, False, {"rope_theta": 1e6}),
    "qwen3-gqa": ("qwen3", 4, 2, 16, True, {}),
}
PARAMS = [pytest.param(name, marks=[needs_qwen3] if name.startswith("qwen3") else [])
          for name in CASES]


def classes(model_type):
    return {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "qwen3": (getattr(transformers, "Qwen3Config", None),
                      getattr(transformers, "Qwen3ForCausalLM", None)),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM)}[model_type]


_TOKENIZER = []


def tokenizer():
    """A byte-level BPE of about 300 tokens, trained once, with <|endoftext|>."""
    if not _TOKENIZER:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(TEXT, trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        _TOKENIZER.append(tok)
    return _TOKENIZER[0]


def fine_tune(path, tmp_path, sample_tokens):
    """``npformer lm --init-from path`` for two steps of 2 windows of 16 on TEXT (one line each),
    validated at step 2; returns the text file and the run folder."""
    data = tmp_path / "text.txt"
    data.write_text("\n".join(TEXT) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    assert main(["lm", "--data", str(data), "--init-from", str(path), "--out", str(out),
                 "--context", "16", "--batch-size", "2", "--max-steps", "2", "--eval-every", "2",
                 "--sample-tokens", str(sample_tokens), "--quiet"]) == 0
    return data, out


def build(path, case, seed=0, save_dtype=None, shard=None, legacy_rope=False, **changes):
    """The transformers model of ``case`` (a name of ``CASES``, or a tuple as theirs: another
    family's tests) with random weights (every norm and bias moved off its initial value), saved
    in ``path`` with the tokenizer; returns it (float32)."""
    model_type, heads, kv, head_dim, tie, more = CASES[case] if isinstance(case, str) else case
    model = save_random(path, *classes(model_type), heads, kv, head_dim, tie, seed, save_dtype,
                        shard, **more, **changes)
    if legacy_rope:                          # the keys of files written before transformers 5
        config = json.loads((path / "config.json").read_text())
        rope = config.pop("rope_parameters")
        config["rope_theta"] = rope.pop("rope_theta")
        config["rope_scaling"] = rope if rope.get("rope_type") != "default" else None
        (path / "config.json").write_text(json.dumps(config))
    return model


def save_random(path, Config, Model, heads, kv, head_dim, tie, seed, save_dtype=None, shard=None,
                **more):
    """A tiny transformers ``Model`` (hidden 32, 2 layers; ``heads`` query heads and ``kv``
    key/value heads of ``head_dim``, tied or not; ``more`` of ``Config``'s fields) with random
    weights (every norm and bias moved off its initial value), saved in ``path`` with the
    tokenizer (as ``save_dtype``, in shards of ``shard``); returns it (float32)."""
    tok = tokenizer()
    eos = tok.token_to_id("<|endoftext|>")
    kwargs = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=48,
                  num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv,
                  max_position_embeddings=24, tie_word_embeddings=tie, rms_norm_eps=1e-5,
                  bos_token_id=eos, eos_token_id=eos)
    kwargs.update(more)
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    torch.manual_seed(seed)
    model = Model(Config(**kwargs)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.ndim == 1 else 0.02))
    saved = model if save_dtype is None else copy.deepcopy(model).to(save_dtype)
    saved.save_pretrained(path, **({} if shard is None else {"max_shard_size": shard}))
    if save_dtype is not None:               # the weights as saved; the buffers as they were
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(save_dtype).float())
    tok.save(str(path / "tokenizer.json"))
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{case: (folder, transformers model)}: each case saved once as float32 safetensors (the
    Llama 3 one with the older rope_theta/rope_scaling keys)."""
    out = {}
    for i, case in enumerate(CASES):
        if case.startswith("qwen3") and not HAS_QWEN3:
            continue
        path = tmp_path_factory.mktemp(case)
        out[case] = path, build(path, case, seed=i, legacy_rope=case == "llama-gqa-llama3")
    return out


# -- the reference without Hugging Face's float32 casts -----------------------------------------
def exact_rmsnorm(self, x):
    """Hugging Face's RMSNorm in the input's dtype (stock: in float32, then cast back); Gemma's
    and Gemma 2's gain is 1 + weight, their epsilon ``eps``."""
    gain = 1 + self.weight if type(self).__name__ in ("GemmaRMSNorm", "Gemma2RMSNorm") \
        else self.weight
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
    return gain * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def exact_inv_freq(config):
    """The rotary frequencies of Hugging Face's default and Llama 3 rules, in float64 (stock:
    float32)."""
    rope = config.rope_parameters
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv = 1.0 / (rope["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if rope["rope_type"] == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        wavelen = 2 * np.pi / inv
        slow = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * slow / factor + smooth * slow
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        inv = torch.where(medium, smoothed, slow)
    return inv


def exact_eager(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                softcap=None, **kwargs):
    """transformers' eager attention (Gemma 2's: the scores scaled, soft-capped, masked) with
    the softmax in the input's dtype (stock: in float32, then cast back)."""
    from transformers.models.gemma2.modeling_gemma2 import repeat_kv
    key, value = (repeat_kv(x, module.num_key_value_groups) for x in (key, value))
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def exact_reference(model):
    """A float64 copy of ``model`` with RMSNorm, the rotary angles, Gemma's embedding scale
    (stock: sqrt(hidden_size) rounded to float32) and the eager attention's softmax (Gemma
    2's) computed in float64."""
    ref = copy.deepcopy(model).double()
    if ref.config._attn_implementation == "eager":          # its softmax: float32 islands
        from transformers.masking_utils import AttentionMaskInterface, eager_mask
        transformers.AttentionInterface.register("exact_eager", exact_eager)
        AttentionMaskInterface.register("exact_eager", eager_mask)     # its additive mask
        ref.config._attn_implementation = "exact_eager"
    for module in ref.modules():
        kind = type(module).__name__
        if hasattr(module, "scalar_embed_scale"):
            module.embed_scale = torch.tensor(module.scalar_embed_scale, dtype=torch.float64)
        if kind.endswith("RMSNorm"):
            module.forward = types.MethodType(exact_rmsnorm, module)
        elif kind.endswith("RotaryEmbedding"):
            inv = exact_inv_freq(ref.config)
            # the same rule as transformers' own (its float32 frequencies)
            np.testing.assert_allclose(inv.numpy(), module.inv_freq.numpy(), rtol=1e-6)

            def forward(self, x, position_ids, inv=inv):
                angles = position_ids[..., None].to(torch.float64) * inv
                angles = torch.cat((angles, angles), dim=-1)
                return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
            module.forward = types.MethodType(forward, module)
    return ref


def stock(model, dtype=torch.float64):
    return copy.deepcopy(model).to(dtype)


def batch(vocab, seed=0, shape=(3, 13)):
    return np.random.default_rng(seed).integers(0, vocab, size=shape)


def hf_loss(ref, ids):
    """Next-token cross-entropy, mean over tokens (computed here: transformers' own upcasts
    float64 logits to float32)."""
    logits = ref(torch.tensor(ids)).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             torch.tensor(ids[:, 1:]).reshape(-1))


def theirs_by_ours(model, values):
    """{npformer parameter: array} assembled from {Hugging Face name: array} through the rename
    table of the model's family (the rows of the fused parameters filled by their parts)."""
    out = {name: np.full(p.data.shape, np.nan) for name, p in model.named_parameters()}
    names = tensor_names(family(model.config.family), model.config)
    for theirs, (ours, rows, _) in names.items():
        out[ours][rows] = values[theirs]
    return out


# -- parity --------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", PARAMS)
def test_the_config_is_the_preset(folders, case):
    path, ref = folders[case]
    config, eos, model_type = read_model_config(path)
    kind, heads, kv, head_dim, tie, _ = CASES[case]
    assert model_type == kind and (config.n_heads, config.n_kv_heads) == (heads, kv)
    assert (config.norm, config.ffn, config.activation, config.positions) == \
        ("rmsnorm", "gated", "silu", "rotary")
    assert config.head_size == (head_dim or 8) and config.tie_embeddings == tie
    assert config.qkv_bias == (kind == "qwen2") and not config.proj_bias
    assert config.qk_norm == (kind == "qwen3") and config.dropout == 0
    assert config.rope_theta == ref.config.rope_parameters["rope_theta"]
    assert (config.rope_scaling is None) == (case != "llama-gqa-llama3")
    if config.rope_scaling is not None:      # its pairs fall in all three of Llama 3's bands
        plain = nf.functional.rotary_frequencies(config.head_size, config.rope_theta)
        ratio = plain / nf.functional.rotary_frequencies(config.head_size, config.rope_theta,
                                                         config.rope_scaling)
        assert ratio[0] == 1 and ratio[-1] == 8 and 1 < ratio[1] < 8
    assert config.layer_norm_eps == 1e-5
    assert config.max_len == ref.config.max_position_embeddings
    assert eos == tokenizer().token_to_id("<|endoftext|>")


# every way a config.json may give its rotary settings: the two objects (absent, null, empty,
# a default type with or without its theta, Llama 3's rescaling, the older "type" key) and the
# top-level rope_theta (absent or given)
ROPE_OBJECTS = [..., None, {}, {"rope_type": "default"}, {"type": "default", "rope_theta": 2e5},
                LLAMA3, {**LLAMA3, "rope_theta": 4e5}]
ROPE_THETAS = [..., 3e5]


def rotary_module(model_type):
    module = getattr(transformers.models, model_type)
    return getattr(getattr(module, f"modeling_{model_type}"),
                   f"{classes(model_type)[1].__name__[:-len('ForCausalLM')]}RotaryEmbedding")


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_rotary_settings_are_read_as_transformers_reads_them(tmp_path, model_type):
    """Issue 77: an empty rope_scaling beside rope_parameters took theta 10,000 where
    transformers reads rope_parameters. For every combination of the keys the frequencies
    npformer builds are the inv_freq of transformers' own rotary embedding."""
    import itertools
    config = dict(model_type=model_type, vocab_size=50, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                  max_position_embeddings=96)
    rotary = rotary_module(model_type)
    for scaling, parameters, theta in itertools.product(ROPE_OBJECTS, ROPE_OBJECTS[:-1],
                                                        ROPE_THETAS):
        given = {key: copy.deepcopy(value) for key, value in (
            ("rope_scaling", scaling), ("rope_parameters", parameters), ("rope_theta", theta))
            if value is not ...}
        (tmp_path / "config.json").write_text(json.dumps({**config, **given}))
        theirs = rotary(transformers.AutoConfig.from_pretrained(tmp_path)).inv_freq.numpy()
        ours, _, _ = read_model_config(tmp_path)
        got = nf.functional.rotary_frequencies(ours.head_size, ours.rope_theta,
                                               ours.rope_scaling)
        np.testing.assert_allclose(got, theirs, rtol=1e-6, err_msg=str(given))


def test_an_empty_rope_scaling_leaves_rope_parameters_in_force(folders, tmp_path):
    """The issue's folder: logits equal transformers' at every position."""
    path = edited(folders["llama-mha"][0], tmp_path, rope_scaling={},
                  rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    ref = transformers.LlamaForCausalLM.from_pretrained(path).double().eval()
    assert ref.config.rope_parameters["rope_theta"] == 5e5
    ids = batch(ref.config.vocab_size, shape=(1, 20))
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    model = nf.from_pretrained(path, dtype=np.float64)
    assert model.config.rope_theta == 5e5
    np.testing.assert_allclose(model.forward(ids), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", PARAMS)
@pytest.mark.parametrize("dtype,reference,tol", [
    (np.float64, "exact", 1e-10), (np.float64, "stock", 1e-5), (np.float32, "stock", 1e-5)])
def test_logits_equal_transformers(folders, case, dtype, reference, tol):
    logits_equal(*folders[case], dtype, reference, tol)


def logits_equal(path, hf, dtype, reference, tol):
    """The logits of the folder ``path`` loaded as ``dtype`` equal those of the transformers
    model ``hf`` (``reference`` "exact": without its float32 islands; "stock") within ``tol``."""
    model = nf.from_pretrained(path, dtype=dtype)
    assert isinstance(model, nf.GPT) and not model.training
    ids = batch(model.config.vocab_size)
    ref = exact_reference(hf) if reference == "exact" else \
        stock(hf, torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    got = model.forward(ids)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", PARAMS)
def test_loss_and_every_gradient_equal_transformers(folders, case):
    loss_and_gradients_equal(*folders[case])


def loss_and_gradients_equal(path, hf):
    """The float64 loss and every gradient of the folder ``path`` equal those of the
    transformers model ``hf`` without its float32 islands."""
    ref = exact_reference(hf)
    model = nf.from_pretrained(path, dtype=np.float64)
    ids = batch(model.config.vocab_size, seed=1)
    ref_loss = hf_loss(ref, ids)
    ref_loss.backward()
    loss = next_token_backward(model, ids)
    assert abs(loss - ref_loss.item()) < 1e-12
    expected = theirs_by_ours(model, {k: p.grad.numpy() for k, p in ref.named_parameters()})
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, expected[name], rtol=1e-8, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("case", [p for p in PARAMS if p.values[0] in ("llama-gqa-llama3",
                                                                        "qwen2-mqa")])
def test_adamw_steps_equal_torch(folders, case):
    """Three AdamW steps (weight decay on every tensor, as torch.optim.AdamW over
    model.parameters()): tied and untied, with q/k/v biases, grouped and multi-query."""
    path, hf = folders[case]
    ref = exact_reference(hf).train()
    model = nf.from_pretrained(path, dtype=np.float64)
    lr = 1e-3
    opt = nf.AdamW(model, lr=lr, weight_decay=0.1)
    topt = torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=0.1)
    for step in range(3):
        ids = batch(model.config.vocab_size, seed=10 + step)
        topt.zero_grad()
        hf_loss(ref, ids).backward()
        topt.step()
        next_token_backward(model, ids)
        opt.step()
    expected = theirs_by_ours(model, {k: p.detach().numpy() for k, p in ref.named_parameters()})
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.data, expected[name], rtol=1e-9, atol=1e-12, err_msg=name)


def greedy_equals_generate(model, reference, prompt, new_tokens):
    """npformer's greedy continuation of ``prompt`` (token ids) by ``model`` (with its caches)
    equals ``reference``'s (a transformers or PEFT model) ``generate``; returns its tokens."""
    with torch.no_grad():
        expected = reference.generate(input_ids=torch.tensor([prompt]),
                                      max_new_tokens=new_tokens, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)
    hyp, = nf.decoding.greedy_search(model.decoder_state(np.array([prompt])),
                                     max_new_tokens=new_tokens)
    assert hyp.ids == expected[0, len(prompt):].tolist()
    return hyp.ids


@pytest.mark.parametrize("case", PARAMS)
def test_greedy_tokens_and_cached_steps(folders, case):
    greedy_and_cached_steps_equal(*folders[case])


def greedy_and_cached_steps_equal(path, hf):
    """Greedy tokens equal transformers' generate (its own cache); every cached step's
    log-probabilities equal the full forward over the tokens so far; the caches hold only the
    key/value heads."""
    model = nf.from_pretrained(path, dtype=np.float64)
    prompt = tokenizer().encode("hello world").ids
    tokens = prompt + greedy_equals_generate(model, exact_reference(hf), prompt, 10)
    state = model.decoder_state(np.array([prompt]), capacity=len(tokens))
    assert state.caches[0].keys().shape[1] == model.config.n_kv_heads
    full = nf.functional.log_softmax(model.forward(np.array([tokens]))[0])
    previous = state.first_tokens()
    for t in range(len(prompt) - 1, len(tokens) - 1):
        logp = state.step(previous)
        np.testing.assert_allclose(logp[0], full[t], rtol=0, atol=1e-10)
        previous = np.array([tokens[t + 1]])


def test_bf16_weights_load_exactly(tmp_path):
    bf16_weights_load_exactly(tmp_path, "llama-gqa-llama3")


def bf16_weights_load_exactly(tmp_path, case):
    """bfloat16 files (read through the header: float32's upper 16 bits) give the very values
    transformers holds, and its logits (``case``: as :func:`build` takes it)."""
    bf16_loads_exactly(tmp_path, build(tmp_path, case, seed=5, save_dtype=torch.bfloat16))


def bf16_loads_exactly(tmp_path, hf):
    """The bfloat16 folder ``tmp_path`` of the transformers model ``hf`` loads as the values
    ``hf`` holds, and gives its logits (float64, without its float32 islands)."""
    header = json.loads((tmp_path / "model.safetensors").read_bytes()[8:][:int.from_bytes(
        (tmp_path / "model.safetensors").read_bytes()[:8], "little")])
    assert {e["dtype"] for k, e in header.items() if k != "__metadata__"} == {"BF16"}
    for dtype in (np.float32, np.float64):
        model = nf.from_pretrained(tmp_path, dtype=dtype)
        expected = theirs_by_ours(model, {k: p.detach().double().numpy()
                                          for k, p in hf.named_parameters()})
        for name, p in model.named_parameters():
            np.testing.assert_array_equal(p.data, expected[name].astype(dtype), err_msg=name)
    ids = batch(model.config.vocab_size, seed=2)
    with torch.no_grad():
        expected = exact_reference(hf)(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(model.forward(ids), expected, rtol=1e-10, atol=1e-10)


def test_the_loaded_model_was_never_initialised(folders, monkeypatch):
    """from_pretrained builds the model without drawing or writing initial weights (its peak
    memory is then about the weights once: benchmarks/bench_load_memory.py): GPT-2's
    initialisation is never run, nothing is drawn from the generator every initialiser draws
    from (the dropout one, left where its seed puts it), and the weights are the files' (the
    parity tests above hold their values)."""
    path, _ = folders["llama-gqa-llama3"]
    expected = nf.from_pretrained(path).flat_params.copy()

    def no_draws(*args, **kwargs):
        raise AssertionError("GPT-2's initialisation ran")

    monkeypatch.setattr(nf.GPT, "_init_weights", no_draws)
    model = nf.from_pretrained(path)
    np.testing.assert_array_equal(model.flat_params, expected)
    assert model.rng.bit_generator.state == \
        np.random.default_rng(model.config.seed).bit_generator.state


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharded")
    hf = build(path, "qwen2-mqa", seed=2, shard="20KB")
    return path, hf


def test_sharded_weights_load(sharded, tmp_path):
    sharded_loads(*sharded, tmp_path)


LOGIT_CHECKS = [(np.float64, "exact", 1e-10), (np.float64, "stock", 1e-5),
                (np.float32, "stock", 1e-5)]            # (npformer's dtype, transformers', atol)


def family_folders(tmp_path_factory, cases, build, seed):
    """{case: (folder, float32 transformers model)} of another family's ``cases``, each saved
    by that module's ``build(path, case, seed=...)``: its ``folders`` fixture."""
    return {case: (path, build(path, case, seed=seed + i)) for i, case in enumerate(cases)
            for path in [tmp_path_factory.mktemp(case)]}


def parity_tests(cases):
    """The logits and the loss-and-gradient tests of another family's module, over its
    ``cases`` and its ``folders`` fixture: ``test_logits_equal_transformers,
    test_loss_and_every_gradient_equal_transformers = parity_tests(CASES)``."""
    @pytest.mark.parametrize("case", cases)
    @pytest.mark.parametrize("dtype,reference,tol", LOGIT_CHECKS)
    def test_logits_equal_transformers(folders, case, dtype, reference, tol):
        logits_equal(*folders[case], dtype, reference, tol)

    @pytest.mark.parametrize("case", cases)
    def test_loss_and_every_gradient_equal_transformers(folders, case):
        loss_and_gradients_equal(*folders[case])
    return test_logits_equal_transformers, test_loss_and_every_gradient_equal_transformers


def family_config(folder, name, block, shape):
    """The configuration read from ``folder``, once it is checked: config.json's model_type and
    the configuration's family are ``name``; its (norm, ffn, activation, positions) are
    ``block``; its (heads, key/value heads, head size, tied) are ``shape``."""
    config, _, model_type = read_model_config(folder)
    assert model_type == config.family == name
    assert (config.norm, config.ffn, config.activation, config.positions) == block
    assert (config.n_heads, config.n_kv_heads, config.head_size, config.tie_embeddings) == shape
    return config


def family_tests(cases, build, seed, bf16, sharded):
    """The tests another family's module shares with this one, over its ``cases`` saved by its
    ``build(path, case, seed=..., **options)``: its ``folders`` fixture (seeds from ``seed``),
    the logits and the loss-and-gradient tests (:func:`parity_tests`), a bfloat16 folder of the
    case ``bf16``, a sharded one of ``sharded``, and an npformer adapter on ``bf16``'s folder
    that PEFT loads and continues: {name: fixture or test}, for the module's globals
    (``globals().update(family_tests(CASES, build, ...))``)."""
    @pytest.fixture(scope="module")
    def folders(tmp_path_factory):
        return family_folders(tmp_path_factory, cases, build, seed)

    def test_bf16_weights_load_exactly(tmp_path):
        bf16_loads_exactly(tmp_path, build(tmp_path, bf16, seed=5, save_dtype=torch.bfloat16))

    def test_sharded_weights_load(tmp_path):
        hf = build(tmp_path / "sharded", sharded, seed=2, shard="20KB")
        sharded_loads(tmp_path / "sharded", hf, tmp_path / "whole")

    def test_an_npformer_adapter_loads_in_peft_and_continues_identically(folders, tmp_path):
        peft_continues_identically(*folders[bf16], tmp_path)
    tests = (folders, *parity_tests(cases), test_bf16_weights_load_exactly,
             test_sharded_weights_load, test_an_npformer_adapter_loads_in_peft_and_continues_identically)
    return {test.__name__: test for test in tests}


def peft_continues_identically(path, hf, tmp_path):
    """An adapter trained in npformer over every projection of the folder ``path`` (of the
    transformers model ``hf``), saved as PEFT's files: PEFT loads it and gives the same logits,
    loss and gradient of every lora_A and lora_B (float64)."""
    peft = pytest.importorskip("peft", reason="the PEFT round trip: pip install peft")
    from npformer import lora, lora_files
    from test_lora_peft import ALL, agrees_with_peft, ids_and_targets, randomise
    model = lora.apply(nf.from_pretrained(path, dtype=np.float64), rank=4, alpha=8.0,
                       target_modules=ALL)
    randomise(model)
    lora_files.save_peft(model, tmp_path / "adapter", str(path))
    pm = peft.PeftModel.from_pretrained(exact_reference(hf), tmp_path / "adapter",
                                        is_trainable=True).double()
    assert agrees_with_peft(pm, model, *ids_and_targets(model.config.vocab_size, seed=4)) == \
        2 * len(ALL) * 2


def sharded_loads(path, hf, tmp_path):
    """The sharded folder ``path`` of ``hf`` loads as ``hf`` saved in one file in ``tmp_path``."""
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (path / "model.safetensors").exists()
    hf.save_pretrained(tmp_path)                         # the same weights in one file
    np.testing.assert_array_equal(nf.from_pretrained(path, dtype=np.float64).flat_params,
                                  nf.from_pretrained(tmp_path, dtype=np.float64).flat_params)


# -- the rename table ----------------------------------------------------------------------------
@pytest.mark.parametrize("case", PARAMS)
def test_the_rename_table_fills_every_row_once(folders, case):
    config, _, _ = read_model_config(folders[case][0])
    shapes = config.parameter_shapes()
    filled = {name: np.zeros(shape[0], int) for name, shape in shapes.items()}
    for theirs, (ours, rows) in llama_names(config).items():
        filled[ours][rows] += 1
        assert hf_parameter(config, theirs) == (ours, rows)
    assert all((count == 1).all() for count in filled.values()), filled
    hf = folders[case][1]
    assert set(llama_names(config)) == {k for k, _ in hf.named_parameters()}


def test_lora_targets_are_found_through_the_table():
    config = nf.GPTConfig(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48,
                          n_layers=3, positions="rotary", norm="rmsnorm", ffn="gated",
                          activation="silu", qkv_bias=False, proj_bias=False,
                          tie_embeddings=False)
    q, kv, ff = 32, 16, 48
    expected = {"q_proj": ("self_attn.in_proj_weight", 0, q),
                "k_proj": ("self_attn.in_proj_weight", q, q + kv),
                "v_proj": ("self_attn.in_proj_weight", q + kv, q + 2 * kv),
                "o_proj": ("self_attn.out_proj.weight", None, None),
                "gate_proj": ("ffn.linear1.weight", 0, ff),
                "up_proj": ("ffn.linear1.weight", ff, 2 * ff),
                "down_proj": ("ffn.linear2.weight", None, None)}
    for module, (ours, start, stop) in expected.items():
        part = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
        assert f"{part}.{module}" in LLAMA.blocks
        assert hf_parameter(config, f"model.layers.2.{part}.{module}.weight") == \
            (f"blocks.2.{ours}", slice(start, stop))
    assert hf_parameter(config, "lm_head.weight") == ("generator.weight", slice(None))
    assert set(LLAMA.ends) == {"model.embed_tokens", "model.norm", "lm_head"}
    for name, match in [("model.layers.3.mlp.up_proj.weight", "has 3 layers"),
                        ("model.layers.0.self_attn.q_proj.bias", "not a tensor of this model"),
                        ("model.layers.0.self_attn.q_norm.weight", "not a tensor"),
                        ("transformer.h.0.attn.c_attn.weight", "not a tensor")]:
        with pytest.raises(ValueError, match=match):
            hf_parameter(config, name)


# -- end-of-text ids, the caches, the commands ---------------------------------------------------
def test_generation_stops_at_any_of_several_end_tokens(folders, tmp_path, capsys):
    """Llama 3's generation_config.json lists several eos_token_id: model.eos_id holds them
    all, and greedy decoding (library and command) stops at whichever comes first."""
    path = tmp_path / "copy"
    shutil.copytree(folders["llama-mha"][0], path)
    model = nf.from_pretrained(path, dtype=np.float64)
    prompt = tokenizer().encode("hello world").ids
    free = model.decoder_state(np.array([prompt]))
    free.eos_id = None
    hyp, = nf.decoding.greedy_search(free, max_new_tokens=8)
    stop = next(i for i, t in enumerate(hyp.ids) if t not in hyp.ids[:i] and i >= 2)
    other = next(i for i in range(model.config.vocab_size) if i not in hyp.ids)
    generation = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps(
        {**generation, "eos_token_id": [other, hyp.ids[stop]]}))
    model = nf.from_pretrained(path, dtype=np.float64)
    assert model.eos_id == (other, hyp.ids[stop])
    ended, = nf.decoding.greedy_search(model.decoder_state(np.array([prompt]),
                                                           eos_id=model.eos_id), max_new_tokens=8)
    assert ended.finished and ended.ids == hyp.ids[:stop]
    assert main(["sample", "--hf", str(path), "--prompt", "hello world", "--max-new-tokens", "8",
                 "--greedy", "--dtype", "float64", "--trace"]) == 0
    trace = capsys.readouterr().out
    assert f"{tokenizer().id_to_token(hyp.ids[stop])!r}" in trace


def test_end_ids_past_the_vocabulary_are_left_out_with_one_warning(folders, tmp_path):
    """Issue 77: an end id the model cannot produce does not stop the folder from loading (as
    in transformers): it is left out, with one warning naming the file; with none left,
    generation stops at its length limit."""
    import warnings
    path = tmp_path / "copy"
    shutil.copytree(folders["llama-mha"][0], path)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    generation = json.loads((path / "generation_config.json").read_text())
    for ends, kept, then in [([3, 10**6, vocab], 3, "generation stops at 3 or at the length "
                                                     "limit"),
                             (10**6, None, "generation stops only at the length limit")]:
        (path / "generation_config.json").write_text(json.dumps({**generation,
                                                                 "eos_token_id": ends}))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = nf.from_pretrained(path)
        lost = "1000000" if kept is None else f"1000000, {vocab}"
        assert [str(w.message) for w in caught] == [
            f"{path / 'generation_config.json'}: eos_token_id: {lost} cannot be produced by a "
            f"model of vocab_size={vocab} (ids 0 to {vocab - 1}); {then}"]
        assert model.eos_id == kept
    hyp, = nf.decoding.greedy_search(model.decoder_state(np.array([[1, 2]]), eos_id=model.eos_id),
                                     max_new_tokens=5)
    assert len(hyp.ids) == 5 and not hyp.finished


def test_end_token_from_tokenizer_config(folders, tmp_path):
    path = tmp_path / "copy"
    shutil.copytree(folders["qwen2-mqa"][0], path)
    for name in ("config.json", "generation_config.json"):
        data = json.loads((path / name).read_text())
        data.pop("eos_token_id", None)
        (path / name).write_text(json.dumps(data))
    assert nf.from_pretrained(path).eos_id is None
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    assert nf.from_pretrained(path).eos_id == tokenizer().token_to_id("<|endoftext|>")


def test_caches_are_sized_by_the_prompt_and_new_tokens(folders, tmp_path, monkeypatch, capsys):
    """A model of 131,072 positions (Llama 3.2's) samples with caches for the prompt and
    --max-new-tokens, as lm's validation samples do for theirs."""
    path = tmp_path / "long"
    shutil.copytree(folders["llama-gqa-llama3"][0], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 131072}))
    sizes = []
    new_caches = nf.GPT.new_caches
    monkeypatch.setattr(nf.GPT, "new_caches",
                        lambda self, rows, capacity: sizes.append(capacity) or
                        new_caches(self, rows, capacity))
    prompt = tokenizer().encode("hello world").ids
    assert main(["sample", "--hf", str(path), "--prompt", "hello world", "--max-new-tokens", "5",
                 "--greedy"]) == 0
    assert sizes == [len(prompt) + 5]
    from npformer.training.language_model import LanguageModelTask
    task = LanguageModelTask(np.arange(40) % 7, np.arange(20) % 7, 8, sample_tokens=6,
                             tokenizer=tokenizer())
    sizes.clear()
    task.sample(nf.from_pretrained(path))
    assert sizes == [1 + 6]


@pytest.mark.parametrize("case", PARAMS)
def test_sample_and_lm_commands_run_every_type(folders, tmp_path, capsys, case):
    path = folders[case][0]
    assert main(["sample", "--hf", str(path), "--prompt", "hello world", "--max-new-tokens", "6",
                 "--greedy"]) == 0
    assert capsys.readouterr().out.startswith("hello world")
    data, out = fine_tune(path, tmp_path, sample_tokens=4)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "eval"] == [2]
    assert (out / "tokenizer.json").is_file()
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(out / "best"), "--prompt", "hello world",
                 "--max-new-tokens", "3", "--greedy"]) == 0
    assert capsys.readouterr().out.startswith("hello world")


# -- bad input -----------------------------------------------------------------------------------
def edited(folder, tmp_path, **changes):
    """A copy of ``folder`` whose config.json has ``changes`` (None: the key removed)."""
    path = tmp_path / "edited"
    shutil.copytree(folder, path)
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("changes,match", [
    (dict(model_type="no_such_family"), f"model_type: expected one of {', '.join(names())}, "
                                        f"got 'no_such_family'"),
    (dict(hidden_size=30, head_dim=None), r"hidden_size: expected a multiple of "
                                          r"num_attention_heads=4 \(config.json gives no "
                                          r"head_dim\), got 30"),
    (dict(num_key_value_heads=3), "num_key_value_heads: expected a divisor of "
                                  "num_attention_heads=4"),
    (dict(head_dim=7), "head_dim: expected an even head size"),
    (dict(hidden_size=36, head_dim=None), r"hidden_size / num_attention_heads \(36 / 4\): "
                                          r"expected an even head size .*got 9"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
     "rope_parameters: rope_type: expected 'default' or 'llama3' .*got 'yarn'"),
    (dict(rope_parameters=None, rope_scaling={"type": "linear", "factor": 2.0}),
     "rope_scaling: rope_type: expected 'default' or 'llama3' .*got 'linear'"),
    (dict(rope_parameters={**LLAMA3, "factor": -1}), "rope_parameters.factor: expected"),
    (dict(hidden_act="gelu"), "hidden_act: expected 'silu'"),
    (dict(attention_bias=True), "mlp_bias: npformer's GPT has one flag"),
    (dict(num_hidden_layers=10**9), r"num_hidden_layers: 1000000000 blocks, but .*"
                                    r"model.safetensors holds tensors of 2"),
    (dict(vocab_size=None), "vocab_size: missing"),
    (dict(tie_word_embeddings="yes"), "tie_word_embeddings: expected True or False"),
    (dict(eos_token_id=[1, -1]), r"eos_token_id: expected a token id \(an int from 0\) or a "
                                 r"list of them, got \[1, -1\]"),
    (dict(use_sliding_window=True), "use_sliding_window: npformer's attention sees every"),
])
def test_a_bad_config_is_one_error_naming_file_and_field(folders, tmp_path, changes, match):
    path = edited(folders["llama-mha"][0], tmp_path, **changes)
    if "eos_token_id" in changes:
        (path / "generation_config.json").unlink()
    with pytest.raises(ValueError, match=rf"^{path / 'config.json'}: {match}"):
        nf.from_pretrained(path)


@pytest.mark.parametrize("key", ["num_attention_heads", "head_dim", "intermediate_size",
                                 "vocab_size"])
def test_a_size_past_what_numpy_can_describe_is_refused_naming_the_file(folders, tmp_path, key):
    """2**63 heads of 8 (a hypothesis example): the weights' shapes cannot even be described
    (NumPy: "Maximum allowed dimension exceeded"), so the size check must refuse the file
    before any shape is listed, in one line naming config.json."""
    path = edited(folders["llama-gqa-llama3"][0], tmp_path, **{key: 2**63})
    with pytest.raises(ValueError, match=rf"^{path / 'config.json'}: .*a model this size"):
        nf.from_pretrained(path)


def refused(folder, tmp_path, changes, match):
    """A copy of ``folder`` whose config.json has ``changes`` (as :func:`edited` takes them):
    ``from_pretrained`` refuses it with one ValueError naming the file and ``match``."""
    folder = edited(folder, tmp_path, **changes)
    with pytest.raises(ValueError, match=r"config\.json: " + match):
        nf.from_pretrained(folder)


def lm_trains(tmp_path, capsys, arch, layers):
    """``npformer lm --arch ARCH`` trains a few steps of a character model of ``layers`` blocks
    and says which family's block it is; returns the configuration the run recorded."""
    data = tmp_path / "text.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    assert main(["lm", "--data", str(data), "--arch", arch, "--out", str(tmp_path / "run"),
                 "--layers", str(layers), "--d-model", "16", "--n-heads", "2", "--context", "16",
                 "--max-steps", "2", "--batch-size", "2"]) == 0
    assert f"a GPT with {family(arch).display}'s block of" in capsys.readouterr().out
    return load_model_checkpoint(str(tmp_path / "run" / "last")).model.config


def rewrite(file, change):
    """Rewrite a safetensors file with torch tensors (any dtype) changed by ``change``."""
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(file))
    change(tensors)
    save_file(tensors, str(file))


@pytest.mark.parametrize("case,match", [
    ("shape", r"wrong \[model.layers.1.mlp.up_proj.weight: expected \(48, 32\), got \(32, 48\)\]"),
    ("dtype", r"wrong \[model.layers.0.input_layernorm.weight: expected floating-point "
              r"weights .*got I32\]"),
    ("nan", r"model.layers.1.self_attn.o_proj.weight: expected finite weights \(in float32\), "
            r"got nan"),
    ("bf16 inf", r"model.norm.weight: expected finite weights .*got inf"),
    ("f64 overflow", r"model.norm.weight: expected finite weights \(in float32\), got 1e\+300"),
    ("missing", r"missing \['model.layers.1.post_attention_layernorm.weight'\]"),
    ("unexpected", r"unexpected \['model.layers.0.self_attn.rotary.weight'\]"),
    ("truncated", r"data offsets .* inside the file's"),
])
def test_a_bad_tensor_is_one_error_naming_it(folders, tmp_path, case, match):
    path = edited(folders["llama-mha"][0], tmp_path)
    file = path / "model.safetensors"
    if case == "truncated":
        data = file.read_bytes()
        file.write_bytes(data[:-8])
    else:
        rewrite(file, {
            "shape": lambda t: t.update({"model.layers.1.mlp.up_proj.weight":
                                         t["model.layers.1.mlp.up_proj.weight"].T.contiguous()}),
            "dtype": lambda t: t.update({"model.layers.0.input_layernorm.weight":
                                         torch.ones(32, dtype=torch.int32)}),
            "nan": lambda t: t["model.layers.1.self_attn.o_proj.weight"].__setitem__((3, 4),
                                                                                   float("nan")),
            "bf16 inf": lambda t: t.update({"model.norm.weight": torch.full(
                (32,), float("inf"), dtype=torch.bfloat16)}),
            "f64 overflow": lambda t: t.update({"model.norm.weight": torch.full(
                (32,), 1e300, dtype=torch.float64)}),
            "missing": lambda t: t.pop("model.layers.1.post_attention_layernorm.weight"),
            "unexpected": lambda t: t.update({"model.layers.0.self_attn.rotary.weight":
                                              torch.zeros(3)}),
        }[case])
    with pytest.raises(ValueError, match=rf"^{file}: .*{match}"):
        nf.from_pretrained(path)


def test_a_stored_lm_head_must_equal_the_tied_embedding(folders, tmp_path):
    path = edited(folders["qwen3-gqa" if HAS_QWEN3 else "llama-gqa-llama3"][0], tmp_path)
    file = path / "model.safetensors"
    rewrite(file, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    reference = nf.from_pretrained(folders["llama-gqa-llama3"][0] if not HAS_QWEN3
                                   else folders["qwen3-gqa"][0])
    np.testing.assert_array_equal(nf.from_pretrained(path).flat_params, reference.flat_params)
    rewrite(file, lambda t: t["lm_head.weight"].__setitem__((0, 0), 5.0))
    with pytest.raises(ValueError, match=r"lm_head.weight differs from model.embed_tokens.weight"):
        nf.from_pretrained(path)


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
def test_a_bad_shard_index_is_one_error_naming_it(sharded, tmp_path, kind):
    path = tmp_path / "copy"
    if kind == "gpt2":
        from test_hf_bad_input import make_folder
        make_folder(path, n_layer=2, shards=True)
    else:
        shutil.copytree(sharded[0], path)
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    weight_map = index["weight_map"]
    first = next(iter(weight_map))
    # a shard that is not there
    missing = {**weight_map, first: "model-09-of-09.safetensors"}
    index_file.write_text(json.dumps({**index, "weight_map": missing}))
    with pytest.raises(ValueError, match=rf"^{index_file}: weight_map\['{first}'\]: names "
                                         r"'model-09-of-09.safetensors', which is not a file"):
        nf.from_pretrained(path)
    # one tensor named twice in the index (JSON keeps the last silently)
    text = json.dumps(index)
    shard = weight_map[first]
    twice = text.replace('"weight_map": {', f'"weight_map": {{"{first}": "{shard}", ', 1)
    index_file.write_text(twice)
    with pytest.raises(ValueError, match=rf"^{index_file}: '{first}' appears twice"):
        nf.from_pretrained(path)
    # one tensor held by two shards
    index_file.write_text(json.dumps(index))
    shards = sorted(set(weight_map.values()))
    other = next(s for s in shards if s != shard)
    from safetensors.torch import load_file
    copy_of = load_file(str(path / shard))[first]
    rewrite(path / other, lambda t: t.update({first: copy_of}))
    with pytest.raises(ValueError, match=rf"holds '{first}', which model\S+ holds too"):
        nf.from_pretrained(path)
    # an index that maps no tensor (it was read as a safetensors file)
    index_file.write_text(json.dumps({**index, "weight_map": {}}))
    with pytest.raises(ValueError, match=rf"^{index_file}: its weight_map maps no tensor"):
        nf.from_pretrained(path)


class Exploit:
    """Unpickling this writes a file: what loading a hostile pytorch_model.bin would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_is_never_unpickled(folders, tmp_path, capsys):
    path = edited(folders["llama-mha"][0], tmp_path)
    (path / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    (path / "pytorch_model.bin").write_bytes(pickle.dumps(Exploit(marker)))
    with pytest.raises(ValueError, match="holds only pytorch_model.bin, a pickle, which npformer "
                                         "never loads"):
        nf.from_pretrained(path)
    assert main(["sample", "--hf", str(path), "--prompt", "x"]) == 1
    err = capsys.readouterr().err
    assert "pytorch_model.bin" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()


def test_commands_report_a_bad_folder_in_one_line(folders, tmp_path, capsys):
    path = edited(folders["llama-mha"][0], tmp_path, num_key_value_heads=3)
    assert main(["sample", "--hf", str(path), "--prompt", "x"]) == 1
    err = capsys.readouterr().err.strip()
    assert "config.json: num_key_value_heads" in err and len(err.splitlines()) == 1
    data = tmp_path / "text.txt"
    data.write_text("\n".join(TEXT), encoding="utf-8")
    assert main(["lm", "--data", str(data), "--init-from", str(path), "--out",
                 str(tmp_path / "run"), "--max-steps", "1", "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert "config.json: num_key_value_heads" in err and len(err.splitlines()) == 1


def test_gpt2_still_loads_through_from_pretrained(tmp_path):
    from test_gpt_hf import make_folder
    make_folder(tmp_path)
    model = nf.from_pretrained(tmp_path, dtype=np.float64)
    np.testing.assert_array_equal(model.flat_params,
                                  nf.GPT.from_pretrained(tmp_path, dtype=np.float64).flat_params)
    assert model.config.positions == "learned" and model.eos_id is not None


# -- property: a Llama-family folder edited at random loads or is refused naming its file ----------
LLAMA_KEYS = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta",
              "rope_scaling", "rope_parameters", "tie_word_embeddings", "attention_bias",
              "mlp_bias", "hidden_act", "eos_token_id", "model_type", "use_sliding_window",
              "layer_types", "partial_rotary_factor"]


def _property_edits():
    from hypothesis import strategies as st
    from test_hf_loader_property import DEPTH, NUMBERS, VALUES, header_edits, index_edits
    keys = st.sampled_from(LLAMA_KEYS)
    return st.one_of(
        st.tuples(st.just("config value"), keys, VALUES),
        st.tuples(st.just("config value"), keys, NUMBERS),
        st.tuples(st.just("config removed"), keys, st.none()),
        st.tuples(st.just("config nested"), keys, DEPTH),
        st.tuples(st.just("config value"), st.just("rope_parameters"),
                  st.fixed_dictionaries({"rope_type": st.sampled_from(["llama3", "yarn", 3])},
                                        optional={k: NUMBERS for k in LLAMA3
                                                  if k != "rope_type"})),
        index_edits, header_edits)


def test_an_edited_folder_loads_or_is_refused_naming_its_file(folders, sharded, tmp_path):
    """As tests/test_hf_loader_property.py for GPT-2 (every load in a child capped at 1 GiB more
    than it maps, and 5 s): config.json's keys, the shard index and the safetensors headers
    edited at random. (max_position_embeddings is left alone: see the expected failure below.)"""
    hypothesis = pytest.importorskip("hypothesis")
    from test_hf_loader_property import loads_or_is_refused

    @hypothesis.settings(max_examples=40, deadline=None, database=None)
    @hypothesis.given(edit=_property_edits())
    def check(edit):
        source = sharded[0] if edit[0].startswith("index") else folders["llama-gqa-llama3"][0]
        loads_or_is_refused(source, tmp_path / "folder", edit, lambda path: bool(
            np.isfinite(nf.from_pretrained(path).flat_params).all()))
    check()


def test_a_long_context_is_refused_or_built_within_the_memory_check(folders, tmp_path):
    from test_hf_loader_property import run_bounded
    path = edited(folders["llama-mha"][0], tmp_path, max_position_embeddings=2**24)
    outcome, message = run_bounded(lambda: nf.from_pretrained(path).max_len, seconds=30)
    assert outcome in ("ok", "ValueError"), (outcome, message)


def test_a_long_context_is_refused_for_its_rotary_tables_naming_the_key(folders, tmp_path,
                                                                         monkeypatch):
    """Issue 77: max_position_embeddings 10**9 was refused for needing 30 GiB "for its weights
    and gradients"; the 30 GiB are the rotary tables (10**9 positions x head size 8 x 4 bytes),
    and the message says so, naming config.json's keys. A model loaded to sample holds no
    gradients (its gradient buffer is never written), so none are counted."""
    monkeypatch.setattr(nf.configs, "available_memory", lambda: 8 << 30)
    path = edited(folders["llama-mha"][0], tmp_path, max_position_embeddings=10**9)
    with pytest.raises(ValueError, match=(
            rf"^{path / 'config.json'}: vocab_size=\d+ hidden_size=32 intermediate_size=48 "
            r"num_hidden_layers=2 max_position_embeddings=1000000000( head_dim=8)?: a model this "
            r"size \([\d,]+ float32 parameters\) needs at least 30 GiB of memory for its weights "
            r"\(0.00 GiB\) and its rotary tables \(30 GiB\), more than this "
            r"machine's 8 GiB")):
        nf.from_pretrained(path)


def test_logits_that_overflow_stop_sampling_naming_the_first_layer(folders, tmp_path, capsys):
    """Issue 77: finite weights that overflow in the forward (a bfloat16 3.3e38) gave NaN
    logits, sampled as a uniform distribution with exit 0. Sampling stops, naming the layer."""
    path = edited(folders["llama-mha"][0], tmp_path)

    def overflow(tensors):
        up = tensors["model.layers.0.mlp.up_proj.weight"].to(torch.bfloat16)
        up[:4] = 3.3e38
        tensors["model.layers.0.mlp.up_proj.weight"] = up
    rewrite(path / "model.safetensors", overflow)
    model = nf.from_pretrained(path)                         # every weight is finite
    layer = "blocks.0.ffn.linear1 is the first layer whose output is not finite"
    with pytest.raises(ValueError, match=f"logits are not finite.*{layer}"):
        nf.decoding.sample_search(model.decoder_state(np.array([[1, 2, 3]])), max_new_tokens=3,
                                  rng=np.random.default_rng(0))
    assert not any("forward" in m.__dict__ for m in model.modules())    # each its own again
    for method in (["--greedy"], ["--seed", "1"]):
        assert main(["sample", "--hf", str(path), "--prompt", "hello world",
                     "--max-new-tokens", "3", *method]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and layer in err and "Traceback" not in err, err
