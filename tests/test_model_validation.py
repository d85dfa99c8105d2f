"""The model's configuration is validated where it is built, its parameter shapes are known
without building it, and each forward's activations serve exactly one backward."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import TransformerConfig

BASE = dict(src_vocab_size=10, tgt_vocab_size=12, d_model=8, n_heads=2, d_ff=16,
            n_encoder_layers=1, n_decoder_layers=1, max_len=6)


@st.composite
def small_configs(draw):
    n_heads = draw(st.sampled_from([1, 2, 4]))
    cfg = dict(src_vocab_size=draw(st.integers(2, 9)), tgt_vocab_size=draw(st.integers(2, 9)),
               d_model=n_heads * draw(st.integers(1, 3)), n_heads=n_heads,
               d_ff=draw(st.integers(1, 12)), n_encoder_layers=draw(st.integers(1, 3)),
               n_decoder_layers=draw(st.integers(1, 3)), max_len=draw(st.integers(1, 5)),
               norm_first=draw(st.booleans()), tie_embeddings=draw(st.booleans()),
               generator_bias=draw(st.booleans()),
               dtype=draw(st.sampled_from([np.float32, np.float64, "float32"])))
    if draw(st.booleans()):
        cfg["qk_dim"] = n_heads * draw(st.integers(1, 3))
    # leave out a few keys at random: their defaults must count too
    for key in ("norm_first", "tie_embeddings", "generator_bias", "dtype"):
        if draw(st.booleans()):
            del cfg[key]
    return cfg


@settings(max_examples=60, deadline=None)
@given(cfg=small_configs())
def test_parameter_shapes_are_the_models(cfg):
    """parameter_shapes never drifts from the model: same names, same order, same shapes."""
    model = nf.Transformer(**cfg)
    expected = [(name, p.shape) for name, p in model.named_parameters()]
    assert list(TransformerConfig(**cfg).parameter_shapes().items()) == expected
    assert TransformerConfig(**cfg) == model.config


def test_parameter_shapes_of_a_huge_config_allocate_nothing():
    shapes = TransformerConfig(src_vocab_size=10**9, tgt_vocab_size=10**9, d_model=10**6,
                               max_len=10**9).parameter_shapes()
    assert shapes["src_embed.weight"] == (10**9, 10**6)
    with pytest.raises(TypeError):
        TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_modell=8)


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_encoder_layers=-1), r"n_encoder_layers: expected a positive integer, got -1"),
    (dict(n_decoder_layers=0), r"n_decoder_layers: expected a positive integer, got 0"),
    (dict(n_encoder_layers=True), r"n_encoder_layers: expected a positive integer, got True"),
    (dict(n_decoder_layers=2.0), r"n_decoder_layers: expected a positive integer, got 2.0"),
    (dict(d_model=8.0), r"d_model: expected a positive integer, got 8.0"),
    (dict(d_ff=True), r"d_ff: expected a positive integer, got True"),
    (dict(max_len=0), r"max_len: expected a positive integer, got 0"),
    (dict(src_vocab_size="10"), r"src_vocab_size: expected a positive integer, got '10'"),
    (dict(qk_dim=0), r"qk_dim: expected a positive integer, got 0"),
    (dict(layer_norm_eps=0.0), r"layer_norm_eps: expected a finite positive number, got 0.0"),
    (dict(layer_norm_eps=-1e-5), r"layer_norm_eps: expected a finite positive number, got -1e-05"),
    (dict(layer_norm_eps=float("nan")), r"layer_norm_eps: expected a finite positive number, got nan"),
    (dict(layer_norm_eps=float("inf")), r"layer_norm_eps: expected a finite positive number, got inf"),
    (dict(dropout=float("nan")), r"dropout: expected a finite number in \[0, 1\), got nan"),
    (dict(dropout=-0.1), r"dropout: expected a finite number in \[0, 1\), got -0.1"),
    (dict(dropout=True), r"dropout: expected a finite number in \[0, 1\), got True"),
    (dict(dropout="0.1"), r"dropout: expected a finite number in \[0, 1\), got '0.1'"),
    (dict(pad_id=True), r"pad_id: expected a non-negative integer, got True"),
    (dict(norm_first="no"), r"norm_first: expected True or False, got 'no'"),
    (dict(tie_embeddings=1), r"tie_embeddings: expected True or False, got 1"),
    (dict(activation=None), r"activation: expected a str such as 'relu', got None"),
    (dict(dtype="float33"), r"dtype: expected float32 or float64, got 'float33'"),
    (dict(seed=-3), r"seed: expected a non-negative integer, got -3"),
])
def test_constructor_and_parameter_shapes_reject_bad_configuration(kwargs, match):
    cfg = {**BASE, **kwargs}
    with pytest.raises(ValueError, match=match):
        nf.Transformer(**cfg)
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**cfg)
    with pytest.raises(ValueError, match=match):
        TransformerConfig.from_dict({"arch": "transformer", **cfg})


def test_numpy_integers_are_sizes():
    model = nf.Transformer(**{**BASE, "d_model": np.int64(8), "n_encoder_layers": np.int32(2)})
    assert model.config.d_model == 8 and type(model.config.n_encoder_layers) is int


def batch():
    return np.array([[1, 2, 3]]), np.array([[1, 4]])


def test_second_backward_without_forward_is_refused():
    """It used to add the same gradients again, silently doubling them."""
    model = nf.Transformer(**BASE, dtype=np.float64)
    model.eval()
    logits = model.forward(*batch())
    d = np.ones_like(logits)
    model.zero_grad()
    model.backward(d)
    once = model.flat_grads.copy()
    with pytest.raises(ValueError, match=r"backward: already called since the last forward; .*call forward again"):
        model.backward(d)
    np.testing.assert_array_equal(model.flat_grads, once)     # nothing was added
    model.forward(*batch())                                     # a new forward: one more backward
    model.backward(d)
    np.testing.assert_allclose(model.flat_grads, 2 * once)


def test_rejected_dlogits_leave_backward_available():
    model = nf.Transformer(**BASE, dtype=np.float64)
    logits = model.forward(*batch())
    with pytest.raises(ValueError, match="dlogits: expected shape"):
        model.backward(np.zeros((1, 2, 11)))
    model.backward(np.ones_like(logits))                        # the check consumed nothing


def _padded_batch():
    src = np.array([[3, 4, 5, 2], [6, 2, 0, 0], [7, 8, 9, 2]])
    tgt_in = np.array([[1, 4, 5, 3], [1, 6, 0, 0], [1, 7, 2, 0]])
    tgt_out = np.array([[4, 5, 3, 2], [6, 2, 0, 0], [7, 2, 0, 0]])
    return src, tgt_in, tgt_out


@pytest.mark.parametrize("share", [False, True])
def test_logits_of_the_real_targets_only_give_the_full_models_loss_and_gradients(backend, share):
    """forward(..., logits_mask=tgt_out != pad): the rows of the full logits at those positions,
    and the same loss and gradients as the full logits with the padding ignored."""
    src, tgt_in, tgt_out = _padded_batch()
    model = nf.Transformer(**{**BASE, "tgt_vocab_size": 10}, share_all_embeddings=share,
                           dropout=0.1, dtype=np.float64, seed=3).train()
    state = model.rng.bit_generator.state
    full = model.forward(src, tgt_in)
    loss, dlogits = nf.cross_entropy(full, tgt_out, ignore_index=0, label_smoothing=0.1)
    model.zero_grad()
    model.backward(dlogits)
    want = model.flat_grads.copy()

    scored = tgt_out != 0
    model.rng.bit_generator.state = state                      # the same dropout masks
    logits = model.forward(src, tgt_in, logits_mask=scored)
    assert logits.shape == (scored.sum(), 10)
    np.testing.assert_allclose(logits, full[scored], rtol=1e-13, atol=1e-13)
    loss_masked, dmasked = nf.cross_entropy(logits, tgt_out[scored], label_smoothing=0.1)
    assert loss_masked == pytest.approx(loss, rel=1e-13)
    model.zero_grad()
    model.backward(dmasked)
    np.testing.assert_allclose(model.flat_grads, want, rtol=1e-10, atol=1e-13)


def test_a_bad_logits_mask_or_dlogits_of_the_full_shape_is_refused():
    src, tgt_in, tgt_out = _padded_batch()
    model = nf.Transformer(**{**BASE, "tgt_vocab_size": 10}, dtype=np.float64)
    with pytest.raises(ValueError, match=r"logits_mask: expected shape \(3, 4\), got \(3, 3\)"):
        model.forward(src, tgt_in, logits_mask=np.ones((3, 3), bool))
    with pytest.raises(ValueError, match="logits_mask: expected dtype bool, got int64"):
        model.forward(src, tgt_in, logits_mask=(tgt_out != 0).astype(np.int64))
    logits = model.forward(src, tgt_in, logits_mask=tgt_out != 0)
    with pytest.raises(ValueError, match=r"dlogits: expected shape \(8, 10\), got \(3, 4, 10\)"):
        model.backward(np.zeros((3, 4, 10)))
    model.backward(np.ones_like(logits))                        # the check consumed nothing
    model.forward(src, tgt_in)                                  # a full forward after a masked one
    model.backward(np.ones((3, 4, 10)))
