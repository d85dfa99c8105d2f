"""Gradient check of the whole Transformer in float64: every parameter tensor, through masks,
padding, cross-attention, label smoothing, tied weights, dropout, pre- and post-norm."""
import numpy as np
import pytest

import npformer as nf
from npformer.testing import loss_function

PAD = 0


def tiny_model(**kw):
    cfg = dict(src_vocab_size=9, tgt_vocab_size=8, d_model=8, n_heads=2, d_ff=12,
               n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, max_len=16, pad_id=PAD,
               dtype=np.float64, seed=1)
    cfg.update(kw)
    return nf.Transformer(**cfg)


def batch():
    src = np.array([[3, 4, 5, 6, 2], [7, 8, 2, PAD, PAD]])
    tgt_in = np.array([[1, 4, 5, 3], [1, 6, PAD, PAD]])
    tgt_out = np.array([[4, 5, 3, 2], [6, 2, PAD, PAD]])
    return src, tgt_in, tgt_out


def model_gradcheck(model, smoothing, max_entries=12, masked=False):
    """Check d(loss)/d(every parameter). Embedding rows of <pad> are left out: they are frozen on
    purpose (no gradient), although the loss does depend on them. ``masked``: the logits of the
    real targets only (``logits_mask``), as the translation task computes them."""
    src, tgt_in, tgt_out = batch()
    scored = tgt_out != PAD if masked else None
    names, arrays = [], []
    for name, p in model.named_parameters():
        rows = slice(1, None) if name.endswith("embed.weight") else slice(None)
        names.append(name)
        arrays.append((p, rows))
    rng_state = model.rng.bit_generator.state

    def forward():
        model.rng.bit_generator.state = rng_state        # the same dropout masks every call
        return model.forward(src, tgt_in, logits_mask=scored)

    targets = tgt_out if scored is None else tgt_out[scored]
    f = loss_function(model, forward, targets, arrays, PAD, smoothing)
    result = nf.gradcheck(f, [p.data[rows] for p, rows in arrays],
                          max_entries=max_entries, names=names)
    assert result.ok, str(result)
    return result


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_whole_model(norm_first, tie, smoothing):
    model_gradcheck(tiny_model(norm_first=norm_first, tie_embeddings=tie), smoothing)


def test_whole_model_with_dropout_gelu_and_qk_dim():
    model = tiny_model(dropout=0.2, activation="gelu", qk_dim=4).train()
    model_gradcheck(model, 0.1)


def test_every_parameter_is_checked():
    model = tiny_model()
    result = model_gradcheck(model, 0.1, max_entries=2)
    assert len(result.errors) == len(model.parameters())
    assert all(e is not None for e in result.errors)


@pytest.mark.parametrize("norm_first", [False, True])
def test_whole_model_sharing_all_embeddings(norm_first):
    """Source embedding, target embedding and generator: one matrix, whose gradient sums the
    three uses (central differences see the one parameter)."""
    model = tiny_model(norm_first=norm_first, src_vocab_size=9, tgt_vocab_size=9,
                       share_all_embeddings=True)
    assert model.src_embed.weight is model.tgt_embed.weight is model.generator.weight
    assert "tgt_embed.weight" not in dict(model.named_parameters())
    model_gradcheck(model, 0.1)


def test_whole_model_with_separate_attention_and_activation_dropout():
    """Dropout on the attention weights and the feed-forward activations only (the residual
    paths and embeddings kept whole), each at its own rate."""
    model = tiny_model(dropout=0.0, attention_dropout=0.3, activation_dropout=0.2).train()
    model_gradcheck(model, 0.1)


@pytest.mark.parametrize("norm_first", [False, True])
def test_whole_model_with_the_logits_of_real_targets_only(norm_first):
    """``logits_mask``: the generator runs on the real target positions alone; the gradient of
    every parameter still matches central differences (dropout and shared embeddings on; the
    post-norm case without the generator's bias, as Transformer-Tiny)."""
    model = tiny_model(norm_first=norm_first, src_vocab_size=9, tgt_vocab_size=9, dropout=0.2,
                       share_all_embeddings=True, generator_bias=norm_first).train()
    model_gradcheck(model, 0.1, masked=True)


