"""The checker's verdict on correct code, over random seeds, shapes and scales: every pair of the
functional core and every module PASSES (the other side, every known mistake FAILING, is
tests/test_gradcheck_catalogue.py).

The inputs come from npformer.testing's strategies: float64 of bounded scale (0.1 to 10, rows
of mixed scales, exact zeros), padding and causal masks; the probe is sometimes an input itself
(the README's old false FAIL), and the seed of the probe is drawn too. Both modes run.
"""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import functional as F
from npformer.nn import (DecoderLayer, Embedding, EncoderLayer, FeedForward, LayerNorm, Linear,
                         MultiHeadAttention, PositionEmbedding)
from npformer.testing import (causal_masks, float_arrays, module_function, padding_masks,
                              pair_fn, shapes)

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check(data, fn, inputs, names=None, probe_from=None):
    """gradcheck in a drawn mode with a drawn seed; the probe is ``probe_from`` (an input of the
    output's shape) when drawn so."""
    fast = data.draw(st.booleans(), label="fast")
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")
    dout = None
    if probe_from is not None and data.draw(st.booleans(), label="dout is an input"):
        dout = probe_from.copy()
    result = nf.gradcheck(fn, inputs, names=names, fast=fast, seed=seed, dout=dout)
    assert result.ok, str(result)


def arr(data, shape, **kw):
    return data.draw(float_arrays(shape, **kw))


# -- the functional core ---------------------------------------------------------------------

@SETTINGS
@given(data=st.data(), shape=shapes(1, 3, 1, 4), n_out=st.integers(1, 4), bias=st.booleans())
def test_linear(data, shape, n_out, bias):
    x, w = arr(data, shape), arr(data, (n_out, shape[-1]))
    inputs = [x, w] + ([arr(data, (n_out,))] if bias else [])
    check(data, pair_fn(F.linear_forward, F.linear_backward) if bias else
          pair_fn(F.linear_forward, lambda d, c: F.linear_backward(d, c)[:2]), inputs)


@SETTINGS
@given(data=st.data(), b=st.integers(1, 3), t=st.integers(1, 4), v=st.integers(1, 5),
       scale=st.sampled_from([1.0, 2.5]))
def test_embedding(data, b, t, v, scale):
    ids = data.draw(st.lists(st.integers(0, v - 1), min_size=b * t, max_size=b * t))
    ids = np.array(ids).reshape(b, t)
    check(data, pair_fn(lambda w: F.embedding_forward(ids, w, scale), F.embedding_backward),
          [arr(data, (v, 3))])


@SETTINGS
@given(data=st.data(), shape=shapes(3, 3, 1, 4), start=st.integers(0, 2))
def test_learned_positions(data, shape, start):
    table = arr(data, (shape[1] + start + 1, shape[2]))
    check(data, pair_fn(lambda x, w: F.position_embedding_forward(x, w, start),
                     F.position_embedding_backward), [arr(data, shape), table])


@SETTINGS
@given(data=st.data(), shape=shapes(1, 3, 2, 6))
def test_layernorm(data, shape):
    x = arr(data, shape)
    check(data, pair_fn(F.layernorm_forward, F.layernorm_backward),
          [x, arr(data, shape[-1:]), arr(data, shape[-1:])], probe_from=x)


@SETTINGS
@given(data=st.data(), shape=shapes(1, 3, 1, 5), name=st.sampled_from(["relu", "gelu", "gelu_tanh"]),
       p=st.sampled_from([0.0, 0.3]), key=st.integers(0, 1000))
def test_activation_dropout(data, shape, name, p, key):
    """ReLU inputs may be exactly 0 here (the strategy's zeros): the checker leaves an entry at
    its kink unjudged instead of failing a correct layer."""
    x = arr(data, shape)

    def forward(h):
        return F.activation_dropout_forward(h, name, p, np.random.default_rng(key), training=True)
    check(data, pair_fn(forward, F.activation_dropout_backward), [x], probe_from=x)


@SETTINGS
@given(data=st.data(), shape=shapes(2, 2, 1, 5), p=st.floats(0.0, 0.9), key=st.integers(0, 1000))
def test_dropout_and_dropout_add(data, shape, p, key):
    x, y = arr(data, shape), arr(data, shape)
    check(data, pair_fn(lambda x: F.dropout_forward(x, p, np.random.default_rng(key), training=True),
                     F.dropout_backward), [x], probe_from=x)
    check(data, pair_fn(lambda x, y: F.dropout_add_forward(x, y, p, np.random.default_rng(key),
                                                         training=True),
                     F.dropout_add_backward), [x, y], probe_from=y)


@SETTINGS
@given(data=st.data(), rows=st.integers(1, 4), k=st.integers(1, 6))
def test_masked_softmax(data, rows, k):
    """Fully masked rows included: their probabilities and gradients are exactly 0."""
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=rows * k, max_size=rows * k)))
    mask = mask.reshape(rows, k)
    s = arr(data, (rows, k))
    check(data, pair_fn(lambda s: F.softmax_forward(s, mask), F.softmax_backward), [s], probe_from=s)


@SETTINGS
@given(data=st.data(), b=st.integers(1, 2), h=st.integers(1, 2), t=st.integers(1, 4),
       d=st.integers(1, 4), causal=st.booleans(), p=st.sampled_from([0.0, 0.2]))
def test_attention(data, b, h, t, d, causal, p):
    mask = data.draw(causal_masks(b, t) if causal else padding_masks(b, t))
    q, k, v = (arr(data, (b, h, t, d), max_scale=3.0) for _ in range(3))

    def forward(q, k, v):
        return F.attention_forward(q, k, v, mask, p, np.random.default_rng(5), training=True)
    check(data, pair_fn(forward, F.attention_backward), [q, k, v], probe_from=v)


