"""LoRA (npformer.functional.lora, npformer.nn.lora, npformer.lora): the pair against central
differences in float64 (dropout on, no dW for the frozen weight), adapters on fused rows and on
whole models (a Llama-style GPT, GPT-2's block, the translator) gradient-checked, frozen
parameters out of the gradient buffer, the optimizer and the clipping, merge and unmerge, the
checkpoints of a LoRA run (adapters only, the base by folder and hash, resume bit for bit) and
every bad input the issue lists. No PyTorch here: tests/test_lora_peft.py holds the PEFT
round trips."""
import os
import re
import shutil

import numpy as np
import pytest

import npformer as nf
from npformer import functional as F
from npformer import lora
from npformer.checkpoint import load_checkpoint, save_checkpoint
from npformer.data.characters import CharTokenizer
from npformer.data.vocab import Vocabularies
from npformer.testing import assert_gradients, check_model, check_module
from npformer.training.checkpointing import load_model_checkpoint, save_model_checkpoint


def llama_gpt(dtype="float64", seed=0, **changes):
    """A tiny GPT with Llama's block: RMSNorm, SwiGLU, rotary, grouped key/value heads."""
    fields = dict(vocab_size=23, d_model=16, n_heads=4, n_kv_heads=2, d_ff=24, n_layers=2,
                  max_len=12, dropout=0.0, positions="rotary", norm="rmsnorm", ffn="gated",
                  activation="silu", qkv_bias=False, proj_bias=False, tie_embeddings=False, dtype=dtype, seed=seed)
    fields.update(changes)
    return nf.GPT(**fields)


def randomise_b(model, seed=1, scale=0.3):
    """B starts at zero (the base's function); give it values so that every path is exercised."""
    rng = np.random.default_rng(seed)
    for _, m in lora.adapters(model):
        m.B.data[...] = rng.standard_normal(m.B.data.shape) * scale


def batch(seed=0, vocab=23, shape=(2, 7)):
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, shape), rng.integers(0, vocab, shape)


# -- the functional pair ------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_lora_pair_gradients(p):
    """dx, dA, dB of lora_backward against central differences in float64, dropout on the
    adapter's input (the same mask at every evaluation: a fresh generator of one seed)."""
    rng = np.random.default_rng(0)
    x, w, bias = rng.standard_normal((2, 3, 6)), rng.standard_normal((5, 6)), rng.standard_normal(5)
    a, b = rng.standard_normal((2, 6)), rng.standard_normal((5, 2))

    def fn(x, a, b):
        y, cache = F.lora_forward(x, w, bias, a, b, 1.5, p, np.random.default_rng(7))
        return y, lambda dy: F.lora_backward(dy, cache)
    assert_gradients(fn, [x, a, b], names=["x", "A", "B"])


def test_lora_pair_is_linear_plus_update_and_has_no_dw():
    """The forward is the frozen product plus (alpha / r) B A x; the backward returns three
    arrays, dx, dA and dB: no (D_out, D_in) weight gradient at all."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((4, 6)), rng.standard_normal((5, 6))
    a, b = rng.standard_normal((3, 6)), rng.standard_normal((5, 3))
    y, cache = F.lora_forward(x, w, None, a, b, 2.0)
    np.testing.assert_allclose(y, x @ (w + 2.0 * b @ a).T, rtol=1e-12)
    grads = F.lora_backward(np.ones_like(y), cache)
    assert [g.shape for g in grads] == [x.shape, a.shape, b.shape]
    y_eval, _ = F.lora_forward(x, w, None, a, b, 2.0, 0.5, np.random.default_rng(0), training=False)
    np.testing.assert_array_equal(y_eval, y)                  # no dropout in evaluation


def test_dropout_touches_the_adapter_path_only():
    """With B = 0 the update is zero whatever the mask: the frozen product sees x undropped."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((4, 6)), rng.standard_normal((5, 6))
    y, _ = F.lora_forward(x, w, None, rng.standard_normal((2, 6)), np.zeros((5, 2)), 1.0, 0.9,
                          np.random.default_rng(0))
    np.testing.assert_array_equal(y, x @ w.T)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_the_numba_backends_adapter_path_is_the_references_through_the_dispatcher(
        monkeypatch, dtype, tol):
    """The Numba backend's adapter pair computes the reference's delta and gradients (dropout on:
    the same mask for the same seed), each of its six products through the matmul dispatcher
    (the backend's own, as a linear layer's), none by NumPy's @ outside it."""
    import importlib
    from npformer import backend
    kernels = backend.load("numba")
    twin = importlib.import_module("npformer.kernels.lora")
    products = []

    def counted(a, b, *args, **kwargs):
        products.append((a.shape, b.shape))
        return kernels.matmul(a, b, *args, **kwargs)
    monkeypatch.setattr(twin, "matmul", counted)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 12)).astype(dtype)
    a, b = rng.standard_normal((3, 12)).astype(dtype), rng.standard_normal((7, 3)).astype(dtype)
    dy = rng.standard_normal((2, 5, 7)).astype(dtype)
    ours, cache = kernels.adapter_forward(x, a, b, 1.5, 0.3, np.random.default_rng(4))
    grads = kernels.adapter_backward(dy, cache)
    theirs, ref_cache = F.adapter_forward(x, a, b, 1.5, 0.3, np.random.default_rng(4))
    np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol)
    for g, r in zip(grads, F.adapter_backward(dy, ref_cache)):
        assert g.dtype == dtype
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol)
    assert products == [((10, 12), (12, 3)), ((10, 3), (3, 7)), ((7, 10), (10, 3)),
                        ((10, 7), (7, 3)), ((3, 10), (10, 12)), ((10, 3), (3, 12))]


