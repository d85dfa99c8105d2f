"""The fused Numba attention kernel against the NumPy reference, forward and backward."""
import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import backend, runtime
from npformer import functional as F
from thread_bits import assert_same_bits_on_threads

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


# -- causal masks: the row blocks skip the keys no row of a block may attend -----------------------

def small_blocks(mp, rows=2):
    """Row blocks on tiny inputs: blocks of ``rows`` rows, taken whatever they save."""
    mp.setattr(ATTENTION, "MIN_BLOCK_ROWS", rows)
    mp.setattr(ATTENTION, "SKIP_MIN", 0.0)


def check_blocks_against_reference(q, k, v, mask, dropout, seed, tol, expect_blocks=True):
    """The kernel with row blocks equals the reference, forward (out, P, P') and backward; P and
    P' are exactly 0 wherever the mask is False (in the skipped columns too)."""
    rng = np.random.default_rng(seed)
    out_ref, cache_ref = F.attention_forward(q, k, v, mask, dropout, np.random.default_rng(seed),
                                             True)
    out, cache = K.attention_forward(q, k, v, mask, dropout, np.random.default_rng(seed), True)
    assert (cache[7] is not None) == expect_blocks             # the path under test ran
    close(out, out_ref, tol)
    close(cache[3], cache_ref[3], tol)                        # P
    close(cache[4], cache_ref[4], tol)                        # P'
    masked = ~np.broadcast_to(mask, cache[3].shape)
    assert np.all(cache[3][masked] == 0) and np.all(cache[4][masked] == 0)
    dout = rng.standard_normal(out.shape).astype(q.dtype)
    for g, g_ref in zip(K.attention_backward(dout, cache), F.attention_backward(dout, cache_ref)):
        assert g.shape == g_ref.shape and np.isfinite(g).all()
        close(g, g_ref, tol)
    return out, cache


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_causal_row_blocks_match_reference_at_gpt_shape(dtype, dropout):
    """T = 128, d = 32 with the module's own settings: 4 blocks of 32 rows."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, 128, 32)).astype(dtype) for _ in range(3))
    _, cache = check_blocks_against_reference(q, k, v, F.causal_mask(128), dropout, 3,
                                              DTYPES[dtype])
    assert cache[7] == [(0, 32, 32), (32, 64, 64), (64, 96, 96), (96, 128, 128)]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("b, h, t, start, rows", [
    (2, 2, 11, 0, 2),          # 11 rows in blocks of 3: the last block is shorter
    (3, 2, 9, 0, 2),
    (1, 3, 13, 0, 3),          # B = 1: the parts are heads
    (2, 2, 12, 5, 3),          # decoding's prefill: causal_mask(t, start), 5 cached keys
    (2, 1, 70, 0, 16),         # rows of 18..70 keys, around the vectorised run of 64
    (1, 2, 150, 20, 32),       # prefill, blocks of the module's size
])
def test_causal_row_blocks_match_reference(dtype, dropout, b, h, t, start, rows):
    rng = np.random.default_rng(t + start)
    q = rng.standard_normal((b, h, t, 5)).astype(dtype)
    k, v = (rng.standard_normal((b, h, start + t, 5)).astype(dtype) for _ in range(2))
    with pytest.MonkeyPatch.context() as mp:
        small_blocks(mp, rows)
        mp.setattr(ATTENTION, "SPLIT_MIN", 0)                   # parts on the worker threads
        mp.setattr(ATTENTION, "BLOCK_CHUNK_BYTES", 1)           # one batch element (head) each
        check_blocks_against_reference(q, k, v, F.causal_mask(t, start), dropout, t, DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_causal_blocks_with_padding_and_unattended_rows_and_keys(dtype):
    """A decoder's mask (causal and padding, per batch element) with the first rows attending
    nothing (a block of no keys at all) and the last keys attended by no row (dk, dv = 0)."""
    rng = np.random.default_rng(7)
    ids = np.array([[5, 6, 7, 8, 9, 4, 3, 0, 0, 0, 0, 0, 0, 0],
                    [5, 6, 7, 8, 9, 4, 3, 2, 1, 2, 3, 0, 0, 0]])
    mask = F.decoder_self_mask(ids, 0).copy()                 # (B, 1, T, T)
    mask[:, :, :4, :] = False
    q, k, v = (rng.standard_normal((2, 2, 14, 4)).astype(dtype) for _ in range(3))
    with pytest.MonkeyPatch.context() as mp:
        small_blocks(mp, 3)                                   # 4 blocks of 4, 4, 4, 2 rows
        out, cache = check_blocks_against_reference(q, k, v, mask, 0.3, 7, DTYPES[dtype])
        assert cache[7][0] == (0, 4, 0)                       # rows 0..3 attend no key
        assert cache[7][-1][2] == 11                          # keys 11.. attended by no row
        assert np.all(out[:, :, :4] == 0)
        dq, dk, dv = K.attention_backward(np.ones_like(out), cache)
    assert np.all(dq[:, :, :4] == 0) and np.all(dk[:, :, 11:] == 0) and np.all(dv[:, :, 11:] == 0)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_padding_at_every_sequence_end_is_skipped_too(dtype):
    """A (B, 1, 1, S) padding mask whose sequences all end before S: every block stops at the
    longest one (the mask's rows broadcast: one row for all queries)."""
    rng = np.random.default_rng(8)
    mask = (np.arange(12)[None, :] < np.array([7, 5])[:, None])[:, None, None, :]
    q, k, v = (rng.standard_normal((2, 3, 12, 4)).astype(dtype) for _ in range(3))
    with pytest.MonkeyPatch.context() as mp:
        small_blocks(mp, 3)
        _, cache = check_blocks_against_reference(q, k, v, mask, 0.3, 8, DTYPES[dtype])
    assert [c1 for _, _, c1 in cache[7]] == [7, 7, 7, 7]


@settings(deadline=None, max_examples=25)
@given(b=st.integers(1, 3), h=st.integers(1, 3), t=st.integers(2, 40), start=st.integers(0, 6),
       rows=st.integers(1, 12), d=st.integers(1, 9), dtype=st.sampled_from(list(DTYPES)),
       dropout=st.sampled_from([0.0, 0.3]), parallel=st.booleans(), seed=st.integers(0, 2**16))
def test_causal_row_blocks_match_reference_on_random_shapes(b, h, t, start, rows, d, dtype,
                                                            dropout, parallel, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, t, d)).astype(dtype)
    k, v = (rng.standard_normal((b, h, start + t, d)).astype(dtype) for _ in range(2))
    with pytest.MonkeyPatch.context() as mp:
        small_blocks(mp, rows)
        if parallel:
            mp.setattr(ATTENTION, "SPLIT_MIN", 0)
            mp.setattr(ATTENTION, "BLOCK_CHUNK_BYTES", 1)
        check_blocks_against_reference(q, k, v, F.causal_mask(t, start), dropout, seed,
                                       DTYPES[dtype], expect_blocks=t >= 2 * rows)


