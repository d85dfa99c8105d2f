"""Rotary positions (RoPE): the functional pair and its Numba twin (in place, from an offset), the
property that makes them positions (scores depend on the distance alone), the turn back as the
exact inverse, and a GPT with ``positions="rotary"`` against Hugging Face's GPT-NeoX (the same
block with rotary positions: pre-norm, sequential residuals) on logits, loss and every gradient.
The layer and whole-model gradient checks are in ``npformer gradcheck``'s suite and
tests/test_gpt.py."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import backend
from npformer import functional as F
from test_gpt import next_token_backward

K = backend.load("numba")


def rnd(seed, *shape, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_tables_are_the_angles_of_each_position_and_pair():
    cos, sin = F.rotary_tables(7, 6, np.float64, base=100.0)
    angles = np.arange(7)[:, None] * 100.0 ** (-np.arange(0, 6, 2) / 6)        # (7, 3)
    np.testing.assert_allclose(cos, np.cos(angles), rtol=0, atol=1e-15)
    np.testing.assert_allclose(sin, np.sin(angles), rtol=0, atol=1e-15)
    assert F.rotary_tables(7, 6, np.float32)[0].dtype == np.float32
    with pytest.raises(ValueError, match="head_dim: rotary positions turn pairs of dimensions, "
                                         "so expected an even size, got 5"):
        F.rotary_tables(7, 5, np.float64)


def test_a_pair_turns_by_its_positions_angle():
    cos, sin = F.rotary_tables(4, 2, np.float64)                 # one pair, angle t at position t
    x = np.zeros((1, 1, 4, 2))
    x[..., 0] = 1.0                                              # the unit vector (1, 0)
    out, _ = F.rotary_forward(x, cos, sin)
    np.testing.assert_allclose(out[0, 0], np.stack([np.cos(np.arange(4)),
                                                    np.sin(np.arange(4))], 1), atol=1e-15)


@settings(deadline=None, max_examples=25)
@given(t=st.integers(1, 6), s=st.integers(0, 6), shift=st.integers(0, 5), half=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_scores_depend_on_the_distance_alone(t, s, shift, half, seed):
    """(R_t q) . (R_s k) = (R_{t+m} q) . (R_{s+m} k): a query and a key keep their score when
    both move by m positions."""
    d = 2 * half
    cos, sin = F.rotary_tables(16, d, np.float64)
    q, k = rnd(seed, 1, 1, 1, d), rnd(seed + 1, 1, 1, 1, d)

    def score(tq, tk):
        return float((F.rotary_forward(q, cos, sin, tq)[0] *
                      F.rotary_forward(k, cos, sin, tk)[0]).sum())
    assert score(t, s) == pytest.approx(score(t + shift, s + shift), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("ops", [F, K], ids=["numpy", "numba"])
def test_the_turn_back_undoes_the_turn_and_keeps_lengths(ops):
    cos, sin = F.rotary_tables(9, 8, np.float64)
    x = rnd(0, 2, 3, 5, 8)
    out, cache = ops.rotary_forward(x, cos, sin, start=4)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1),
                               rtol=1e-13)
    np.testing.assert_allclose(ops.rotary_backward(out, cache), x, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match=r"start \+ T <= max_len=9, got start 5 and T 5"):
        ops.rotary_forward(x, cos, sin, start=5)


@settings(deadline=None, max_examples=30)
@given(b=st.integers(1, 3), h=st.integers(1, 3), t=st.integers(1, 9), half=st.integers(1, 6),
       start=st.integers(0, 4), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**16))
def test_kernel_matches_the_reference_in_place_on_strided_views(b, h, t, half, start, dtype,
                                                                seed):
    """As attention uses them: q and k are head-split views of the fused projection's output,
    turned in place; their gradients likewise inside its gradient."""
    d = 2 * half
    cos, sin = F.rotary_tables(16, d, dtype)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-13)
    qkv = rnd(seed, b, t, 3 * h * d, dtype=dtype)                     # (B, T, 3 H d)
    q_ref, c_ref = F.rotary_forward(F.split_heads(qkv[..., :h * d], h), cos, sin, start)
    view = F.split_heads(qkv[..., :h * d], h)                         # (B, H, T, d), strided
    _, cache = K.rotary_forward(view, cos, sin, start, out=view)
    np.testing.assert_allclose(F.split_heads(qkv[..., :h * d], h), q_ref, **tol)
    np.testing.assert_array_equal(qkv[..., h * d:], rnd(seed, b, t, 3 * h * d,
                                                        dtype=dtype)[..., h * d:])   # untouched
    dout = rnd(seed + 1, b, h, t, d, dtype=dtype)
    dx_ref = F.rotary_backward(dout, c_ref)
    np.testing.assert_allclose(K.rotary_backward(dout, cache), dx_ref, **tol)
    K.rotary_backward(dout, cache, out=dout)
    np.testing.assert_allclose(dout, dx_ref, **tol)


def test_the_parallel_kernel_matches_the_reference():
    """A size above SERIAL_BELOW runs the parallel twin (threads own (b, h) slices)."""
    cos, sin = F.rotary_tables(160, 32, np.float32)
    x = rnd(3, 4, 8, 150, 32, dtype=np.float32)                       # 153,600 elements
    out_ref, cache = F.rotary_forward(x, cos, sin, start=7)
    out, _ = K.rotary_forward(x, cos, sin, start=7)
    np.testing.assert_allclose(out, out_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(K.rotary_backward(out, cache), F.rotary_backward(out, cache),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_attention_turns_queries_and_keys_in_one_pass_over_the_projection(qk_norm):
    """Self-attention turns its q and k heads (and their gradients back) with one call over the
    projection's q and k columns, a (B, H + Hkv, T, d) view, where nothing stands between the
    projection and the turn; with per-head norms, q and k apart. The results stay the
    reference's: the turn is element-wise."""
    calls = {"rotary_forward": [], "rotary_backward": []}

    def counting(name):
        def run(x, *args, **kwargs):
            calls[name].append(x.shape)
            return getattr(F, name)(x, *args, **kwargs)
        return run
    tables = F.rotary_tables(6, 4, np.float64)
    x, dout = rnd(0, 2, 5, 12), rnd(1, 2, 5, 12)
    results = []
    for functions in ({}, {name: counting(name) for name in calls}):
        attention = nf.nn.MultiHeadAttention(12, 3, rotary=tables, n_kv_heads=1, qk_norm=qk_norm,
                                             rng=np.random.default_rng(2), dtype=np.float64)
        with backend.using(functions, "counting"):
            out = attention.forward(x, mask=F.causal_mask(5))
            results.append((out, attention.backward(dout), attention.in_proj_weight.grad))
    for got, expected in zip(results[1], results[0]):
        np.testing.assert_array_equal(got, expected)
    expected = [(2, 3, 5, 4), (2, 1, 5, 4)] if qk_norm else [(2, 4, 5, 4)]
    assert calls == {"rotary_forward": expected, "rotary_backward": expected}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_kernels_serial_and_parallel_twins_give_the_same_bits(dtype):
    """Attention turns q and k in one call over both: that call can take the parallel twin
    where separate calls took the serial one, and no bit may change with it."""
    from npformer.kernels import rotary
    cos, sin = F.rotary_tables(40, 32, dtype)
    c, s = cos[3:40], sin[3:40]
    qkv = rnd(4, 3, 37, 5 * 32, dtype=dtype) * 10                      # (B, T, 5 d)
    x = F.split_heads(qkv, 5)                                          # (B, 5, T, d), strided
    for sign in (dtype(1), dtype(-1)):
        serial, parallel = np.empty_like(x), np.empty_like(x)
        rotary._turn.serial(x, c, s, sign, serial)
        rotary._turn.dispatcher(x, c, s, sign, parallel)
        np.testing.assert_array_equal(parallel, serial)