# -- modules: fused rows, frozen weights ----------------------------------------------------------
def test_linear_with_adapter_on_rows_checks_and_skips_dw(monkeypatch):
    """A Linear whose weight is frozen and whose rows 2:5 carry an adapter: its trained
    parameters (A and B) and its input check against central differences, and its backward
    never calls the weight-gradient product."""
    nf.set_backend("numpy")
    try:
        rng = np.random.default_rng(3)
        lin = nf.nn.Linear(6, 7, rng=rng, dtype=np.float64)
        lin.weight.grad = lin.bias.grad = None
        adapter = nf.nn.lora.LoRA(6, 2, 5, 2, 4.0, rng=rng, dropout_rng=rng, dtype=np.float64)
        adapter.B.data[...] = rng.standard_normal(adapter.B.data.shape)
        lin.lora = adapter
        lin.adapters.append(adapter)
        x = rng.standard_normal((2, 3, 6))
        result = check_module(lin, lin.forward, lin.backward, [x], names=["x"])
        assert result.ok, result
        calls = []
        spied = F.linear_backward_accumulate
        monkeypatch.setattr(F, "linear_backward_accumulate",
                            lambda *a, **k: calls.append(1) or spied(*a, **k))
        lin.forward(x)
        lin.backward(np.ones((2, 3, 7)))
        assert calls == []                                      # frozen: no dW product
        trained = nf.nn.Linear(6, 7, rng=rng, dtype=np.float64)
        trained.forward(x)
        trained.backward(np.ones((2, 3, 7)))
        assert calls == [1]                                     # (the spy sees a trained one)
    finally:
        nf.set_backend("numba")


@pytest.mark.parametrize("targets", [["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"], ["in_proj", "linear1", "linear2"]])
def test_llama_gpt_with_adapters_checks(targets):
    """A Llama-style GPT with adapters everywhere (PEFT's names through the rename table: q, k,
    v rows of the fused in_proj_weight, gate and up rows of linear1; or npformer's own): the
    loss's gradient with respect to every adapter checks, and nothing else is trained."""
    model = lora.apply(llama_gpt(), rank=2, alpha=3.0, target_modules=targets)
    randomise_b(model)
    trained = [n for n, p in model.named_parameters() if p.grad is not None]
    assert trained and all(lora.is_adapter_name(n) for n in trained)
    result = check_model(model, batch(), fast=True)
    assert result, result


