"""Central-difference gradient checks in float64 for every layer of the functional core and every
module, entry-wise within the checker's default tolerance (see docs/backprop.md#gradient-checking)."""
import numpy as np
import pytest

import npformer as nf
from npformer import functional as F
from npformer.testing import check_module, pair_fn
from npformer.nn import (DecoderLayer, Embedding, EncoderLayer, FeedForward, LayerNorm, Linear,
                         MultiHeadAttention, PositionEmbedding)


def rnd(rng, *shape):
    return rng.standard_normal(shape)


def check(fn, inputs, **kw):
    result = nf.gradcheck(fn, inputs, **kw)
    assert result.ok, str(result)
    return result


# -- the functional core ----------------------------------------------------------------------

def test_linear():
    rng = np.random.default_rng(0)

    def f(x, w, b):
        out, cache = F.linear_forward(x, w, b)
        return out, lambda d: F.linear_backward(d, cache)
    check(f, [rnd(rng, 2, 3, 5), rnd(rng, 4, 5), rnd(rng, 4)])


def test_embedding_with_repeated_ids_and_padding_row():
    rng = np.random.default_rng(1)
    ids = np.array([[1, 2, 2, 0], [3, 1, 0, 0]])               # repeated ids and padding

    def f(w):
        out, cache = F.embedding_forward(ids, w, scale=np.sqrt(6))
        return out, lambda d: F.embedding_backward(d, cache)
    check(f, [rnd(rng, 5, 6)])

    out, cache = F.embedding_forward(ids, rnd(rng, 5, 6))
    dw = F.embedding_backward(np.ones_like(out), cache, padding_idx=0)
    assert np.all(dw[0] == 0) and np.all(dw[2] == 2)            # pad row frozen, repeats summed


def test_layernorm():
    rng = np.random.default_rng(2)

    def f(x, g, b):
        out, cache = F.layernorm_forward(x, g, b)
        return out, lambda d: F.layernorm_backward(d, cache)
    check(f, [rnd(rng, 3, 4, 7), 1 + 0.1 * rnd(rng, 7), rnd(rng, 7)])


def test_rmsnorm():
    rng = np.random.default_rng(12)

    def f(x, g):
        out, cache = F.rmsnorm_forward(x, g)
        return out, lambda d: F.rmsnorm_backward(d, cache)
    check(f, [rnd(rng, 3, 4, 7), 1 + 0.1 * rnd(rng, 7)])
    norm = nf.nn.RMSNorm(6, dtype=np.float64)
    norm.weight.data[:] = np.linspace(0.5, 1.5, 6)
    module_check(norm, norm.forward, norm.backward, [rnd(rng, 2, 3, 6)])


def test_rmsnorm_matches_torch_and_computes_half_precision_in_float32():
    """torch.nn.RMSNorm's forward and gradients; a float16 input is normalised in float32 and
    cast back, as Hugging Face's LlamaRMSNorm does."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    x, g, dout = rnd(rng, 2, 3, 8), 1 + 0.1 * rnd(rng, 8), rnd(rng, 2, 3, 8)
    y, cache = F.rmsnorm_forward(x, g, 1e-6)
    dx, dg = F.rmsnorm_backward(dout, cache)
    ref = torch.nn.RMSNorm(8, eps=1e-6, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(g))
    tx = torch.from_numpy(x).requires_grad_()
    ty = ref(tx)
    ty.backward(torch.from_numpy(dout))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dg, ref.weight.grad.numpy(), rtol=1e-12, atol=1e-13)
    half, _ = F.rmsnorm_forward(x.astype(np.float16), g.astype(np.float16), 1e-6)
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
                                      * g).astype(np.float16), rtol=2e-3, atol=2e-3)


def test_silu_and_swiglu():
    rng = np.random.default_rng(14)
    x = 3 * rnd(rng, 4, 6)

    def silu(x):
        out, cache = F.silu_forward(x)
        return out, lambda d: F.silu_backward(d, cache)
    check(silu, [x])

    def swiglu(h):
        out, cache = F.swiglu_forward(h)
        return out, lambda d: F.swiglu_backward(d, cache)
    check(swiglu, [rnd(rng, 2, 3, 8)])
    ffn = nf.nn.feedforward.GatedFeedForward(6, 5, bias=True, **f64_rng(0))
    module_check(ffn, ffn.forward, ffn.backward, [rnd(rng, 2, 3, 6)])


def test_silu_is_x_sigmoid_x_without_overflow():
    x = np.array([-1000.0, -30.0, -1.0, 0.0, 1.0, 30.0, 1000.0])
    with np.errstate(over="raise"):
        y, _ = F.silu_forward(x)
    np.testing.assert_allclose(y, x / (1 + np.exp(-np.clip(x, -700, 700))), rtol=1e-15, atol=1e-300)


def test_softcap_is_cap_tanh_x_over_cap_and_its_gradient_checks():
    """Gemma 2's soft-cap: y = cap tanh(x / cap) (slope 1 at 0, never past the cap), and its
    backward against central differences at inputs of the cap's size, where tanh bends."""
    rng = np.random.default_rng(21)
    cap = 3.0
    x = cap * 2 * rnd(rng, 4, 7)
    y, _ = F.softcap_forward(x, cap)
    np.testing.assert_allclose(y, cap * np.tanh(x / cap), rtol=1e-15)
    assert np.all(np.abs(F.softcap_forward(np.array([1e6, -1e6]), cap)[0]) <= cap)

    def f(x):
        out, cache = F.softcap_forward(x, cap)
        return out, lambda d: F.softcap_backward(d, cache)
    check(f, [x])


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh"])
def test_activations(name):
    forward, backward = F.ACTIVATIONS[name]
    x = np.random.default_rng(3).standard_normal((4, 9))
    x[np.abs(x) < 1e-3] = 0.5                                   # keep ReLU away from its kink

    check(pair_fn(forward, backward), [x])