@pytest.mark.parametrize("candidate", ["numba-blocked", "blas", "blas-contiguous"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_causal_row_blocks_with_each_product_kernel(dispatcher_prefers, candidate, dtype):
    """The blocks' products are strided views (keys [0, c1) of a row, rows r0.. of a column):
    each product kernel the dispatcher may take computes them as the reference does."""
    dispatcher_prefers(candidate)
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 2, 100, 32)).astype(dtype) for _ in range(3))
    with pytest.MonkeyPatch.context() as mp:
        small_blocks(mp, 16)                                  # 4 blocks of 25 rows
        check_blocks_against_reference(q, k, v, F.causal_mask(100), 0.1, 9, DTYPES[dtype] * 10)
    assert candidate in runtime.choices().values()            # the product kernel really ran


@pytest.mark.parametrize("t", [20, 64])
def test_short_causal_inputs_take_the_full_path(t):
    """Fewer than 96 queries: one block of 32 rows (T < 32) or two (too little saved)."""
    rng = np.random.default_rng(t)
    q, k, v = (rng.standard_normal((2, 2, t, 8)) for _ in range(3))
    check_blocks_against_reference(q, k, v, F.causal_mask(t), 0.1, t, DTYPES[np.float64],
                                   expect_blocks=False)


def test_row_blocks_from_the_mask():
    def blocks(mask, tq, tk):
        return ATTENTION._row_blocks(ATTENTION._mask4(mask, (2, 3, tq, tk)), tq, tk)
    assert blocks(F.causal_mask(128), 128, 128) == [(0, 32, 32), (32, 64, 64), (64, 96, 96),
                                                    (96, 128, 128)]
    assert blocks(F.causal_mask(100), 100, 100) == [(0, 34, 34), (34, 68, 68), (68, 100, 100)]
    assert blocks(F.causal_mask(96, 4), 96, 100) == [(0, 32, 36), (32, 64, 68), (64, 96, 100)]
    assert blocks(F.causal_mask(256), 256, 256) == [(0, 64, 64), (64, 128, 128),
                                                    (128, 192, 192), (192, 256, 256)]
    assert blocks(F.causal_mask(64), 64, 64) is None          # 2 blocks save only 1/4
    assert blocks(F.causal_mask(96, 200), 96, 296) is None    # a long prefix: little to skip
    assert blocks(None, 128, 128) is None
    assert blocks(np.ones((128, 128), bool), 128, 128) is None

    def padded(*lengths):                                     # (B, 1, 1, S), B = 2
        return np.arange(128)[None, None, None, :] < np.array(lengths)[:, None, None, None]
    assert blocks(padded(128, 60), 128, 128) is None          # one full sequence: nothing to skip
    assert blocks(padded(80, 60), 128, 128) == [(0, 32, 80), (32, 64, 80), (64, 96, 80),
                                                 (96, 128, 80)]   # every one padded at its end
    assert ATTENTION._key_blocks([(0, 3, 0), (3, 6, 4), (6, 9, 4), (9, 11, 9)]) == \
        [(0, 4, 3), (4, 9, 9)]