def test_gpt2_block_and_translator_take_npformer_names():
    """GPT-2's block (LayerNorm, biases, learned positions, tied embeddings) and the
    encoder-decoder (a cross-attention's query rows and key/value rows get one adapter each)
    train adapters under npformer's names; their gradients check."""
    gpt = lora.apply(nf.GPT(vocab_size=19, d_model=12, n_heads=3, d_ff=20, n_layers=1, max_len=8,
                            dropout=0.0, dtype="float64"), rank=2,
                     target_modules=["in_proj", "out_proj", "linear1", "linear2"])
    randomise_b(gpt)
    result = check_model(gpt, batch(vocab=19), fast=True)
    assert result, result
    model = nf.Transformer(src_vocab_size=17, tgt_vocab_size=17, d_model=8, n_heads=2, d_ff=12,
                           n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, dtype="float64")
    lora.apply(model, rank=2, target_modules=["in_proj", "out_proj"])
    names = [p for p, _ in lora.adapters(model)]
    assert any(p.endswith("multihead_attn.lora_in_proj_q") for p in names)
    assert any(p.endswith("multihead_attn.lora_in_proj_kv") for p in names)
    randomise_b(model)
    rng = np.random.default_rng(4)
    src, tgt = rng.integers(3, 17, (2, 5)), rng.integers(3, 17, (2, 6))
    result = check_model(model, (src, tgt[:, :-1], tgt[:, 1:]), fast=True)
    assert result, result


def test_frozen_parameters_leave_buffer_optimizer_and_clipping():
    """After apply: flat_params and flat_grads hold the adapters alone, Adam's moments are that
    size, a step with clipping moves A and B and not one bit of a base weight."""
    model = llama_gpt("float32")
    base = {n: p.data.copy() for n, p in model.named_parameters()}
    lora.apply(model, rank=2, target_modules=["q_proj", "v_proj"])
    n_adapter = sum(p.data.size for n, p in model.named_parameters() if lora.is_adapter_name(n))
    assert model.flat_params.size == model.flat_grads.size == n_adapter
    assert n_adapter == 2 * 2 * 2 * (16 + 16) - 2 * 2 * 8     # q 16 rows, v 8 rows, r 2, 2 layers
    opt = nf.AdamW(model, lr=1e-2)
    assert opt.exp_avg.size == n_adapter
    ids, targets = batch(vocab=23)
    model.train()
    for _ in range(2):
        model.zero_grad()
        loss, dlogits = nf.cross_entropy(model.forward(ids), targets)
        model.backward(dlogits)
        nf.clip_grad_norm(model, 0.01)
        opt.step()
    for n, p in model.named_parameters():
        if lora.is_adapter_name(n):
            assert p.grad is not None
        else:
            assert p.grad is None
            np.testing.assert_array_equal(p.data, base[n], err_msg=n)
    assert any(np.abs(m.B.data).max() > 0 for _, m in lora.adapters(model))


def test_merge_and_unmerge():
    """Merged weights give the adapters' logits without them; unmerge gives the base plus the
    adapters back (the base's bits); a merged model refuses to train."""
    model = lora.apply(llama_gpt(), rank=3, alpha=6.0,
                       target_modules=["q_proj", "k_proj", "o_proj", "up_proj", "down_proj"])
    randomise_b(model)
    ids, _ = batch()
    model.eval()
    with_adapters = model.forward(ids)
    base_w = model.blocks[0].self_attn.in_proj_weight.data.copy()
    lora.merge(model)
    assert not np.array_equal(model.blocks[0].self_attn.in_proj_weight.data, base_w)
    np.testing.assert_allclose(model.forward(ids), with_adapters, rtol=1e-10, atol=1e-12)
    model.train()
    with pytest.raises(ValueError, match="merged into the base weights; npformer.lora.unmerge"):
        model.forward(ids)
    model.eval()
    lora.unmerge(model)
    np.testing.assert_array_equal(model.blocks[0].self_attn.in_proj_weight.data, base_w)
    np.testing.assert_allclose(model.forward(ids), with_adapters, rtol=1e-10, atol=1e-12)


def test_merge_then_unmerge_keeps_the_base_bits_and_its_checkpoints_load(tmp_path):
    """merge + unmerge gives back the base weights bit for bit (not to within rounding): a run
    saved afterwards records its base's own sha256, loads over it, and trains on exactly as one
    that never merged."""
    folder, vocabs = save_base(tmp_path)
    runs = {}
    for name in ("merged", "never"):
        model = lora_model(folder, target_modules=["q_proj", "v_proj", "down_proj"])
        del model.lora.base["sha256"]             # computed at the first save, as lm's runs do
        randomise_b(model, scale=3.0)
        base = {n: p.data.copy() for n, p in model.named_parameters()}
        if name == "merged":
            lora.merge(model)
            lora.unmerge(model)
        for n, p in model.named_parameters():
            np.testing.assert_array_equal(p.data, base[n], err_msg=n)
        save_model_checkpoint(tmp_path / name, model, vocabs)
        model = load_model_checkpoint(tmp_path / name).model
        opt = nf.AdamW(model, lr=1e-2)
        ids, targets = batch()
        model.train()
        for _ in range(2):
            model.zero_grad()
            _, dlogits = nf.cross_entropy(model.forward(ids), targets)
            model.backward(dlogits)
            opt.step()
        runs[name] = {n: p.data.copy() for n, p in model.named_parameters()}
    assert runs["merged"].keys() == runs["never"].keys()
    for n in runs["never"]:
        np.testing.assert_array_equal(runs["merged"][n], runs["never"][n], err_msg=n)

