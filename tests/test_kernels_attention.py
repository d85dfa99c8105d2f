"""The fused Numba attention kernel against the NumPy reference, forward and backward."""
import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import backend, runtime
from npformer import functional as F

K = backend.load("numba")
ATTENTION = importlib.import_module("npformer.kernels.attention")

DTYPES = {np.float32: 2e-5, np.float64: 1e-12}


def make_mask(rng, kind, b, tq, tk):
    if kind == "none":
        return None
    if kind == "padding":                                    # (B, 1, 1, S), every row one key
        lengths = rng.integers(1, tk + 1, size=b)
        return (np.arange(tk)[None, :] < lengths[:, None])[:, None, None, :]
    mask = F.causal_mask(tq)[..., :tk] if tq == tk else rng.random((b, 1, tq, tk)) > 0.4
    mask = np.broadcast_to(mask, (b, 1, tq, tk)).copy()     # (B, 1, Tq, Tk)
    mask[0, 0, 0, :] = False                                 # one query that may see nothing
    return mask


def close(a, b, tol):
    scale = max(1.0, float(np.abs(b).max(initial=0.0)))
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * scale)


@settings(deadline=None, max_examples=25)
@given(b=st.integers(1, 3), h=st.integers(1, 3), tq=st.integers(1, 9), tk=st.integers(1, 9),
       d=st.integers(1, 12), kind=st.sampled_from(["none", "padding", "causal_or_random"]),
       dtype=st.sampled_from(list(DTYPES)), dropout=st.sampled_from([0.0, 0.3]),
       seed=st.integers(0, 2**16))
def test_kernel_matches_reference(b, h, tq, tk, d, kind, dtype, dropout, seed):
    rng = np.random.default_rng(seed)
    tol = DTYPES[dtype]
    qkv = rng.standard_normal((b, tq, 3 * h * d)).astype(dtype)
    q = F.split_heads(qkv[..., : h * d], h)                 # a strided view, as in the model
    k = rng.standard_normal((b, h, tk, d)).astype(dtype)
    v = rng.standard_normal((b, h, tk, d + 1)).astype(dtype)
    mask = make_mask(rng, kind, b, tq, tk)
    out_ref, cache_ref = F.attention_forward(q, k, v, mask, dropout, np.random.default_rng(seed), True)
    out, cache = K.attention_forward(q, k, v, mask, dropout, np.random.default_rng(seed), True)
    assert out.shape == out_ref.shape and out.dtype == dtype
    assert np.isfinite(out).all() and np.isfinite(cache[3]).all()
    close(out, out_ref, tol)
    close(cache[3], cache_ref[3], tol)                       # the attention weights
    dout = rng.standard_normal(out.shape).astype(dtype)
    for g, g_ref in zip(K.attention_backward(dout, cache), F.attention_backward(dout, cache_ref)):
        assert g.shape == g_ref.shape and np.isfinite(g).all()
        close(g, g_ref, tol)


def test_all_masked_row_gives_zeros_not_nan():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 3, 4)) for _ in range(3))
    mask = np.ones((2, 1, 3, 3), dtype=bool)
    mask[1, 0, 2, :] = False
    out, cache = K.attention_forward(q, k, v, mask)
    assert np.all(out[1, :, 2] == 0) and np.all(cache[3][1, :, 2] == 0)
    dq, dk, dv = K.attention_backward(np.ones_like(out), cache)
    assert np.all(dq[1, :, 2] == 0)
    assert np.isfinite(dk).all() and np.isfinite(dv).all()


def test_gradcheck_on_the_kernel():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 2, 4, 3)), rng.standard_normal((2, 2, 5, 3)), \
        rng.standard_normal((2, 2, 5, 3))
    mask = np.arange(5)[None, None, None, :] < np.array([5, 3])[:, None, None, None]

    def f(q, k, v):
        out, cache = K.attention_forward(q, k, v, mask)
        return out, lambda dout: K.attention_backward(dout, cache)
    result = nf.gradcheck(f, [q, k, v], names=["q", "k", "v"])
    assert result.ok, result


@pytest.mark.parametrize("bad_mask", [np.ones((2, 1, 1, 4), bool), np.ones((3, 1, 1, 5), bool)])
def test_mask_of_wrong_shape_is_rejected(bad_mask):
    q = np.zeros((2, 1, 3, 4))
    k = v = np.zeros((2, 1, 5, 4))
    with pytest.raises(ValueError, match="mask"):
        K.attention_forward(q, k, v, bad_mask)


def test_inconsistent_shapes_and_dtypes_are_rejected():
    with pytest.raises(ValueError, match="do not agree"):
        K.attention_forward(np.zeros((1, 1, 2, 3)), np.zeros((1, 1, 2, 4)), np.zeros((1, 1, 2, 4)))
    with pytest.raises(ValueError, match="float32 or all float64"):
        K.attention_forward(np.zeros((1, 1, 2, 3), np.float32), np.zeros((1, 1, 2, 3)),
                            np.zeros((1, 1, 2, 3)))
    out, cache = K.attention_forward(np.zeros((1, 1, 2, 3)), np.zeros((1, 1, 2, 3)),
                                     np.zeros((1, 1, 2, 3)))
    with pytest.raises(ValueError, match="dout"):
        K.attention_backward(np.zeros((1, 1, 3, 3)), cache)


