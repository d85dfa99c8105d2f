"""Bad input gets a ValueError naming the argument, what was expected and what came."""
import numpy as np
import pytest

import npformer as nf


@pytest.fixture
def model():
    return nf.Transformer(src_vocab_size=10, tgt_vocab_size=12, d_model=8, n_heads=2, d_ff=16,
                          n_encoder_layers=1, n_decoder_layers=1, max_len=6, dtype=np.float64)


def ok_batch():
    return np.array([[1, 2, 3]]), np.array([[1, 4]])


@pytest.mark.parametrize("src,tgt,match", [
    (np.array([[1, 2, 10]]), np.array([[1, 4]]), r"src: token ids must lie in \[0, 10\), found 10"),
    (np.array([[1, -1]]), np.array([[1, 4]]), r"src: token ids .* found -1"),
    (np.array([[1, 2]]), np.array([[1, 12]]), r"tgt_in: token ids must lie in \[0, 12\), found 12"),
    (np.array([1, 2, 3]), np.array([[1, 4]]), r"src: expected a 2-D integer array .* got shape \(3,\)"),
    (np.array([[1.0, 2.0]]), np.array([[1, 4]]), r"src: expected an integer dtype, got float64"),
    (np.ones((1, 7), int), np.array([[1, 4]]), r"src: sequence length 7 exceeds max_len=6"),
    (np.ones((2, 3), int), np.array([[1, 4]]), r"src and tgt_in: expected the same batch size, got 2 and 1"),
    (np.ones((0, 3), int), np.array([[1, 4]]), r"src: expected a non-empty batch"),
])
def test_forward_rejects_bad_token_arrays(model, src, tgt, match):
    with pytest.raises(ValueError, match=match):
        model.forward(src, tgt)


@pytest.mark.parametrize("kwargs,match", [
    (dict(d_model=10, n_heads=4), r"d_model: expected a multiple of n_heads=4, got 10"),
    (dict(d_model=0), r"d_model: expected a positive integer, got 0"),
    (dict(pad_id=20), r"pad_id: expected an id in \[0, 10\), got 20"),
    (dict(dtype=np.int32), r"dtype: expected float32 or float64, got int32"),
    (dict(dropout=1.0), r"dropout: expected a finite number in \[0, 1\), got 1.0"),
    (dict(activation="tanh"), r"activation: expected one of \['gelu', 'gelu_tanh', 'relu'\], got 'tanh'"),
    (dict(qk_dim=6, n_heads=4, d_model=8), r"n_heads: expected a divisor of d_model=8 and qk_dim=6, got 4"),
])
def test_constructor_rejects_bad_configuration(kwargs, match):
    cfg = dict(src_vocab_size=10, tgt_vocab_size=12, d_model=8, n_heads=2, d_ff=16)
    cfg.update(kwargs)
    with pytest.raises(ValueError, match=match):
        nf.Transformer(**cfg)


def test_backward_checks_dlogits(model):
    with pytest.raises(ValueError, match="call forward first"):
        model.backward(np.zeros((1, 2, 12)))
    model.forward(*ok_batch())
    with pytest.raises(ValueError, match=r"dlogits: expected shape \(1, 2, 12\), got \(1, 2, 11\)"):
        model.backward(np.zeros((1, 2, 11)))


def test_state_dict_mismatches_are_named(model):
    sd = model.state_dict()
    sd.pop("generator.bias")
    sd["extra.weight"] = np.zeros(3)
    sd["encoder.norm.weight"] = np.zeros(5)
    with pytest.raises(ValueError) as err:
        model.load_state_dict(sd)
    msg = str(err.value)
    assert "missing entries ['generator.bias']" in msg
    assert "unexpected entries ['extra.weight']" in msg
    assert "encoder.norm.weight: expected shape (8,), got (5,)" in msg


def test_state_dict_round_trip_is_exact(model):
    other = nf.Transformer(src_vocab_size=10, tgt_vocab_size=12, d_model=8, n_heads=2, d_ff=16,
                           n_encoder_layers=1, n_decoder_layers=1, max_len=6, dtype=np.float64,
                           seed=99)
    other.load_state_dict(model.state_dict())
    src, tgt = ok_batch()
    model.eval(), other.eval()                                    # no dropout
    np.testing.assert_array_equal(other.forward(src, tgt), model.forward(src, tgt))


@pytest.mark.parametrize("logits,targets,kw,match", [
    (np.zeros((2, 3, 5)), np.zeros((2, 4), int), {}, r"targets: expected shape \(2, 3\) .* got \(2, 4\)"),
    (np.zeros((2, 5)), np.array([1, 5]), {}, r"targets: expected class ids in \[0, 5\) or ignore_index=-100, found 5"),
    (np.zeros((2, 5)), np.array([1.0, 2.0]), {}, r"targets: expected an integer dtype"),
    (np.zeros(5), np.array(1), {}, r"logits: expected shape \(..., V\)"),
    (np.zeros((2, 5)), np.array([1, 2]), dict(label_smoothing=1.5), r"label_smoothing: expected a number in \[0, 1\]"),
])
def test_cross_entropy_rejects_bad_input(logits, targets, kw, match):
    with pytest.raises(ValueError, match=match):
        nf.cross_entropy(logits, targets, **kw)


def test_interop_rejects_qk_dim_variant_and_mismatched_tied_weights():
    m = nf.Transformer(10, 12, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                       n_decoder_layers=1, qk_dim=4)
    with pytest.raises(ValueError, match="qk_dim=4 differs from d_model=8"):
        nf.interop.to_torch_state_dict(m)
    tied = nf.Transformer(10, 12, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                          n_decoder_layers=1, tie_embeddings=True)
    sd = nf.interop.to_torch_state_dict(tied)
    sd["generator.weight"] = sd["generator.weight"] + 1
    with pytest.raises(ValueError, match="generator.weight differs from tgt_embed.weight"):
        nf.interop.load_torch_state_dict(tied, sd)
    shared = nf.Transformer(12, 12, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                            n_decoder_layers=1, share_all_embeddings=True)
    sd = nf.interop.to_torch_state_dict(shared)
    del sd["tgt_embed.weight"]                  # the copy that would be compared otherwise
    sd["generator.weight"] = sd["generator.weight"] + 1
    with pytest.raises(ValueError, match="generator.weight differs from src_embed.weight"):
        nf.interop.load_torch_state_dict(shared, sd)
    nf.interop.load_torch_state_dict(shared, nf.interop.to_torch_state_dict(shared))


def test_gradcheck_rejects_float32():
    x = np.zeros(3, dtype=np.float32)
    with pytest.raises(ValueError, match=r"inputs\[0\]: expected float64"):
        nf.gradcheck(lambda x: (x, lambda d: d), [x])
