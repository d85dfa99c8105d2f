"""The fused RMSNorm and SwiGLU kernels against the NumPy reference (and a gradient check on
each): the Numba twins of the Llama block's new layer pairs."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import backend
from npformer import functional as F
from thread_bits import assert_same_bits_on_threads

K = backend.load("numba")
TOL = {np.float32: 2e-5, np.float64: 1e-12}


@settings(deadline=None, max_examples=25)
@given(lead=st.lists(st.integers(1, 5), min_size=1, max_size=3), d=st.integers(1, 40),
       dtype=st.sampled_from(list(TOL)), seed=st.integers(0, 2**16))
def test_rmsnorm_matches_the_reference(lead, d, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((*lead, d)) * 3).astype(dtype)
    gamma = (1 + 0.3 * rng.standard_normal(d)).astype(dtype)
    y_ref, _ = F.rmsnorm_forward(x, gamma)
    y, cache = K.rmsnorm_forward(x, gamma)
    assert y.shape == x.shape and y.dtype == dtype
    tol = TOL[dtype]
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=tol * max(1, np.abs(y_ref).max()))
    dout = rng.standard_normal(x.shape).astype(dtype)
    _, c64 = F.rmsnorm_forward(x.astype(np.float64), gamma.astype(np.float64))
    for g, g_ref in zip(K.rmsnorm_backward(dout, cache),
                        F.rmsnorm_backward(dout.astype(np.float64), c64)):
        assert g.shape == g_ref.shape and g.dtype == dtype
        np.testing.assert_allclose(g, g_ref, rtol=0, atol=tol * max(1, np.abs(g_ref).max()) * 4)


@settings(deadline=None, max_examples=25)
@given(lead=st.lists(st.integers(1, 5), min_size=1, max_size=3), f=st.integers(1, 30),
       dtype=st.sampled_from(list(TOL)), seed=st.integers(0, 2**16), scale=st.sampled_from([1, 30]))
def test_swiglu_matches_the_reference(lead, f, dtype, seed, scale):
    """Large gates too (scale 30): the sigmoid never overflows on either side."""
    rng = np.random.default_rng(seed)
    h = (rng.standard_normal((*lead, 2 * f)) * scale).astype(dtype)
    out_ref, c_ref = F.swiglu_forward(h)
    with np.errstate(over="raise"):
        out, cache = K.swiglu_forward(h)
    tol = TOL[dtype]
    assert out.shape == out_ref.shape and out.dtype == dtype
    np.testing.assert_allclose(out, out_ref, rtol=tol, atol=tol * max(1, np.abs(out_ref).max()))
    dout = rng.standard_normal(out.shape).astype(dtype)
    dh, dh_ref = K.swiglu_backward(dout, cache), F.swiglu_backward(dout, c_ref)
    assert dh.shape == h.shape and dh.dtype == dtype
    np.testing.assert_allclose(dh, dh_ref, rtol=tol, atol=tol * max(1, np.abs(dh_ref).max()))


def test_gradcheck_on_the_kernels():
    rng = np.random.default_rng(0)

    def rms(x, gamma):
        y, cache = K.rmsnorm_forward(x, gamma)
        return y, lambda d: K.rmsnorm_backward(d, cache)

    def swiglu(h):
        out, cache = K.swiglu_forward(h)
        return out, lambda d: K.swiglu_backward(d, cache)
    assert nf.gradcheck(rms, [rng.standard_normal((3, 4, 6)), 1 + 0.1 * rng.standard_normal(6)])
    assert nf.gradcheck(swiglu, [rng.standard_normal((2, 3, 8))])


def test_the_kernels_are_the_numba_backends_and_half_precision_takes_the_reference():
    assert K.rmsnorm_forward.__module__ == "npformer.kernels.rmsnorm"
    assert K.swiglu_forward.__module__ == "npformer.kernels.swiglu"
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float16)
    y, _ = K.rmsnorm_forward(x, np.ones(8, dtype=np.float16))
    np.testing.assert_array_equal(y, F.rmsnorm_forward(x, np.ones(8, dtype=np.float16))[0])


def test_swiglu_caches_only_the_projections_output():
    """No sigmoid array is written: the forward's cache holds h itself (no copy of a
    contiguous h), and the backward computes sigmoid(gate) again from it."""
    h = np.random.default_rng(2).standard_normal((3, 4, 10)).astype(np.float32)
    _, cache = K.swiglu_forward(h)
    arrays = [a for a in cache if isinstance(a, np.ndarray)]
    assert sum(a.nbytes for a in arrays) == h.nbytes
    assert all(np.shares_memory(a, h) for a in arrays)


def test_swiglu_backward_recomputes_the_forwards_sigmoid_to_the_bit():
    """With up = 1 the forward gives silu(gate) = gate * s, and with dout = 1 the backward's
    d up is gate * s of its own s: the two agree bit for bit, both dtypes, serial and parallel
    sizes alike."""
    for dtype in (np.float32, np.float64):
        for rows in (5, 400):                                   # 400 x 1000: the parallel twin
            gate = (np.random.default_rng(rows).standard_normal((rows, 500)) * 8).astype(dtype)
            out, cache = K.swiglu_forward(np.concatenate([gate, np.ones_like(gate)], axis=1))
            dh = K.swiglu_backward(np.ones_like(out), cache)
            np.testing.assert_array_equal(dh[:, 500:], out)


def test_rmsnorm_caches_x_and_no_normalised_copy():
    """The forward writes y and two per-row factors only: its cache holds x itself (no copy of
    a contiguous x) and vectors of one value per row, and no (N, D) array of its own."""
    x = np.random.default_rng(4).standard_normal((3, 4, 10)).astype(np.float32)
    _, cache = K.rmsnorm_forward(x, np.ones(10, dtype=np.float32))
    rows = [a for a in cache if isinstance(a, np.ndarray) and a.size == x.size]
    assert len(rows) == 1 and np.shares_memory(rows[0], x)


def test_rmsnorm_backward_recomputes_the_forwards_xhat_to_the_bit():
    """With gamma = 1 the forward's y is xhat, and on one row with dout = 1 the backward's
    dgamma is that row's xhat as the backward computed it again: the two agree bit for bit."""
    for dtype in (np.float32, np.float64):
        for d in (7, 192):
            x = (np.random.default_rng(d).standard_normal((1, d)) * 5).astype(dtype)
            y, cache = K.rmsnorm_forward(x, np.ones(d, dtype=dtype))
            _, dgamma = K.rmsnorm_backward(np.ones_like(x), cache)
            np.testing.assert_array_equal(dgamma, y[0])


def test_swiglu_rmsnorm_and_rotary_give_the_same_bits_on_any_thread_count():
    """Sizes above the kernels' serial threshold, so the parallel twins run."""
    rng = np.random.default_rng(3)
    h = rng.standard_normal((300, 1000)).astype(np.float32)
    dout = rng.standard_normal((300, 500)).astype(np.float32)
    x = (rng.standard_normal((40, 64, 96)) * 2).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(96)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    qkv = rng.standard_normal((16, 64, 3 * 192)).astype(np.float32)
    dq = rng.standard_normal((16, 6, 64, 32)).astype(np.float32)
    cos, sin = F.rotary_tables(64, 32, np.float32)

    def swiglu():
        out, cache = K.swiglu_forward(h)
        return out, K.swiglu_backward(dout, cache)

    def rmsnorm():
        y, cache = K.rmsnorm_forward(x, gamma)
        return (y, *K.rmsnorm_backward(dy, cache))

    def rotary():
        q = F.split_heads(qkv[..., :192], 6)                    # (B, H, T, d), strided
        y, cache = K.rotary_forward(q, cos, sin, 0)
        return y, K.rotary_backward(dq, cache)

    for run in (swiglu, rmsnorm, rotary):
        assert_same_bits_on_threads(run)
