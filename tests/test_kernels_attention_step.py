"""The fused attention of cached decoding steps (``npformer.kernels.attention_step``): held
against the NumPy reference's attention in float32 and float64 (masks, fully masked rows,
grouped heads, one and five queries, keys and values read through the cache's strided views),
the same bits on any thread count, and wired into the attention module's cached steps only
(training and full forwards keep their path and their bits).
"""
import importlib

import numba
import numpy as np
import pytest

import npformer as nf
from npformer import backend
from npformer import functional as F
from npformer.nn import MultiHeadAttention
from thread_bits import assert_same_bits_on_threads

K = backend.load("numba")
STEP = importlib.import_module("npformer.kernels.attention_step")
SIMD = importlib.import_module("npformer.kernels._simd")
TOL = {np.float32: 2e-6, np.float64: 1e-13}


def cached(b, h_kv, t, d, capacity, dtype, rng):
    """A cache's view (b, Hkv, t, d) of a (b, Hkv, capacity, d) buffer, as KVCache.keys()."""
    return rng.standard_normal((b, h_kv, capacity, d)).astype(dtype)[:, :, :t]


def case(b, h, group, tq, tk, dk, dv, dtype, seed=0):
    """q as a strided view of a projection's output (B, Tq, 3 * H * dk), k and v cache views."""
    rng = np.random.default_rng(seed)
    q = F.split_heads(rng.standard_normal((b, tq, 3 * h * dk)).astype(dtype)[..., :h * dk], h)
    k = cached(b, h // group, tk, dk, tk + 7, dtype, rng)
    v = cached(b, h // group, tk, dv, tk + 7, dtype, rng)
    return q, k, v, rng


def reference(q, k, v, mask):
    group = q.shape[1] // k.shape[1]
    return F.attention_forward(q, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1),
                               mask)[0]


def check(q, k, v, mask):
    got = K.attention_step(q, k, v, mask)
    ref = reference(q, k, v, mask)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL[q.dtype.type])
    return got


