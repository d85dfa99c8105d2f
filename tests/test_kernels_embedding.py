"""Embedding gather/scatter-add and dropout kernels against the NumPy reference."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npformer import backend
from npformer import functional as F
from thread_bits import assert_same_bits_on_threads

K = backend.load("numba")
DTYPES = [np.float32, np.float64]


@settings(deadline=None, max_examples=30)
@given(b=st.integers(1, 6), t=st.integers(1, 8), vocab=st.integers(1, 12), d=st.integers(1, 20),
       scale=st.sampled_from([1.0, 4.0]), pad=st.sampled_from([None, 0]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_embedding_matches_reference(b, t, vocab, d, scale, pad, dtype, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(b, t))                # repeated ids are likely
    w = rng.standard_normal((vocab, d)).astype(dtype)
    out_ref, c_ref = F.embedding_forward(ids, w, scale)
    out, c = K.embedding_forward(ids, w, scale)
    np.testing.assert_allclose(out, out_ref, rtol=1e-6, atol=0)
    dout = rng.standard_normal(out.shape).astype(dtype)
    dw, dw_ref = K.embedding_backward(dout, c, pad), F.embedding_backward(dout, c_ref, pad)
    assert dw.shape == w.shape and dw.dtype == dtype
    np.testing.assert_allclose(dw, dw_ref, rtol=0, atol=1e-5 if dtype == np.float32 else 1e-12)
    if pad is not None:
        assert np.all(dw[pad] == 0)


@settings(deadline=None, max_examples=30)
@given(b=st.integers(1, 6), t=st.integers(1, 8), vocab=st.integers(1, 40), d=st.integers(1, 20),
       scale=st.sampled_from([1.0, 4.0]), pad=st.sampled_from([None, 0, 5]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_embedding_backward_into_adds_the_bits_of_the_whole_table(b, t, vocab, d, scale, pad,
                                                                  dtype, seed):
    """``embedding_backward_into`` (the layer's backward on this backend) sums only the rows
    the ids read and adds them into the gradient in place: the bits of ``grad +=
    embedding_backward(...)`` with its (V, D) table, repeated ids, the padding row and rows no
    token read included."""
    rng = np.random.default_rng(seed)
    pad = None if pad is not None and pad >= vocab else pad
    ids = rng.integers(0, vocab, size=(b, t))
    w = rng.standard_normal((vocab, d)).astype(dtype)
    out, cache = K.embedding_forward(ids, w, scale)
    dout = rng.standard_normal(out.shape).astype(dtype)
    grad = rng.standard_normal((vocab, d)).astype(dtype)      # a gradient already holding terms
    expected = grad + K.embedding_backward(dout, cache, pad)
    got = grad.copy()
    assert K.embedding_backward_into(dout, cache, got, pad) is got
    np.testing.assert_array_equal(got, expected)
    read = np.zeros(vocab, bool)
    read[ids.reshape(-1)] = True
    if pad is not None:
        read[pad] = False
    np.testing.assert_array_equal(got[~read], grad[~read])  # rows no token read: untouched
    with pytest.raises(ValueError, match="grad: expected an array of shape"):
        K.embedding_backward_into(dout, cache, grad[:, :0], pad)


def test_embedding_rejects_out_of_range_ids():
    with pytest.raises(ValueError, match="ids"):
        K.embedding_forward(np.array([[0, 5]]), np.zeros((5, 2)))


@settings(deadline=None, max_examples=20)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3), p=st.sampled_from([0.0, 0.1, 0.5]),
       training=st.booleans(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_dropout_matches_reference_with_the_same_draws(shape, p, training, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    out_ref, c_ref = F.dropout_forward(x, p, np.random.default_rng(seed), training)
    out, c = K.dropout_forward(x, p, np.random.default_rng(seed), training)
    np.testing.assert_array_equal(out, out_ref)
    dout = np.random.default_rng(seed + 1).standard_normal(shape).astype(dtype)
    np.testing.assert_array_equal(K.dropout_backward(dout, c), F.dropout_backward(dout, c_ref))


@settings(deadline=None, max_examples=20)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3), p=st.sampled_from([0.0, 0.1, 0.5]),
       training=st.booleans(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_dropout_add_matches_reference_with_the_same_draws(shape, p, training, dtype, seed):
    rng = np.random.default_rng(seed)
    x, y, dout = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    out_ref, c_ref = F.dropout_add_forward(x, y, p, np.random.default_rng(seed), training)
    out, c = K.dropout_add_forward(x, y, p, np.random.default_rng(seed), training)
    np.testing.assert_array_equal(out, out_ref)
    for grad, grad_ref in zip(K.dropout_add_backward(dout, c), F.dropout_add_backward(dout, c_ref)):
        np.testing.assert_array_equal(grad, grad_ref)


@pytest.mark.parametrize("ops", [F, K], ids=["numpy", "numba"])
def test_dropout_add_rejects_terms_of_different_shapes(ops):
    with pytest.raises(ValueError, match=r"x, y: expected the same shape, got \(3, 4\) and \(4, 3\)"):
        ops.dropout_add_forward(np.ones((3, 4)), np.ones((4, 3)), 0.5, np.random.default_rng(0))


def test_dropout_backward_rejects_a_wrong_shape():
    _, cache = K.dropout_forward(np.ones((3, 4)), 0.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="dout"):
        K.dropout_backward(np.ones((4, 3)), cache)


def test_scatter_add_bits_do_not_depend_on_the_thread_count():
    """Threads split the columns, never the tokens: each entry sums its tokens in token order."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(128, 14))                # many repeated ids
    dout = rng.standard_normal((128, 14, 256)).astype(np.float32)
    cache = K.embedding_forward(ids, np.zeros((50, 256), np.float32), 16.0)[1]
    assert_same_bits_on_threads(lambda: K.embedding_backward(dout, cache, padding_idx=0), (1, 2))