def test_attention_refuses_tables_of_another_head_size():
    with pytest.raises(ValueError, match=r"rotary: expected tables of 2 pairs \(half the head "
                                         r"size\), got 3"):
        nf.nn.MultiHeadAttention(8, 2, rotary=F.rotary_tables(5, 6, np.float64),
                                 rng=np.random.default_rng(0))


# -- a rotary GPT against Hugging Face's GPT-NeoX ------------------------------------------------
def neox_pair(dtype, seed=0):
    """transformers' GPTNeoXForCausalLM with random weights (rotary on the whole head, sequential
    residuals, GELU tanh, untied head) and the npformer GPT holding the same weights.

    The reference computes its angles in float32 whatever the model's dtype, so in float64 the
    npformer model is given the reference's own cos and sin tables (ours, from float64 angles,
    differ from them by float32's rounding: test_tables_agree_with_gpt_neox_in_float32)."""
    torch = pytest.importorskip("torch", reason="PyTorch runs the reference; install "
                                                "torch==2.13.0")
    transformers = pytest.importorskip("transformers", reason="the reference GPT-NeoX: pip "
                                                              "install transformers")
    torch.manual_seed(seed)
    d, h, n_layers, vocab, ctx = 32, 4, 2, 37, 16
    cfg = transformers.GPTNeoXConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=h,
                                     num_hidden_layers=n_layers, intermediate_size=4 * d,
                                     hidden_act="gelu_pytorch_tanh", max_position_embeddings=ctx,
                                     rotary_pct=1.0, rotary_emb_base=10000,
                                     use_parallel_residual=False, tie_word_embeddings=False,
                                     attention_dropout=0.0, hidden_dropout=0.0,
                                     layer_norm_eps=1e-5)
    ref = transformers.GPTNeoXForCausalLM(cfg).eval()
    with torch.no_grad():                      # biases and norms away from their 0 / 1 starts
        for p in ref.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    ref = ref.to(torch.float64 if dtype == np.float64 else torch.float32)
    model = nf.GPT(vocab, d_model=d, n_heads=h, d_ff=4 * d, n_layers=n_layers, max_len=ctx,
                   dropout=0.0, positions="rotary", tie_embeddings=False, dtype=dtype)
    sd = {k: v.detach().cpu().numpy().astype(np.float64) for k, v in ref.state_dict().items()}
    model.load_state_dict({k: v.astype(dtype) for k, v in neox_weights(sd, n_layers, h).items()})
    if dtype == np.float64:
        tables = neox_tables(ref, ctx, d // h, torch)
        for layer in model.blocks:
            layer.self_attn.rotary = tables
    return model.eval(), ref, torch


def neox_tables(ref, ctx, head_dim, torch):
    """The reference's cos and sin (ctx, head_dim / 2), as float64 arrays."""
    with torch.no_grad():
        cos, sin = ref.gpt_neox.rotary_emb(torch.zeros(1, dtype=torch.float64),
                                           torch.arange(ctx)[None])      # (1, ctx, head_dim)
    return tuple(np.ascontiguousarray(a[0, :, :head_dim // 2].numpy().astype(np.float64))
                 for a in (cos, sin))


def test_tables_agree_with_gpt_neox_in_float32():
    _, ref, torch = neox_pair(np.float32)
    theirs = neox_tables(ref, 16, 8, torch)
    for ours, their in zip(F.rotary_tables(16, 8, np.float32), theirs):
        np.testing.assert_allclose(ours, their, rtol=0, atol=2e-6)


def neox_fused(w, n_heads):
    """GPT-NeoX's query_key_value rows come head by head, each [q_h; k_h; v_h]; npformer's
    in_proj stacks [W_q; W_k; W_v], each head by head."""
    rows = w.shape[0]
    return (w.reshape(n_heads, 3, rows // (3 * n_heads), *w.shape[1:]).swapaxes(0, 1)
            .reshape(w.shape))


def neox_weights(sd, n_layers, n_heads):
    """{npformer name: array} of a GPT-NeoX state_dict (its Linear layers store (out, in), as
    npformer's do: nothing is transposed)."""
    out = {"tok_embed.weight": sd["gpt_neox.embed_in.weight"],
           "norm.weight": sd["gpt_neox.final_layer_norm.weight"],
           "norm.bias": sd["gpt_neox.final_layer_norm.bias"],
           "generator.weight": sd["embed_out.weight" if "embed_out.weight" in sd
                                  else "lm_head.weight"]}
    for i in range(n_layers):
        ours, theirs = f"blocks.{i}", f"gpt_neox.layers.{i}"
        for kind in ("weight", "bias"):
            out[f"{ours}.self_attn.in_proj_{kind}"] = neox_fused(
                sd[f"{theirs}.attention.query_key_value.{kind}"], n_heads)
            for a, b in (("self_attn.out_proj", "attention.dense"),
                         ("ffn.linear1", "mlp.dense_h_to_4h"), ("ffn.linear2", "mlp.dense_4h_to_h"),
                         ("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm")):
                out[f"{ours}.{a}.{kind}"] = sd[f"{theirs}.{b}.{kind}"]
    return out


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_logits_equal_gpt_neox(backend, dtype, tol):
    model, ref, torch = neox_pair(dtype)
    ids = np.random.default_rng(0).integers(0, 37, size=(3, 13))
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(model.forward(ids), expected, rtol=tol, atol=tol)


def test_loss_and_every_gradient_equal_gpt_neox(backend):
    model, ref, torch = neox_pair(np.float64, seed=1)
    ids = np.random.default_rng(1).integers(0, 37, size=(3, 13))
    # next-token cross-entropy, mean over tokens, computed here: transformers' own loss upcasts
    # float64 logits to float32
    ref_logits = ref(torch.tensor(ids)).logits
    ref_loss = torch.nn.functional.cross_entropy(ref_logits[:, :-1].reshape(-1, 37),
                                                 torch.tensor(ids[:, 1:]).reshape(-1))
    ref_loss.backward()
    assert abs(next_token_backward(model, ids) - ref_loss.item()) < 1e-12
    expected = neox_weights({k: p.grad.numpy() for k, p in ref.named_parameters()}, 2, 4)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, expected[name], rtol=1e-9, atol=1e-12, err_msg=name)