@SETTINGS
@given(data=st.data(), t=st.integers(1, 4), half=st.integers(1, 3), start=st.integers(0, 3))
def test_rotary(data, t, half, start):
    cos, sin = F.rotary_tables(t + start, 2 * half, np.float64)
    x = arr(data, (2, 1, t, 2 * half))
    check(data, pair_fn(lambda x: F.rotary_forward(x, cos, sin, start=start), F.rotary_backward),
          [x], probe_from=x)


@SETTINGS
@given(data=st.data(), n=st.integers(1, 6), v=st.integers(2, 6),
       smoothing=st.sampled_from([0.0, 0.1, 0.5]))
def test_cross_entropy(data, n, v, smoothing):
    """Ignored rows (id 0) get exactly zero gradient; every row ignored gives a zero loss."""
    targets = np.array(data.draw(st.lists(st.integers(0, v - 1), min_size=n, max_size=n)))

    def forward(z):
        loss, cache = F.cross_entropy_forward(z, targets, 0, smoothing)
        return np.array(loss), cache
    check(data, pair_fn(forward, lambda d, c: F.cross_entropy_backward(float(d), c)),
          [arr(data, (n, v))])


# -- modules: the parameters are inputs too --------------------------------------------------

def module_check(data, module, forward, backward, x_inputs, names):
    params = list(module.named_parameters())
    for _, p in params:                              # parameters of bounded, mixed scales
        p.data[...] = arr(data, p.data.shape, max_scale=2.0)
    check(data, module_function(module, forward, backward, len(x_inputs)),
          [*x_inputs, *[p.data for _, p in params]], names=names + [n for n, _ in params])


def f64(seed):
    return dict(rng=np.random.default_rng(seed), dtype=np.float64)


@SETTINGS
@given(data=st.data(), shape=shapes(2, 3, 1, 4), n_out=st.integers(1, 4))
def test_linear_layernorm_and_position_modules(data, shape, n_out):
    lin = Linear(shape[-1], n_out, **f64(0))
    module_check(data, lin, lin.forward, lin.backward, [arr(data, shape)], ["x"])
    ln = LayerNorm(shape[-1] + 1, dtype=np.float64)
    module_check(data, ln, ln.forward, ln.backward, [arr(data, shape[:-1] + (shape[-1] + 1,))], ["x"])
    pos = PositionEmbedding(8, shape[-1], **f64(1))
    x3 = arr(data, (2, 3, shape[-1]))
    module_check(data, pos, lambda x: pos.forward(x, 2), pos.backward, [x3], ["x"])


@SETTINGS
@given(data=st.data(), v=st.integers(2, 6))
def test_embedding_module(data, v):
    ids = np.array(data.draw(st.lists(st.integers(0, v - 1), min_size=6, max_size=6))).reshape(2, 3)
    emb = Embedding(v, 4, padding_idx=None, scale=2.0, **f64(0))
    module_check(data, emb, lambda: emb.forward(ids), emb.backward, [], [])


@SETTINGS
@given(data=st.data(), activation=st.sampled_from(["relu", "gelu", "gelu_tanh"]))
def test_feedforward_module(data, activation):
    ffn = FeedForward(4, 6, activation=activation, **f64(0))
    module_check(data, ffn, ffn.forward, ffn.backward, [arr(data, (2, 3, 4))], ["x"])


@SETTINGS
@given(data=st.data(), t=st.integers(1, 4), s=st.integers(1, 4), qk=st.sampled_from([None, 4]),
       rotary=st.booleans())
def test_attention_module(data, t, s, qk, rotary):
    tables = F.rotary_tables(4, 4, np.float64) if rotary else None
    mha = MultiHeadAttention(8, 2, qk_dim=None if rotary else qk, rotary=tables, **f64(0))
    self_mask = data.draw(causal_masks(2, t))
    module_check(data, mha, lambda x: mha.forward(x, mask=self_mask), mha.backward,
                 [arr(data, (2, t, 8), max_scale=2.0)], ["x"])
    cross = MultiHeadAttention(8, 2, qk_dim=qk, **f64(1))
    mask = data.draw(padding_masks(2, s))
    module_check(data, cross, lambda x, m: cross.forward(x, m, mask), cross.backward,
                 [arr(data, (2, t, 8), max_scale=2.0), arr(data, (2, s, 8), max_scale=2.0)],
                 ["x", "memory"])


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), norm_first=st.booleans(), t=st.integers(1, 3))
def test_encoder_and_decoder_layers(data, norm_first, t):
    enc = EncoderLayer(8, 2, 8, dropout=0.0, activation="gelu", norm_first=norm_first, **f64(0))
    mask = data.draw(padding_masks(2, t))
    module_check(data, enc, lambda x: enc.forward(x, mask), enc.backward,
                 [arr(data, (2, t, 8), max_scale=2.0)], ["x"])
    dec = DecoderLayer(8, 2, 8, dropout=0.0, activation="gelu", norm_first=norm_first, **f64(1))
    self_mask, cross_mask = data.draw(causal_masks(2, t)), data.draw(padding_masks(2, 2))
    module_check(data, dec, lambda x, m: dec.forward(x, m, self_mask, cross_mask), dec.backward,
                 [arr(data, (2, t, 8), max_scale=2.0), arr(data, (2, 2, 8), max_scale=2.0)],
                 ["x", "memory"])