def test_adapters_in_decoding_match_the_full_forward():
    """The cached decoding path runs the adapters too: the last position's logits of a cached
    step equal the full forward's."""
    model = lora.apply(llama_gpt(), rank=2, target_modules=["q_proj", "v_proj", "down_proj"])
    randomise_b(model)
    model.eval()
    ids, _ = batch(shape=(1, 6))
    full = model.forward(ids)[:, -1]
    state = model.decoder_state(ids)
    step = state.step(state.first_tokens())
    np.testing.assert_allclose(step, F.log_softmax(full.astype(np.float64)), atol=1e-10)


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(rank=0), "rank: expected a positive integer, got 0"),
    (dict(rank=-2), "rank: expected a positive integer, got -2"),
    (dict(rank=2.5), "rank: expected a positive integer"),
    (dict(rank=9), r"rank: expected at most 8, the width of the narrowest targeted layer "
                   r"\(v_proj"),
    (dict(alpha=0), "alpha"),
    (dict(alpha=-1.0), "alpha"),
    (dict(alpha=float("nan")), "alpha"),
    (dict(alpha=float("inf")), "alpha"),
    (dict(dropout=1.0), "dropout"),
    (dict(dropout=-0.1), "dropout"),
    (dict(target_modules=["qproj"]), r"target_modules: 'qproj' matches no module of this GPT; "
                                     r"it has q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                     r"down_proj, in_proj, out_proj, linear1, linear2, generator"),
    (dict(target_modules=[]), "target_modules: expected a non-empty list"),
    (dict(target_modules=["q_proj", "in_proj"]), "adapt the same rows"),
])
def test_bad_settings_are_refused_naming_them(kwargs, message):
    model = llama_gpt()
    before = model.flat_params.copy()
    with pytest.raises(ValueError, match=message):
        lora.apply(model, **{"rank": 2, "target_modules": ["q_proj", "v_proj"], **kwargs})
    assert lora.settings(model) is None and np.array_equal(model.flat_params, before)


def test_a_tied_generator_is_refused_naming_the_weight_it_shares():
    """A tied output projection is the embedding's weight: an adapter on it would merge into
    the embedding too. It is refused naming the target and the tie (not a KeyError), and the
    refusals of other names do not offer it."""
    for model in (nf.GPT(vocab_size=19, d_model=12, n_heads=3, d_ff=20, n_layers=1, max_len=8),
                  llama_gpt(tie_embeddings=True)):
        before = model.flat_params.copy()
        with pytest.raises(ValueError, match=r"^target_modules: 'generator' shares its weight "
                                             r"with tok_embed.weight \(tie_embeddings\)"):
            lora.apply(model, rank=2, target_modules=["generator"])
        assert lora.settings(model) is None and np.array_equal(model.flat_params, before)
        with pytest.raises(ValueError, match="matches no module") as refused:
            lora.apply(model, rank=2, target_modules=["nope"])
        assert "generator" not in str(refused.value)
    assert "generator" in lora.available_targets(llama_gpt())

@pytest.mark.parametrize("targets", ["q_proj,v_proj", ["q_proj,v_proj"], ["q_proj, v_proj"],
                                     ["q_proj,", "v_proj"], ("q_proj", "v_proj,q_proj")])
def test_targets_may_be_separated_by_commas(targets):
    """The comma form of fine-tuning tools' command lines names the same adapters as a list."""
    model = lora.apply(llama_gpt(), rank=2, target_modules=targets)
    plain = lora.apply(llama_gpt(), rank=2, target_modules=["q_proj", "v_proj"])
    assert model.lora.targets == ("q_proj", "v_proj")
    assert [p for p, _ in lora.adapters(model)] == [p for p, _ in lora.adapters(plain)]
    with pytest.raises(ValueError, match="target_modules: expected a non-empty list of names"):
        lora.apply(llama_gpt(), rank=2, target_modules=[" , "])

