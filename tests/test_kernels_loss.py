"""The fused softmax cross-entropy kernel against the NumPy reference."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import backend
from npformer import functional as F

K = backend.load("numba")
TOL = {np.float32: 1e-5, np.float64: 1e-12}


@settings(deadline=None, max_examples=30)
@given(n=st.integers(1, 40), vocab=st.integers(2, 300), dtype=st.sampled_from(list(TOL)),
       smoothing=st.sampled_from([0.0, 0.1, 1.0]), ignored=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**16))
def test_loss_and_gradient_match_reference(n, vocab, dtype, smoothing, ignored, seed):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((n, vocab)) * 4).astype(dtype)
    targets = rng.integers(0, vocab, size=n)
    targets[rng.random(n) < ignored] = -100                  # ignored rows (maybe all of them)
    loss_ref, c_ref = F.cross_entropy_forward(logits, targets, -100, smoothing)
    loss, c = K.cross_entropy_forward(logits, targets, -100, smoothing)
    tol = TOL[dtype]
    assert abs(loss - loss_ref) <= tol * max(1.0, abs(loss_ref))
    for dloss in (1.0, 0.5):
        grad, grad_ref = K.cross_entropy_backward(dloss, c), F.cross_entropy_backward(dloss, c_ref)
        assert grad.shape == logits.shape and grad.dtype == dtype
        np.testing.assert_allclose(grad, grad_ref, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_large_vocabularies(dtype, tol):
    """Long rows (the vectorised exp loops of the kernels), as in the base config's generator."""
    rng = np.random.default_rng(3)
    logits = (3 * rng.standard_normal((97, 5000))).astype(dtype)
    targets = rng.integers(0, 5000, size=97)
    targets[:7] = 0                                               # ignored rows
    loss_ref, c_ref = F.cross_entropy_forward(logits, targets, 0, 0.1)
    loss, c = K.cross_entropy_forward(logits, targets, 0, 0.1)
    assert abs(loss - loss_ref) < tol * max(1.0, abs(loss_ref))
    grad, grad_ref = K.cross_entropy_backward(1.0, c), F.cross_entropy_backward(1.0, c_ref)
    assert grad.dtype == dtype and np.all(grad[:7] == 0)
    np.testing.assert_allclose(grad, grad_ref, rtol=0, atol=tol * np.abs(grad_ref).max())


def test_gradcheck_through_the_public_loss_on_numba():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((5, 7))
    targets = np.array([1, 0, 6, 0, 3])
    previous = backend.get_backend()
    backend.set_backend("numba")
    try:
        def f(z):
            loss, dz = nf.cross_entropy(z, targets, ignore_index=0, label_smoothing=0.2)
            return np.array(loss), lambda dout: dz * float(dout)
        result = nf.gradcheck(f, [logits], names=["logits"])
    finally:
        backend.set_backend(previous)
    assert result.ok, result


def test_out_of_range_target_is_rejected():
    with pytest.raises(ValueError, match="targets"):
        K.cross_entropy_forward(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="logits, targets"):
        K.cross_entropy_forward(np.zeros((2, 3)), np.array([0, 1, 2]))


def _top_inputs(rng, n, vocab, dtype, kind):
    """Logits with the cases a selection can get wrong: many equal values (ties), -inf entries
    (<pad>, <bos>), a row maximum so small that distinct logits round to one log-probability."""
    if kind == "ties":
        x = rng.integers(0, 4, (n, vocab)) * 0.75
    elif kind == "tiny":
        x = rng.integers(-3, 4, (n, vocab)) * 1e-30                  # all within rounding of 0
    else:
        x = rng.standard_normal((n, vocab)) * 4
    x = x.astype(dtype)
    x[:, rng.integers(0, vocab, 2)] = -np.inf
    return x


@settings(deadline=None, max_examples=60)
@given(n=st.integers(1, 30), vocab=st.integers(3, 400), top=st.integers(1, 12),
       dtype=st.sampled_from([np.float32, np.float64]),
       kind=st.sampled_from(["ties", "tiny", "normal"]),
       offset=st.sampled_from([None, "scores", "dead"]), seed=st.integers(0, 2**16))
def test_top_log_softmax_is_the_reference_bit_for_bit(n, vocab, top, dtype, kind, offset, seed):
    """The n best next tokens (greedy: 1, beam search: 2K, ranked by a beam's score + log p),
    their ids and log-probabilities, equal to the reference's argsort of the full (R, V)
    log-probabilities: same ids in the same order, same bits."""
    rng = np.random.default_rng(seed)
    x = _top_inputs(rng, n, vocab, dtype, kind)
    top = min(top, vocab)
    off = None
    if offset is not None:
        off = rng.integers(-4, 1, n) * 0.5
        if offset == "dead":
            off[rng.random(n) < 0.5] = -np.inf                         # beam search's dead rows
    ids_ref, logp_ref = F.top_log_softmax(x, top, off)
    ids, logp = K.top_log_softmax(x, top, off)
    np.testing.assert_array_equal(ids, ids_ref)
    np.testing.assert_array_equal(logp, logp_ref)
    full = F.log_softmax(x.astype(np.float64))
    np.testing.assert_array_equal(logp_ref, np.take_along_axis(full, ids_ref, axis=1))
    if off is None:                                      # greedy: np.argmax's first maximum
        np.testing.assert_array_equal(ids_ref[:, 0], full.argmax(axis=1))


def test_top_log_softmax_on_long_rows_in_parts():
    """A beam step's shape (rows of a 5,921-word vocabulary, more rows than one part holds): the
    parts the workers share select what the reference selects over all rows at once."""
    rng = np.random.default_rng(5)
    x = _top_inputs(rng, 100, 5921, np.float32, "normal")
    off = rng.standard_normal(100)
    for top, offset in ((10, off), (1, None)):
        want = F.top_log_softmax(x, top, offset)
        got = K.top_log_softmax(x, top, offset)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
