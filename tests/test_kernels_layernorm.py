"""The fused LayerNorm kernels against the NumPy reference."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import backend
from npformer import functional as F
from thread_bits import assert_same_bits_on_threads

K = backend.load("numba")
TOL = {np.float32: 2e-5, np.float64: 1e-12}


@settings(deadline=None, max_examples=30)
@example(lead=[2, 5, 5], d=2, dtype=np.float32, seed=1)        # the float32 reference's weak spot
@given(lead=st.lists(st.integers(1, 5), min_size=1, max_size=3), d=st.integers(1, 40),
       dtype=st.sampled_from(list(TOL)), seed=st.integers(0, 2**16))
def test_forward_and_backward_match_reference(lead, d, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((*lead, d)) * 3 + 1).astype(dtype)
    gamma, beta = rng.standard_normal(d).astype(dtype), rng.standard_normal(d).astype(dtype)
    y_ref, c_ref = F.layernorm_forward(x, gamma, beta)
    y, c = K.layernorm_forward(x, gamma, beta)
    assert y.shape == x.shape and y.dtype == dtype
    tol = TOL[dtype]
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=tol * max(1, np.abs(y_ref).max()))
    dy = rng.standard_normal(x.shape).astype(dtype)
    # the backward against the reference in float64: with two nearly equal entries in a row of
    # few (d = 2, say) the float32 reference itself loses digits that the kernel keeps
    _, c64 = F.layernorm_forward(*(a.astype(np.float64) for a in (x, gamma, beta)))
    for g, g_ref in zip(K.layernorm_backward(dy, c), F.layernorm_backward(dy.astype(np.float64), c64)):
        assert g.shape == g_ref.shape and g.dtype == dtype
        np.testing.assert_allclose(g, g_ref, rtol=0, atol=tol * max(1, np.abs(g_ref).max()) * 4)


def test_gradcheck_on_the_kernel():
    rng = np.random.default_rng(0)
    x, gamma, beta = rng.standard_normal((3, 4, 6)), rng.standard_normal(6), rng.standard_normal(6)

    def f(x, gamma, beta):
        y, cache = K.layernorm_forward(x, gamma, beta)
        return y, lambda dy: K.layernorm_backward(dy, cache)
    result = nf.gradcheck(f, [x, gamma, beta], names=["x", "gamma", "beta"])
    assert result.ok, result


def test_wrong_shapes_are_rejected():
    x = np.zeros((2, 5))
    with pytest.raises(ValueError, match="gamma, beta"):
        K.layernorm_forward(x, np.ones(4), np.zeros(4))
    _, cache = K.layernorm_forward(x, np.ones(5), np.zeros(5))
    with pytest.raises(ValueError, match="dout: expected shape"):
        K.layernorm_backward(np.zeros((3, 5)), cache)


@pytest.mark.parametrize("n_rows", [1, 7, 33, 1920])
def test_backward_bits_do_not_depend_on_the_thread_count(n_rows):
    """dgamma and dbeta sum over rows in chunks: the chunks must be fixed by the shape, not by
    the number of threads, so a run on 1 thread and on 2 gives the same bits."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n_rows, 256)).astype(np.float32)
    gamma, beta = rng.standard_normal(256).astype(np.float32), np.zeros(256, np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    _, cache = K.layernorm_forward(x, gamma, beta)
    assert_same_bits_on_threads(lambda: K.layernorm_backward(dy, cache), (1, 2))