def test_gated_names_on_an_mlp_and_a_second_apply_are_refused():
    gpt2 = nf.GPT(vocab_size=19, d_model=12, n_heads=3, d_ff=20, n_layers=1, max_len=8)
    with pytest.raises(ValueError, match="'gate_proj': this model's feed-forward is not gated"):
        lora.apply(gpt2, rank=2, target_modules=["gate_proj"])
    model = lora.apply(llama_gpt(), rank=2)
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        lora.apply(model, rank=2)


FLAGS = {"rank": "--r", "alpha": "--a", "dropout": "--p", "target_modules": "--t"}


@pytest.mark.parametrize("kwargs, message", [
    (dict(rank=0), "--r: expected a positive integer, got 0"),
    (dict(rank=9), "--r: expected at most 8, the width of the narrowest targeted layer"),
    (dict(alpha=-1.0), "--a: expected a finite positive number, got -1.0"),
    (dict(dropout=1.0), r"--p: expected a finite number in \[0, 1\), got 1.0"),
    (dict(target_modules=["qproj"]), "--t: 'qproj' matches no module"),
    (dict(target_modules=["q_proj", "in_proj"]), "--t: 'q_proj' and 'in_proj' adapt the same"),
    (dict(target_modules=[]), "--t: expected a non-empty list of names"),
])
def test_refusals_name_the_settings_as_the_caller_calls_them(kwargs, message):
    """names= (a command's flags): every refusal of apply names the setting so, from the message
    itself, not by rewriting another; check_settings likewise, and unknown keys are refused."""
    with pytest.raises(ValueError, match="^" + message):
        lora.apply(llama_gpt(), **{"rank": 2, "target_modules": ["q_proj", "v_proj"], **kwargs},
                   names=FLAGS)
    with pytest.raises(ValueError, match=r"^--lora-alpha: expected a finite positive number"):
        lora.check_settings(2, 0.0, 0.1, names={"alpha": "--lora-alpha"})
    with pytest.raises(ValueError, match="^names: expected keys among rank, alpha, dropout, "
                                         "target_modules, got 'ranks'"):
        lora.check_settings(2, 2.0, 0.1, names={"ranks": "--r"})
    gpt2 = nf.GPT(vocab_size=19, d_model=12, n_heads=3, d_ff=20, n_layers=1, max_len=8)
    with pytest.raises(ValueError, match="^--t: 'gate_proj': this model's feed-forward is not"):
        lora.apply(gpt2, rank=2, target_modules=["gate_proj"], names=FLAGS)


# -- checkpoints ----------------------------------------------------------------------------------
def lora_model(folder, **kwargs):
    model = load_model_checkpoint(folder).model
    lora.apply(model, **{"rank": 2, "target_modules": ["q_proj", "v_proj"], **kwargs})
    model.lora.base = {"folder": str(folder), "kind": "npformer",
                       "sha256": lora.base_sha256(model)}
    return model


def save_base(tmp_path, seed=0):
    tokenizer = CharTokenizer.from_text("abcdefghijklmnopqrs")        # 4 specials + 19: 23
    model = llama_gpt("float32", seed=seed, vocab_size=len(tokenizer))
    vocabs = Vocabularies.joint(tokenizer.vocab)
    save_model_checkpoint(tmp_path / f"base{seed}", model, vocabs)
    return tmp_path / f"base{seed}", vocabs


def test_checkpoint_holds_adapters_only_and_reloads(tmp_path):
    folder, vocabs = save_base(tmp_path)
    model = lora_model(folder)
    randomise_b(model)
    save_model_checkpoint(tmp_path / "run", model, vocabs)
    arrays, meta = load_checkpoint(tmp_path / "run")
    stored = [k for k in arrays if k.startswith("model/")]
    assert stored and all(lora.is_adapter_name(k) for k in stored)
    assert meta["lora"]["base"]["folder"] == str(folder)
    loaded = load_model_checkpoint(tmp_path / "run").model
    ids, _ = batch()
    model.eval()
    np.testing.assert_array_equal(loaded.forward(ids), model.forward(ids))


