"""The fused activation + dropout kernel of the feed-forward block against the NumPy reference,
and central-difference gradient checks of both in float64."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import backend
from npformer import functional as F

K = backend.load("numba")
TOL = {np.float32: 1e-5, np.float64: 1e-13}


@settings(deadline=None, max_examples=40)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       activation=st.sampled_from(["relu", "gelu", "gelu_tanh"]), p=st.sampled_from([0.0, 0.1, 0.5]),
       training=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**16))
def test_matches_reference_with_the_same_draws(shape, activation, p, training, dtype, seed):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal(shape).astype(dtype)
    out_ref, c_ref = F.activation_dropout_forward(h, activation, p, np.random.default_rng(seed),
                                                  training)
    out, c = K.activation_dropout_forward(h, activation, p, np.random.default_rng(seed), training)
    assert out.dtype == dtype and out.shape == h.shape
    np.testing.assert_allclose(out, out_ref, rtol=TOL[dtype], atol=TOL[dtype])
    assert np.array_equal(out == 0, out_ref == 0)            # the same units dropped / clipped
    dout = rng.standard_normal(shape).astype(dtype)
    dh, dh_ref = K.activation_dropout_backward(dout, c), F.activation_dropout_backward(dout, c_ref)
    assert dh.dtype == dtype
    np.testing.assert_allclose(dh, dh_ref, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("ops", [F, K], ids=["numpy", "numba"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_gradcheck_with_a_fixed_mask(ops, activation):
    h = np.random.default_rng(3).standard_normal((4, 3, 9))
    h[np.abs(h) < 1e-3] = 0.5                                 # keep ReLU away from its kink

    def f(h):                                                  # re-seeded: the same mask each call
        out, cache = ops.activation_dropout_forward(h, activation, 0.3, np.random.default_rng(7))
        return out, lambda d: ops.activation_dropout_backward(d, cache)
    result = nf.gradcheck(f, [h])
    assert result.ok, str(result)


@pytest.mark.parametrize("ops", [F, K], ids=["numpy", "numba"])
def test_an_unknown_activation_is_rejected(ops):
    with pytest.raises(ValueError, match="activation"):
        ops.activation_dropout_forward(np.ones((2, 3)), "tanh", 0.1, np.random.default_rng(0))


def test_kernel_backward_rejects_a_wrong_dout_shape():
    _, cache = K.activation_dropout_forward(np.ones((2, 3)), "relu", 0.1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="dout"):
        K.activation_dropout_backward(np.ones((3, 2)), cache)


@pytest.mark.parametrize("size", [1000, 300_001], ids=["serial", "parallel"])
def test_float32_gelu_tanh_by_the_sigmoid_stays_within_float32_rounding(size):
    """The float32 kernel computes (1 + tanh u)/2 as sigmoid(2u) with a vectorised exp. Against
    the float64 reference, over the whole range (saturation included, no overflow): as close as
    NumPy's own float32 tanh form, forward and backward."""
    x = np.concatenate([np.linspace(-40, 40, size // 2),
                        np.random.default_rng(0).standard_normal(size - size // 2) * 3])
    x32 = x.astype(np.float32)
    out, cache = K.activation_dropout_forward(x32, "gelu_tanh", 0.0, None, training=False)
    ref, ref_cache = F.activation_dropout_forward(x32.astype(np.float64), "gelu_tanh", 0.0, None,
                                                  training=False)
    np32, _ = F.activation_dropout_forward(x32, "gelu_tanh", 0.0, None, training=False)
    assert np.isfinite(out).all()
    err, err_numpy = np.abs(out - ref), np.abs(np32 - ref)
    assert err.max() <= max(2 * err_numpy.max(), 1e-6)
    assert (err / np.maximum(np.abs(ref), 1.0)).max() <= 2e-6
    dout = np.ones_like(x32)
    dh = K.activation_dropout_backward(dout, cache)
    dref = F.activation_dropout_backward(dout.astype(np.float64), ref_cache)
    assert np.isfinite(dh).all()
    assert (np.abs(dh - dref) / np.maximum(np.abs(dref), 1.0)).max() <= 4e-6