@settings(deadline=None, max_examples=15)
@given(b=st.integers(1, 4), h=st.integers(1, 3), tq=st.integers(1, 6), tk=st.integers(1, 6),
       kind=st.sampled_from(["none", "padding", "causal_or_random"]),
       dtype=st.sampled_from(list(DTYPES)), dropout=st.sampled_from([0.0, 0.3]),
       chunk=st.integers(1, 200), seed=st.integers(0, 2**16))
def test_heads_split_in_parts_and_threads_match_reference(b, h, tq, tk, kind, dtype, dropout,
                                                          chunk, seed):
    """Force the two-thread path and small parts (of B, or of H when B = 1) on tiny inputs."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, h, t, 5)).astype(dtype) for t in (tq, tk, tk))
    mask = make_mask(rng, kind, b, tq, tk)
    out_ref, cache_ref = F.attention_forward(q, k, v, mask, dropout, np.random.default_rng(seed),
                                             True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ATTENTION, "SPLIT_MIN", 0)
        mp.setattr(ATTENTION, "CHUNK_BYTES", chunk)
        assert ATTENTION._parts(cache_ref[3].shape, q.itemsize)[1] or b * h == 1
        out, cache = K.attention_forward(q, k, v, mask, dropout, np.random.default_rng(seed), True)
        dout = rng.standard_normal(out.shape).astype(dtype)
        grads = K.attention_backward(dout, cache)
    close(out, out_ref, DTYPES[dtype])
    close(cache[3], cache_ref[3], DTYPES[dtype])
    for g, g_ref in zip(grads, F.attention_backward(dout, cache_ref)):
        close(g, g_ref, DTYPES[dtype])


def test_parts_cover_every_head_once_and_run_in_parallel():
    shapes = [(128, 8, 64, 64), (128, 8, 16, 16), (3, 8, 40, 40), (1, 8, 64, 64), (1, 1, 64, 64)]
    for shape in shapes:
        parts, parallel = ATTENTION._parts(shape, 4)
        axis = 0 if shape[0] > 1 else 1
        covered = [i for _, lo, hi in parts for i in range(lo, hi)]
        assert covered == list(range(shape[axis]))
        assert all(a == axis for a, _, _ in parts)
        assert parallel == (shape[axis] > 1)               # several threads once there are 2 parts
    assert ATTENTION._parts((2, 2, 3, 3), 4)[1] is False          # tiny: one thread only


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("tk", [31, 32, 45])           # both sides of the row-length switch
@pytest.mark.parametrize("kind", ["padding", "causal_or_random"])
def test_long_rows_match_reference(dtype, tk, kind):
    rng = np.random.default_rng(tk)
    q, k, v = (rng.standard_normal((2, 2, t, 4)).astype(dtype) * 3 for t in (5, tk, tk))
    mask = make_mask(rng, kind, 2, 5, tk)                        # with a fully masked row
    out_ref, cache_ref = F.attention_forward(q, k, v, mask, 0.3, np.random.default_rng(1), True)
    out, cache = K.attention_forward(q, k, v, mask, 0.3, np.random.default_rng(1), True)
    close(out, out_ref, DTYPES[dtype])
    close(cache[3], cache_ref[3], DTYPES[dtype])
    dout = rng.standard_normal(out.shape).astype(dtype)
    for g, g_ref in zip(K.attention_backward(dout, cache), F.attention_backward(dout, cache_ref)):
        close(g, g_ref, DTYPES[dtype])


@settings(deadline=None, max_examples=25,     # the fixture's hook is set again in every example
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=st.integers(1, 4), h=st.integers(1, 3), tq=st.integers(1, 20), tk=st.integers(1, 20),
       d=st.sampled_from([32, 40, 64]), kind=st.sampled_from(["none", "padding", "causal_or_random"]),
       dtype=st.sampled_from(list(DTYPES)), dropout=st.sampled_from([0.0, 0.3]),
       candidate=st.sampled_from(["numba-blocked", "blas"]), parallel=st.booleans(),
       seed=st.integers(0, 2**16))
def test_kernel_equals_reference_with_each_product_kernel(dispatcher_prefers, b, h, tq, tk, d, kind,
                                                         dtype, dropout, candidate, parallel,
                                                         seed):
    """Head widths of 32 and more, where the dispatcher offers the register-blocked kernel for
    P v, P'^T dout, dS k and dS^T q: the kernel agrees with the reference whichever product
    kernel the dispatcher is made to take, on
    one thread or with the parts shared by the runtime's workers."""
    dispatcher_prefers(candidate)
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((b, h, tq, d), (b, h, tk, d), (b, h, tk, d)))
    mask = make_mask(rng, kind, b, tq, tk)
    out_ref, cache_ref = F.attention_forward(q, k, v, mask, dropout, np.random.default_rng(seed), True)
    with pytest.MonkeyPatch.context() as mp:
        if parallel:
            mp.setattr(ATTENTION, "SPLIT_MIN", 0)
            mp.setattr(ATTENTION, "CHUNK_BYTES", 1)             # one part per batch element
        out, cache = K.attention_forward(q, k, v, mask, dropout, np.random.default_rng(seed), True)
        dout = rng.standard_normal(out.shape).astype(dtype)
        grads = K.attention_backward(dout, cache)
    close(out, out_ref, DTYPES[dtype])
    for g, g_ref in zip(grads, F.attention_backward(dout, cache_ref)):
        close(g, g_ref, DTYPES[dtype] * max(tq, tk))
    assert candidate in runtime.choices().values()            # the product kernel really ran