def test_adapter_of_another_base_is_refused(tmp_path):
    folder, vocabs = save_base(tmp_path)
    model = lora_model(folder)
    save_model_checkpoint(tmp_path / "run", model, vocabs)
    other, _ = save_base(tmp_path, seed=5)
    for suffix in (".npz", ".json"):                    # the base folder now holds other weights
        shutil.copyfile(str(other) + suffix, str(folder) + suffix)
    with pytest.raises(ValueError, match="is an adapter for another base model"):
        load_model_checkpoint(tmp_path / "run")


@pytest.mark.parametrize("edit, message", [
    (lambda a: a.pop(next(k for k in a if k.endswith(".A"))), "missing"),
    (lambda a: a.__setitem__("model/blocks.0.self_attn.lora_x.A", np.zeros((2, 16), np.float32)),
     "unexpected"),
    (lambda a: a.__setitem__(next(k for k in a if k.endswith(".B")), np.zeros((3, 3), np.float32)),
     "expected shape"),
    (lambda a: a.__setitem__(next(k for k in a if k.endswith(".A")),
                             np.full(a[next(k for k in a if k.endswith(".A"))].shape, np.nan,
                                     np.float32)), "non-finite"),
    (lambda a: a.__setitem__(next(k for k in a if k.endswith(".A")),
                             a[next(k for k in a if k.endswith(".A"))].astype(np.float64)),
     "expected float32, got float64"),
])
def test_bad_adapter_files_are_refused(tmp_path, edit, message):
    folder, vocabs = save_base(tmp_path)
    save_model_checkpoint(tmp_path / "run", lora_model(folder), vocabs)
    arrays, meta = load_checkpoint(tmp_path / "run")
    edit(arrays)
    save_checkpoint(tmp_path / "bad", arrays, meta)
    with pytest.raises(ValueError, match=message):
        load_model_checkpoint(tmp_path / "bad")


def test_layer_gradient_norms_skip_frozen_weights():
    """The training log's per-layer gradient norms cover the trained adapters alone."""
    from npformer.training.grad_norms import layer_grad_norms
    model = lora.apply(llama_gpt(), rank=2, target_modules=["q_proj"])
    randomise_b(model)
    ids, targets = batch()
    _, dlogits = nf.cross_entropy(model.forward(ids), targets)
    model.backward(dlogits)
    norms = layer_grad_norms(model)
    assert list(norms) == ["blocks.0", "blocks.1"] and all(v > 0 for v in norms.values())


# -- the command: lm --init-from --lora-rank, resume --------------------------------------------
LM_TEXT = "the quick brown fox jumps over the lazy dog. hello world, hello npformer.\n" * 30


def lm_base(tmp_path):
    """An npformer GPT checkpoint with Llama's block over the text's characters, and the text."""
    tokenizer = CharTokenizer.from_text(LM_TEXT)
    model = llama_gpt("float32", vocab_size=len(tokenizer), max_len=16, dropout=0.1)
    save_model_checkpoint(tmp_path / "base", model, Vocabularies.joint(tokenizer.vocab))
    (tmp_path / "text.txt").write_text(LM_TEXT)
    return tmp_path / "base", tmp_path / "text.txt"


def lm_args(data, base, out, steps, *more):
    return ["lm", "--data", str(data), "--init-from", str(base), "--out", str(out),
            "--lora-rank", "2", "--lora-dropout", "0.2", "--lora-targets", "q_proj", "down_proj",
            "--context", "12", "--batch-size", "3", "--max-steps", "6", "--eval-every",
            str(steps), "--sample-tokens", "0", "--quiet", *more]