def test_causal_blocks_give_the_same_bits_every_run_and_on_any_thread_count():
    """Same inputs -> same bits: twice in a row, and on 1 and 2 threads (the parts, fixed by the
    shape and the mask, go to whichever thread is free)."""
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((4, 2, 128, 32)).astype(np.float32) for _ in range(3))
    dout = rng.standard_normal((4, 2, 128, 32)).astype(np.float32)
    mask = F.causal_mask(128)

    def run():
        out, cache = K.attention_forward(q, k, v, mask, 0.1, np.random.default_rng(5), True)
        assert cache[7] is not None
        assert ATTENTION._parts(cache[3].shape, 4, cache[7])[1]            # parallel parts
        grads = K.attention_backward(dout, cache)
        return [out.copy(), cache[3], cache[4]] + [g.copy() for g in grads]
    assert_same_bits_on_threads(run)


def test_take_rows_gathers_rows_of_strided_views(backend):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 2, 7, 3))[:, :, :4]                  # (rows, H, t, d), strided
    out = np.zeros((6, 2, 7, 3))[:, :, :4]
    index = np.array([4, 0, 0, 2, 3, 4])
    result = nf.backend.ops().take_rows(x, index, out)
    assert result is out
    np.testing.assert_array_equal(out, x[index])


# -- saturated heads: subnormal gradients are flushed to 0 ----------------------------------------

def subnormal(x):
    return (x != 0) & (np.abs(x) < np.finfo(x.dtype).tiny)


def test_flush_subnormal_sets_only_subnormals_to_zero():
    for dtype in (np.float32, np.float64):
        tiny = np.finfo(dtype).tiny
        x = np.array([tiny / 4, -tiny / 2, tiny, -tiny, 1.0, 0.0, np.nan, -np.inf], dtype=dtype)
        out = F.flush_subnormal(x)
        assert out is x
        np.testing.assert_array_equal(x, np.array([0, 0, tiny, -tiny, 1, 0, np.nan, -np.inf],
                                                  dtype=dtype))


@pytest.mark.parametrize("blocks", [False, True])
def test_saturated_heads_give_no_subnormal_gradients(monkeypatch, blocks):
    """Scores some 100 apart (a trained head that attends one key) put P, dS and whole rows of
    dq and dk below float32's smallest normal number. The reference and the kernel return those
    entries as 0, and every other entry as the unflushed backward computes it."""
    rng = np.random.default_rng(11)
    b, h, t, d = 2, 2, 40, 16
    q, k = (8 * rng.standard_normal((b, h, t, d))).astype(np.float32), \
        (8 * rng.standard_normal((b, h, t, d))).astype(np.float32)
    v = rng.standard_normal((b, h, t, d)).astype(np.float32)
    mask = F.causal_mask(t)
    if blocks:
        small_blocks(monkeypatch, 8)
    out_ref, cache_ref = F.attention_forward(q, k, v, mask)
    dout = (1e-3 * rng.standard_normal(out_ref.shape)).astype(np.float32)
    probs, scale = cache_ref[3], cache_ref[6]                # the textbook backward, unflushed
    dp = dout @ v.swapaxes(-1, -2)
    ds = probs * (dp - (dp * probs).sum(axis=-1, keepdims=True)) * np.float32(scale)
    plain = (ds @ k, ds.swapaxes(-1, -2) @ q, probs.swapaxes(-1, -2) @ dout)
    assert subnormal(ds).sum() > 100 and all(subnormal(g).any() for g in plain)
    out, cache = K.attention_forward(q, k, v, mask)
    assert (cache[7] is not None) == blocks
    for grads in (F.attention_backward(dout, cache_ref), K.attention_backward(dout, cache)):
        for g, g_plain in zip(grads, plain):
            assert not subnormal(g).any()
            normal = ~subnormal(g_plain)
            close(g[normal], g_plain[normal], 1e-5)
