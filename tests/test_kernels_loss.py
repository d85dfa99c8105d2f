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