# -- npformer.testing.check_model: the entry point for a whole model --------------------------

def test_check_model_passes_a_transformer_and_names_every_parameter():
    from npformer.testing import check_model
    model = tiny_model(norm_first=True)
    result = check_model(model, batch())
    assert result.ok, str(result)
    assert set(result.results) == {"loss", "loss, label smoothing 0.1"}
    names = result.results["loss"].names
    assert "decoder.layers.1.norm2.weight" in names
    # the <pad> rows (id 0) of the embeddings are frozen on purpose, so left out
    assert "src_embed.weight[1:]" in names and "src_embed.weight" not in names
    n_params = len(model.parameters())
    assert len(names) == n_params                 # two embeddings each lose row 0 only
    assert all(r.status in ("exact", "close") for r in result.results["loss"].inputs)


def test_check_model_passes_a_gpt():
    from npformer.testing import check_model
    model = nf.GPT(7, d_model=8, n_heads=2, d_ff=12, n_layers=2, max_len=6, dropout=0.2,
                   dtype=np.float64, seed=0).train()
    ids = np.array([[1, 4, 5, 6], [3, 0, 2, 5]])
    targets = np.array([[4, 5, 6, -100], [0, 2, 5, 1]])
    result = check_model(model, (ids, targets), label_smoothing=0.2, fast=False, max_entries=4)
    assert result.ok, str(result)
    assert set(result.results) == {"loss, label smoothing 0.2", "loss"}
    assert model.training                          # the mode is restored after the check


def test_check_model_fails_a_wrong_layer_and_names_its_parameter():
    """A LayerNorm whose gain gradient is 10% too large: the report names that parameter."""
    from npformer.testing import check_model
    model = tiny_model(norm_first=True)
    layer = model.decoder.layers[1].norm2
    original = layer.backward

    def wrong_backward(dy):
        before = layer.weight.grad.copy()
        dx = original(dy)
        layer.weight.grad[...] = before + 1.1 * (layer.weight.grad - before)
        return dx
    layer.backward = wrong_backward
    for fast in (True, False):
        result = check_model(model, batch(), fast=fast, max_entries=3)
        assert not result.ok
        report = result.results["loss"]
        assert report.worst.name == "decoder.layers.1.norm2.weight"
        assert report.worst.status == "WRONG"
        assert [r.name for r in report.inputs if r.status == "WRONG"] == \
            ["decoder.layers.1.norm2.weight"]


def test_check_model_refuses_what_it_cannot_check():
    from npformer.testing import check_model
    with pytest.raises(ValueError, match="needs a float64 model"):
        check_model(tiny_model(dtype=np.float32), batch())
    with pytest.raises(ValueError, match=r"batch: expected \(src, tgt_in, tgt_out\)"):
        check_model(tiny_model(), [np.ones((2, 3))])


def test_check_model_on_an_all_frozen_model_says_so_in_its_own_words():
    from npformer.testing import check_model
    with pytest.raises(ValueError, match=r"model: this Transformer has no trainable parameters "
                                         r"\(every one is frozen"):
        check_model(tiny_model().freeze(), batch())


def test_a_whole_model_fast_check_takes_seconds():
    """The fast mode's point: two forward passes per direction, whatever the parameter's size."""
    import time
    from npformer.testing import check_model
    model = nf.Transformer(src_vocab_size=50, tgt_vocab_size=60, d_model=32, n_heads=4, d_ff=64,
                           n_encoder_layers=2, n_decoder_layers=2, dropout=0.1, dtype=np.float64,
                           seed=3)
    start = time.perf_counter()
    result = check_model(model, batch())
    assert result.ok, str(result)
    assert time.perf_counter() - start < 30          # seconds, on a loaded 2-core machine