def test_lm_lora_run_resumes_bit_for_bit(tmp_path, capsys):
    """6 updates straight, or 1 (a time budget that ends the run after its first update) then a
    resume to 6: the same adapters, moments and dropout stream, bit for bit; the checkpoints
    hold the adapters alone."""
    from npformer.cli.main import main
    base, data = lm_base(tmp_path)
    assert main(lm_args(data, base, tmp_path / "straight", 6)) == 0
    assert "parameters train, the other" in capsys.readouterr().out
    assert main(lm_args(data, base, tmp_path / "split", 6, "--time-budget", "1e-9")) == 0
    assert load_checkpoint(tmp_path / "split" / "last")[1]["training"]["step"] == 1
    assert main(["lm", "--data", str(data), "--out", str(tmp_path / "split"), "--resume",
                 str(tmp_path / "split" / "last"), "--time-budget", "100", "--quiet"]) == 0
    (a, meta), (b, _) = load_checkpoint(tmp_path / "straight" / "last"), \
        load_checkpoint(tmp_path / "split" / "last")
    assert meta["training"]["step"] == 6 and a.keys() == b.keys()
    assert all(lora.is_adapter_name(k[len("model/"):]) for k in a if k.startswith("model/"))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("argv, message", [
    (["--lora-rank", "3"], r"a resume cannot change --lora-rank: --lora-rank 2 in the checkpoint, "
                           r"3 given"),
    (["--lora-targets", "q_proj"], "a resume cannot change --lora-targets"),
    (["--lora-alpha", "5"], "a resume cannot change --lora-alpha"),
])
def test_resume_with_other_lora_settings_is_refused(tmp_path, capsys, argv, message):
    from npformer.cli.main import main
    base, data = lm_base(tmp_path)
    assert main(lm_args(data, base, tmp_path / "run", 3, "--max-steps", "3")) == 0
    capsys.readouterr()
    assert main(["lm", "--data", str(data), "--out", str(tmp_path / "run"), "--resume",
                 str(tmp_path / "run" / "last"), "--max-steps", "6", *argv]) == 1
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("argv, message", [
    (["--lora-alpha", "4"], "--lora-alpha: only with --lora-rank R"),
    (["--lora-rank", "2"], "--lora-rank: adapts a trained model; give it with --init-from DIR"),
    (["--lora-rank", "2", "--lora-targets", "nope"], "--lora-targets: 'nope' matches no module"),
    (["--lora-rank", "99"], "--lora-rank: expected at most 8, the width of the narrowest"),
])
def test_bad_lora_options_are_one_line_errors(tmp_path, capsys, argv, message):
    from npformer.cli.main import main
    base, data = lm_base(tmp_path)
    init = [] if "--init-from DIR" in message or "only with" in message else \
        ["--init-from", str(base)]
    assert main(["lm", "--data", str(data), "--out", str(tmp_path / "run"), "--max-steps", "1",
                 "--quiet", *init, *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_lm_refuses_a_tied_generator_in_one_line(tmp_path, capsys):
    """lm --lora-targets generator on a base whose output projection is its embedding: one line
    naming the flag and the tie, exit 1, not an internal error (exit 70)."""
    from npformer.cli.main import main
    tokenizer = CharTokenizer.from_text(LM_TEXT)
    model = llama_gpt("float32", vocab_size=len(tokenizer), max_len=16, tie_embeddings=True)
    save_model_checkpoint(tmp_path / "base", model, Vocabularies.joint(tokenizer.vocab))
    (tmp_path / "text.txt").write_text(LM_TEXT)
    assert main(["lm", "--data", str(tmp_path / "text.txt"), "--out", str(tmp_path / "run"),
                 "--init-from", str(tmp_path / "base"), "--max-steps", "1", "--quiet",
                 "--lora-rank", "2", "--lora-targets", "generator"]) == 1
    err = capsys.readouterr().err
    assert "--lora-targets: 'generator' shares its weight with tok_embed.weight" in err
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err

def test_lm_takes_comma_separated_targets_and_records_the_names(tmp_path, capsys):
    """lm --lora-targets q_proj,down_proj (and "q_proj," "down_proj") trains those adapters and
    records the two names, which a resume giving them space-separated keeps."""
    from npformer.cli.main import main
    base, data = lm_base(tmp_path)
    argv = lm_args(data, base, tmp_path / "run", 1, "--max-steps", "1")
    at = argv.index("--lora-targets")
    argv[at + 1:at + 3] = ["q_proj,down_proj"]
    assert main(argv) == 0
    assert "on q_proj, down_proj:" in capsys.readouterr().out
    meta = load_checkpoint(tmp_path / "run" / "last")[1]
    assert meta["extra"]["options"]["lora_targets"] == ["q_proj", "down_proj"]
    assert meta["lora"]["targets"] == ["q_proj", "down_proj"]
    assert main(["lm", "--data", str(data), "--out", str(tmp_path / "run"), "--resume",
                 str(tmp_path / "run" / "last"), "--max-steps", "2", "--quiet",
                 "--lora-targets", "q_proj,", "down_proj"]) == 0

def test_a_lora_dropout_outside_0_1_is_refused_by_the_parser(tmp_path, capsys):
    from npformer.cli.main import main
    base, data = lm_base(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["lm", "--data", str(data), "--out", str(tmp_path / "run"), "--init-from",
              str(base), "--lora-rank", "2", "--lora-dropout", "1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--lora-dropout: expected a finite number in [0, 1), got '1'" in err
    assert "Traceback" not in err


# -- npformer export --format peft ----------------------------------------------------------------
def lora_run(tmp_path):
    """A saved LoRA run over an npformer checkpoint with Llama's block (PEFT's names fit it)."""
    folder, vocabs = save_base(tmp_path)
    save_model_checkpoint(tmp_path / "run", lora_model(folder), vocabs)
    return tmp_path / "run"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o755), (0o077, 0o700)])
def test_a_peft_export_folder_honours_the_umask(tmp_path, umask, mode, capsys):
    from npformer.cli.main import main
    run = lora_run(tmp_path)
    old = os.umask(umask)
    try:
        assert main(["export", "--checkpoint", str(run), "--format", "peft", "--out",
                     str(tmp_path / "peft")]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "peft").stat().st_mode & 0o777 == mode
    assert (tmp_path / "peft" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("format_", ["peft", "hf"])
def test_an_out_that_appears_during_a_lora_export_is_not_replaced(tmp_path, capsys, monkeypatch,
                                                                   format_):
    """--out is checked before the export and again just before the rename: a folder that
    appears at --out while the adapter is written is kept, not set aside and deleted. (The hf
    merge itself, which needs a Hugging Face base folder, is stood in for here: it is tested in
    test_lora_peft.py; what is tested here is the folder's swap.)"""
    from npformer import lora_files
    from npformer.cli.main import main
    run = lora_run(tmp_path)
    out = tmp_path / "out"
    name = "save_peft" if format_ == "peft" else "save_merged"
    save = getattr(lora_files, name) if format_ == "peft" else \
        (lambda model, base, tmp, dtype: (tmp / "model.safetensors").write_bytes(b"merged"))

    def save_while_out_appears(*args, **kwargs):
        save(*args, **kwargs)
        out.mkdir()                                      # someone else's folder, meanwhile
        (out / "mine.txt").write_text("keep me")
    monkeypatch.setattr(lora_files, name, save_while_out_appears)
    argv = ["export", "--checkpoint", str(run), "--format", format_, "--out", str(out)]
    assert main(argv + (["--merge"] if format_ == "hf" else [])) == 1
    err = capsys.readouterr().err
    assert f"--out {out}: already exists; pass --overwrite to replace it" in err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []


KILLED_LORA_EXPORT = """
import os, signal, sys
from npformer import lora_files
from npformer.cli.main import main
save = lora_files.save_peft
def save_then_die(*args, **kwargs):
    save(*args, **kwargs)                                # the adapter written, then kill -9
    os.kill(os.getpid(), signal.SIGKILL)
lora_files.save_peft = save_then_die
main(["export", "--checkpoint", sys.argv[1], "--format", "peft", "--out", sys.argv[2]])
"""


def test_a_later_peft_export_removes_what_a_killed_one_left(tmp_path, capsys):
    """A killed export leaves its temporary folder; the next export to the same --out removes
    it (and those of older exports: .tmp), and a replaced export's .old once --out is back."""
    import subprocess
    import sys
    from npformer.cli.main import main
    run = lora_run(tmp_path)
    exports = tmp_path / "exports"
    exports.mkdir()
    out = exports / "peft"
    child = subprocess.run([sys.executable, "-c", KILLED_LORA_EXPORT, str(run), str(out)],
                           capture_output=True, text=True)
    assert child.returncode == -9, child.stderr
    left = [p.name for p in exports.iterdir()]
    assert len(left) == 1 and left[0].startswith(".peft.") and left[0].endswith(".partial")
    (exports / ".peft.k3j_x9ab.tmp").mkdir()               # as older exports (mkdtemp) named it
    (exports / ".peft.0123abcd.old").mkdir()               # replaced: kept while peft is gone
    keep = [".other.0123abcd.partial", "notes.txt"]
    (exports / keep[0]).mkdir()
    (exports / keep[1]).write_text("not this export's")
    argv = ["export", "--checkpoint", str(run), "--format", "peft", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(p.name for p in exports.iterdir()) == \
        sorted(keep + [".peft.0123abcd.old", "peft"])
    assert main(argv + ["--overwrite"]) == 0               # peft exists again: .old goes too
    assert sorted(p.name for p in exports.iterdir()) == sorted(keep + ["peft"])