def test_gelu_matches_erf_definition():
    from math import erf, sqrt
    x = np.linspace(-5, 5, 41)
    expected = np.array([v * 0.5 * (1 + erf(v / sqrt(2))) for v in x])
    np.testing.assert_allclose(F.gelu_forward(x)[0], expected, rtol=1e-15, atol=1e-15)


def test_gelu_tanh_matches_gpt2_definition_and_differs_from_exact_gelu():
    """Hugging Face's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); it is not the
    erf GELU (they differ by ~1e-3 near |x| = 2), so a model keeps the one it was trained with."""
    from math import pi, sqrt, tanh
    x = np.linspace(-5, 5, 41)
    expected = np.array([0.5 * v * (1 + tanh(sqrt(2 / pi) * (v + 0.044715 * v ** 3))) for v in x])
    np.testing.assert_allclose(F.gelu_tanh_forward(x)[0], expected, rtol=1e-14, atol=1e-15)
    gap = np.abs(F.gelu_tanh_forward(x)[0] - F.gelu_forward(x)[0]).max()
    assert 1e-4 < gap < 1e-2


def test_learned_positions_from_an_offset():
    """out = x + w[start:start + T]: every table row read gets the batch's summed gradient, the
    rows not read get none."""
    rng = np.random.default_rng(5)

    def f(x, w):
        out, cache = F.position_embedding_forward(x, w, start=2)
        return out, lambda d: F.position_embedding_backward(d, cache)
    check(f, [rnd(rng, 3, 4, 5), rnd(rng, 8, 5)])
    _, dw = F.position_embedding_backward(np.ones((3, 4, 5)), (2, 4, (8, 5)))
    assert (dw[2:6] == 3).all() and (dw[:2] == 0).all() and (dw[6:] == 0).all()
    with pytest.raises(ValueError, match=r"start \+ T <= max_len=8"):
        F.position_embedding_forward(np.zeros((1, 4, 5)), np.zeros((8, 5)), start=5)


def test_dropout_with_fixed_mask():
    x = np.random.default_rng(4).standard_normal((3, 8))

    def f(x):
        out, cache = F.dropout_forward(x, 0.3, np.random.default_rng(7), training=True)
        return out, lambda d: F.dropout_backward(d, cache)
    check(f, [x])


def test_dropout_add_with_fixed_mask():
    rng = np.random.default_rng(4)

    def f(x, y):
        out, cache = F.dropout_add_forward(x, y, 0.3, np.random.default_rng(7), training=True)
        return out, lambda d: F.dropout_add_backward(d, cache)
    check(f, [rnd(rng, 3, 8), rnd(rng, 3, 8)])


def test_masked_softmax():
    rng = np.random.default_rng(5)
    mask = rng.random((3, 6)) > 0.4
    mask[1] = False                                             # a fully masked row

    def f(s):
        p, cache = F.softmax_forward(s, mask)
        return p, lambda d: F.softmax_backward(d, cache)
    check(f, [rnd(rng, 3, 6)])


@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_attention_with_padding_and_causal_masks(dropout_p):
    rng = np.random.default_rng(6)
    ids = np.array([[4, 5, 6, 0, 0], [7, 8, 9, 3, 2]])
    mask = F.decoder_self_mask(ids, 0)                          # (B, 1, T, T)

    def f(q, k, v):
        out, cache = F.attention_forward(q, k, v, mask, dropout_p, np.random.default_rng(1),
                                         training=True)
        return out, lambda d: F.attention_backward(d, cache)
    check(f, [rnd(rng, 2, 3, 5, 4), rnd(rng, 2, 3, 5, 4), rnd(rng, 2, 3, 5, 6)])


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_with_ignore_index(smoothing):
    rng = np.random.default_rng(7)
    targets = np.array([3, 0, 5, 1, 0, 2])                      # 0 is ignored

    def f(z):
        loss, cache = F.cross_entropy_forward(z, targets, 0, smoothing)
        return np.array(loss), lambda d: F.cross_entropy_backward(float(d), cache)
    check(f, [rnd(rng, 6, 7)])


# -- modules: the inputs are the module's own parameter arrays, perturbed in place ------------

