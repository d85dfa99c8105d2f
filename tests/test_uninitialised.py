"""``nn.init.uninitialised``: a model built with its buffers allocated but never written, for
loaders that copy every weight in (``npformer.from_pretrained``). Its parameters, their names,
shapes and places in the flat buffers are a normal build's; its tables (positions, rotary
angles) are computed; nothing is drawn; once a normal model's weights are copied in it computes
the very same logits."""
import numpy as np
import pytest

import npformer as nf
from npformer.aligned import ALIGNMENT, zeros_aligned
from npformer.nn.init import building_shapes, drawing_nothing, shapes_only, uninitialised


@pytest.mark.parametrize("changes", [
    dict(positions="learned"), dict(positions="sinusoidal"),
    dict(positions="rotary", norm="rmsnorm", ffn="gated", activation="silu", n_kv_heads=1,
         qkv_bias=False, proj_bias=False, qk_norm=True, tie_embeddings=False)])
def test_an_uninitialised_gpt_is_a_normal_one_once_its_weights_are_copied_in(changes):
    config = nf.GPTConfig(vocab_size=11, d_model=16, n_heads=2, d_ff=24, n_layers=2,
                          max_len=12, dropout=0.0, seed=3, **changes)
    normal = nf.GPT(config).eval()
    with uninitialised():
        assert drawing_nothing() and not building_shapes()
        model = nf.GPT(config)
    assert not drawing_nothing()
    assert [(n, p.shape) for n, p in model.named_parameters()] == \
        [(n, p.shape) for n, p in normal.named_parameters()]
    assert model.flat_params.shape == normal.flat_params.shape
    for p in model.parameters():                       # views of the flat buffers, writable
        assert np.shares_memory(p.data, model.flat_params) and p.data.flags.writeable
        assert np.shares_memory(p.grad, model.flat_grads)
    assert not model.flat_grads.any()
    assert model.rng.bit_generator.state == np.random.default_rng(3).bit_generator.state
    model.load_state_dict(normal.state_dict())
    ids = np.random.default_rng(0).integers(0, 11, size=(2, 12))
    np.testing.assert_array_equal(model.eval().forward(ids), normal.forward(ids))


def test_an_uninitialised_transformer_is_a_normal_one_once_its_weights_are_copied_in():
    normal = nf.Transformer(7, 9, d_model=16, n_heads=2, d_ff=24, n_encoder_layers=1,
                            n_decoder_layers=1, max_len=10, dropout=0.0).eval()
    with uninitialised():
        model = nf.Transformer(normal.config)
    model.load_state_dict(normal.state_dict())
    src = np.array([[4, 5, 6, 2], [5, 6, 2, 0]])
    tgt = np.array([[1, 4, 5], [1, 6, 0]])
    np.testing.assert_array_equal(model.eval().forward(src, tgt), normal.forward(src, tgt))


def test_shapes_only_inside_uninitialised_still_allocates_nothing():
    with uninitialised(), shapes_only():
        model = nf.GPT(vocab_size=5, d_model=8, n_heads=2, d_ff=8, n_layers=1, max_len=4)
    assert model.flat_params is None


@pytest.mark.parametrize("shape,dtype", [(0, np.float32), (5, np.float64), ((3, 7), np.float32),
                                         (1 << 20, np.float32)])
def test_zeros_aligned_is_zeros_on_a_cache_line(shape, dtype):
    out = zeros_aligned(shape, dtype)
    assert out.shape == np.zeros(shape).shape and out.dtype == dtype
    assert out.flags.c_contiguous and not out.any()
    if out.size:
        assert out.ctypes.data % ALIGNMENT == 0