def test_the_fold_rounds_leave_each_vectors_lane_sum_in_its_lane():
    """vfold8 .. vfold1 on 16 vectors fed in bit-reversed order: lane l = the sum of vector l."""
    @numba.njit
    def folded(x, out):
        v = SIMD.vload
        y0, y1 = SIMD.vfold8(v(x, 0), v(x, 128)), SIMD.vfold8(v(x, 64), v(x, 192))
        y2, y3 = SIMD.vfold8(v(x, 32), v(x, 160)), SIMD.vfold8(v(x, 96), v(x, 224))
        y4, y5 = SIMD.vfold8(v(x, 16), v(x, 144)), SIMD.vfold8(v(x, 80), v(x, 208))
        y6, y7 = SIMD.vfold8(v(x, 48), v(x, 176)), SIMD.vfold8(v(x, 112), v(x, 240))
        z0, z1 = SIMD.vfold4(y0, y1), SIMD.vfold4(y2, y3)
        z2, z3 = SIMD.vfold4(y4, y5), SIMD.vfold4(y6, y7)
        SIMD.vstore(out, 0, SIMD.vfold1(SIMD.vfold2(z0, z1), SIMD.vfold2(z2, z3)))
    x = np.arange(256, dtype=np.float64) ** 2        # sums exact in float64
    out = np.empty(16)
    folded(x, out)
    np.testing.assert_array_equal(out, x.reshape(16, 16).sum(axis=1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tk", [1, 15, 16, 17, 40])
def test_self_attention_step_matches_the_reference(tk, dtype):
    """One new query per row against the t cached positions, no mask (a decoding step)."""
    q, k, v, _ = case(5, 4, 1, 1, tk, 32, 32, dtype)
    out = check(q, k, v, None)
    assert out.base is not None and out.transpose(0, 2, 1, 3).flags.c_contiguous   # (B,Tq,H,dv)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_attention_step_with_padding_and_fully_masked_rows(dtype):
    """A source's 5 beams as query positions against its memory, padded at the end; a source
    with every position masked gives zeros, never NaN."""
    q, k, v, rng = case(6, 8, 1, 5, 18, 32, 32, dtype)
    lengths = np.array([18, 5, 0, 11, 17, 1])
    mask = (np.arange(18) < lengths[:, None])[:, None, None, :]         # (n, 1, 1, S)
    out = check(q, k, v, mask)
    assert (out[2] == 0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_per_query_masks_grouped_heads_and_other_head_sizes(dtype):
    """A (B, H, Tq, Tk) mask with some queries fully masked, 4 query heads per key/value head,
    dk 16 and dv 48 (two multiples of 16), 33 keys (three blocks of 16, the last nearly empty)."""
    q, k, v, rng = case(3, 8, 4, 5, 33, 16, 48, dtype, seed=1)
    mask = rng.random((3, 8, 5, 33)) < 0.6
    mask[1, 3, 2] = False
    mask[2, :, 4] = False
    out = check(q, k, v, mask)
    assert (out[1, 3, 2] == 0).all() and (out[2, :, 4] == 0).all()


def test_a_causal_step_of_several_positions_matches_the_reference():
    """A prompt's positions at once (Tq > 1 under a causal mask with an offset)."""
    q, k, v, _ = case(2, 4, 2, 3, 12, 32, 32, np.float64)
    check(q, k, v, F.causal_mask(3, 9))


@pytest.mark.parametrize("shape", [(2, 4, 1, 3, 8, 8), (2, 4, 1, 20, 30, 32)])
def test_shapes_it_does_not_take_go_to_the_matrix_product_path(shape):
    """Head sizes that are not multiples of 16, more than MAX_QUERIES queries: the answer is
    still the reference's (through kernels.attention's attention_forward)."""
    b, h, group, tq, tk, d = shape
    assert tq > STEP.MAX_QUERIES or d % 16
    q, k, v, _ = case(b, h, group, tq, tk, d, d, np.float64)
    check(q, k, v, F.causal_mask(tq, tk - tq))


def test_bad_shapes_are_refused():
    q, k, v, _ = case(2, 4, 1, 1, 8, 32, 32, np.float32)
    with pytest.raises(ValueError, match="agree"):
        K.attention_step(q, k[:, :3], v[:, :3])
    with pytest.raises(ValueError, match="mask"):
        K.attention_step(q, k, v, np.ones((3, 1, 1, 8), dtype=bool))


def test_grouped_heads_give_the_bits_of_repeated_heads():
    q, k, v, rng = case(4, 8, 4, 5, 21, 32, 32, np.float32, seed=3)
    mask = rng.random((4, 1, 5, 21)) < 0.7
    np.testing.assert_array_equal(K.attention_step(q, k, v, mask),
                                  K.attention_step(q, np.repeat(k, 4, axis=1),
                                                   np.repeat(v, 4, axis=1), mask))


@pytest.mark.parametrize("tq", [1, 5])
def test_same_bits_on_any_thread_count(monkeypatch, tq):
    """Rows in parts of a few rows each (so that both threads work): the bits do not move."""
    monkeypatch.setattr(STEP, "PART_WORK", 1 << 12)
    monkeypatch.setattr(STEP, "SPLIT_MIN", 1)
    q, k, v, rng = case(40, 8, 2, tq, 23, 32, 32, np.float32, seed=2)
    mask = (np.arange(23) < rng.integers(0, 24, 40)[:, None])[:, None, None, :]
    assert_same_bits_on_threads(lambda: K.attention_step(q, k, v, mask))


# -- the module: cached steps take the fused pass, nothing else does --------------------------

def attention(dtype=np.float32, **options):
    """Heads of 16 (the fused pass's smallest), 2 key/value heads for 4 query heads."""
    return MultiHeadAttention(64, 4, rng=np.random.default_rng(0), dtype=dtype, n_kv_heads=2,
                              **options)


def steps(att, x, memory):
    """A prompt, then single self-attention steps; a cross-attention step of 2 beams a source."""
    cache = att.new_cache(x.shape[0], x.shape[1], x.dtype)
    out = [att.step(x[:, :3], cache)] + [att.step(x[:, i:i + 1], cache) for i in range(3, 6)]
    mask = (np.arange(memory.shape[1]) < np.array([[4], [7]]))[:, None, None, :]
    beams = np.repeat(x[:, 6:7], 2, axis=0)                          # (2 sources x 2 beams)
    out.append(att.cross_step(beams, att.memory_cache(memory), mask))
    return out




def spy(monkeypatch):
    """Count the calls of the kernels' attention_step."""
    calls, inner = [], K.attention_step

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return inner(*args, **kwargs)
    monkeypatch.setattr(K, "attention_step", counted)
    return calls


def test_cached_steps_in_evaluation_take_the_fused_pass(monkeypatch, numba_backend):
    rng = np.random.default_rng(3)
    x, memory = rng.standard_normal((2, 8, 64)), rng.standard_normal((2, 7, 64))
    att = attention(np.float64).eval()
    calls = spy(monkeypatch)
    got = steps(att, x, memory)
    assert calls == [(2, 4, 3, 16)] + [(2, 4, 1, 16)] * 3 + [(2, 4, 2, 16)]
    nf.set_backend("numpy")
    ref = steps(attention(np.float64).eval(), x, memory)
    for a, r in zip(got, ref):
        np.testing.assert_allclose(a, r, rtol=0, atol=1e-12)


def test_training_full_forwards_and_score_options_keep_their_path(monkeypatch, numba_backend):
    """A module in training, any full forward, and a module with its own score options (Gemma
    2's soft-cap, which only the reference computes) never reach the fused pass."""
    rng = np.random.default_rng(4)
    x, memory = rng.standard_normal((2, 8, 64)), rng.standard_normal((2, 7, 64))
    calls = spy(monkeypatch)
    steps(attention(np.float64), x, memory)                          # training mode
    steps(attention(np.float64, softcap=20.0).eval(), x, memory)
    att = attention(np.float64)
    att.forward(x, mask=F.causal_mask(8))
    att.eval().forward(x, memory)
    assert calls == []