def module_check(module, forward, backward, x_inputs, max_entries=None):
    """gradcheck over the activations ``x_inputs`` and every parameter of ``module``."""
    result = check_module(module, forward, backward, x_inputs, max_entries=max_entries)
    assert result.ok, str(result)
    return result


def f64_rng(seed):
    return dict(rng=np.random.default_rng(seed), dtype=np.float64)


def test_linear_and_layernorm_modules():
    lin = Linear(5, 3, **f64_rng(0))
    module_check(lin, lin.forward, lin.backward, [np.random.default_rng(1).standard_normal((2, 4, 5))])
    ln = LayerNorm(6, dtype=np.float64)
    ln.weight.data[:] = np.linspace(0.5, 1.5, 6)
    module_check(ln, ln.forward, ln.backward, [np.random.default_rng(2).standard_normal((3, 6))])


def test_position_embedding_module():
    pos = PositionEmbedding(9, 4, std=0.5, **f64_rng(0))
    module_check(pos, lambda x: pos.forward(x, 3), pos.backward,
                 [np.random.default_rng(1).standard_normal((2, 5, 4))])


def test_embedding_module_padding_row_gets_no_gradient():
    ids = np.array([[1, 2, 0], [2, 2, 3]])
    emb = Embedding(7, 4, padding_idx=None, scale=2.0, **f64_rng(0))
    module_check(emb, lambda: emb.forward(ids), emb.backward, [])
    # with padding_idx the pad row is deliberately frozen (its true gradient is not zero)
    emb = Embedding(7, 4, padding_idx=0, scale=2.0, **f64_rng(0))
    emb.forward(ids)
    emb.backward(np.ones((2, 3, 4)))
    assert np.all(emb.weight.grad[0] == 0)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_feedforward(activation):
    ffn = FeedForward(6, 10, activation=activation, **f64_rng(0))
    module_check(ffn, ffn.forward, ffn.backward, [np.random.default_rng(3).standard_normal((2, 3, 6))])


@pytest.mark.parametrize("qk_dim", [None, 4])
def test_self_attention_module(qk_dim):
    mha = MultiHeadAttention(8, 2, qk_dim=qk_dim, **f64_rng(0))
    mask = F.decoder_self_mask(np.array([[1, 2, 3, 0], [1, 1, 1, 1]]), 0)
    module_check(mha, lambda x: mha.forward(x, mask=mask), mha.backward,
                 [np.random.default_rng(4).standard_normal((2, 4, 8))])


@pytest.mark.parametrize("n_kv_heads,qk_norm,rotary", [(2, False, False), (1, True, True),
                                                       (2, True, False), (4, False, True)])
def test_grouped_query_attention_module(n_kv_heads, qk_norm, rotary):
    """4 query heads over 2 or 1 key/value heads (the backward sums each group's dk and dv),
    with and without the per-head query/key RMSNorm and rotary positions: every entry."""
    tables = F.rotary_tables(4, 2, np.float64) if rotary else None
    mha = MultiHeadAttention(8, 4, qk_dim=8, v_dim=12, n_kv_heads=n_kv_heads, qk_norm=qk_norm,
                             rotary=tables, **f64_rng(0))
    if qk_norm:
        mha.q_norm.weight.data[:] = [0.7, 1.3]
        mha.k_norm.weight.data[:] = [1.2, 0.9]
    mask = F.decoder_self_mask(np.array([[1, 2, 3, 0], [1, 1, 1, 1]]), 0)
    module_check(mha, lambda x: mha.forward(x, mask=mask), mha.backward,
                 [np.random.default_rng(9).standard_normal((2, 4, 8))])
    assert mha.in_proj_weight.shape == (8 + n_kv_heads * 2 + n_kv_heads * 3, 8)


@pytest.mark.parametrize("qk_dim", [None, 4])
def test_cross_attention_module(qk_dim):
    mha = MultiHeadAttention(8, 2, qk_dim=qk_dim, **f64_rng(0))
    mask = F.padding_mask(np.array([[1, 2, 0, 0, 0], [1, 1, 1, 1, 2]]), 0)
    rng = np.random.default_rng(5)
    module_check(mha, lambda x, m: mha.forward(x, m, mask), mha.backward,
                 [rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 5, 8))])


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer(norm_first):
    layer = EncoderLayer(8, 2, 12, dropout=0.0, norm_first=norm_first, **f64_rng(0))
    mask = F.padding_mask(np.array([[1, 2, 3, 0], [1, 1, 1, 1]]), 0)
    module_check(layer, lambda x: layer.forward(x, mask), layer.backward,
                 [np.random.default_rng(6).standard_normal((2, 4, 8))], max_entries=40)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer(norm_first):
    layer = DecoderLayer(8, 2, 12, dropout=0.0, norm_first=norm_first, **f64_rng(0))
    tgt = np.array([[1, 2, 3, 0], [1, 1, 1, 1]])
    src = np.array([[1, 2, 0], [1, 1, 1]])
    rng = np.random.default_rng(7)
    module_check(layer,
                 lambda x, m: layer.forward(x, m, F.decoder_self_mask(tgt, 0), F.padding_mask(src, 0)),
                 layer.backward, [rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 3, 8))],
                 max_entries=40)
