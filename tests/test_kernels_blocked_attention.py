"""The blocked (long-context) attention of npformer/kernels/blocked_attention.py against the NumPy
reference: forward and backward under every kind of mask, dropout with the reference's very mask
bits, grouped key/value heads, fully masked rows, sizes that are not multiples of the blocks; the
same bits on 1 and 2 threads; a memory use linear in T; the dispatch rule; a whole GPT step
through it equal to the fused path's.

The blocks are shrunk (8 query rows, 16 keys) and the dispatch thresholds lowered so that small,
fast inputs cross many blocks."""
import importlib
import tracemalloc

import numpy as np
import pytest

import npformer as nf
from npformer import backend, runtime
from npformer import functional as F
from thread_bits import assert_same_bits_on_threads

K = backend.load("numba")
ATTENTION = importlib.import_module("npformer.kernels.attention")
BLOCKED = importlib.import_module("npformer.kernels.blocked_attention")

TOL = {np.float64: 1e-12, np.float32: 2e-5}


@pytest.fixture
def small_blocks(monkeypatch):
    """Every attention call takes the blocked path, with blocks of 8 query rows and 16 keys."""
    monkeypatch.setattr(ATTENTION, "BLOCKED_MIN_KEYS", 1)
    monkeypatch.setattr(ATTENTION, "BLOCKED_MIN_QUERIES", 1)
    monkeypatch.setattr(BLOCKED, "BLOCK_Q", 8)
    monkeypatch.setattr(BLOCKED, "BLOCK_K", 16)


def close(a, b, tol):
    scale = max(1.0, float(np.abs(b).max(initial=0.0)))
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * scale)


def make_mask(kind, b, tq, tk, rng):
    """None, causal (queries at the last tq of tk positions), padding (B, 1, 1, Tk) with one
    sequence of length 0 (every row of it fully masked), or random (B, H|1, Tq, Tk) with a fully
    masked row."""
    if kind == "none":
        return None
    if kind == "causal":
        return F.causal_mask(tq, tk - tq)                       # (1, 1, Tq, Tk)
    if kind == "padding":
        lengths = np.array([tk, 0, 5][:b])
        return (np.arange(tk)[None, :] < lengths[:, None])[:, None, None, :]
    mask = rng.random((b, 1, tq, tk)) > 0.6
    mask[0, 0, 3, :] = False
    return mask


def reference(q, k, v, mask, dropout, seed, dout):
    """The reference on key/value heads repeated for their query heads, its dk, dv summed back
    over each group."""
    group = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    rng = np.random.default_rng(seed)
    out, cache = F.attention_forward(q, kr, vr, mask, dropout, rng, True)
    dq, dk, dv = F.attention_backward(dout, cache)
    b, hkv, tk = k.shape[:3]
    return out, dq, dk.reshape(b, hkv, group, tk, -1).sum(2), \
        dv.reshape(b, hkv, group, tk, -1).sum(2), rng


def inputs(dtype, b=3, h=4, hkv=4, tq=37, tk=45, d=5, seed=0):
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((b, tq, 3 * h * d)).astype(dtype)
    q = F.split_heads(qkv[..., : h * d], h)                     # a strided view, as in the model
    k = rng.standard_normal((b, hkv, tk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, tk, d + 1)).astype(dtype)
    dout = rng.standard_normal((b, h, tq, d + 1)).astype(dtype)
    return q, k, v, dout, rng


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["none", "causal", "padding", "random"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("hkv", [4, 2, 1])
def test_blocked_attention_matches_the_reference(small_blocks, dtype, kind, dropout, hkv):
    """Tq != Tk, neither a multiple of the blocks; 4 query heads over 4, 2 or 1 key/value heads."""
    q, k, v, dout, rng = inputs(dtype, hkv=hkv, tk=45 if kind != "causal" else 53)
    mask = make_mask(kind, q.shape[0], q.shape[2], k.shape[2], rng)
    out_ref, dq_ref, dk_ref, dv_ref, rng_ref = reference(q, k, v, mask, dropout, 7, dout)
    rng = np.random.default_rng(7)
    out, cache = K.attention_forward(q, k, v, mask, dropout, rng, True)
    assert isinstance(cache[7], BLOCKED.Saved)
    assert cache[3] is None and cache[4] is None                # no probabilities kept
    assert rng.integers(1 << 62) == rng_ref.integers(1 << 62)   # the same draws as the reference
    assert out.shape == out_ref.shape and out.dtype == dtype and np.isfinite(out).all()
    close(out, out_ref, TOL[dtype])
    grads = K.attention_backward(dout, cache)
    for g, g_ref in zip(grads, (dq_ref, dk_ref, dv_ref)):
        assert g.shape == g_ref.shape and g.dtype == dtype and np.isfinite(g).all()
        close(g, g_ref, TOL[dtype])


def test_dropout_drops_exactly_the_references_units(small_blocks):
    """With v = identity columns, out is P' itself: every unit the reference's keep-mask drops is
    exactly 0 here, and every kept one equals the reference's."""
    rng = np.random.default_rng(3)
    b, h, t = 2, 3, 40
    q, k = rng.standard_normal((b, h, t, 4)), rng.standard_normal((b, h, t, 4))
    v = np.broadcast_to(np.eye(t), (b, h, t, t)).copy()
    mask = F.causal_mask(t)
    out_ref, cache_ref = F.attention_forward(q, k, v, mask, 0.5, np.random.default_rng(9), True)
    out, _ = K.attention_forward(q, k, v, mask, 0.5, np.random.default_rng(9), True)
    keep = cache_ref[5][0]
    assert 0.3 < keep.mean() < 0.7
    np.testing.assert_array_equal(out == 0, (cache_ref[4] == 0))
    close(out, cache_ref[4], 1e-12)


def test_a_fully_masked_row_gives_zeros_never_nan(small_blocks):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 20, 4)) for _ in range(3))
    mask = np.ones((2, 1, 20, 20), dtype=bool)
    mask[1, 0, 17, :] = False                   # one row
    mask[0, 0, 8:16, :] = False                 # a whole query block: no key block computed
    out, cache = K.attention_forward(q, k, v, mask, 0.2, np.random.default_rng(1), True)
    assert np.all(out[1, :, 17] == 0) and np.all(out[0, :, 8:16] == 0)
    dq, dk, dv = K.attention_backward(np.ones_like(out), cache)
    assert np.all(dq[1, :, 17] == 0) and np.all(dq[0, :, 8:16] == 0)
    assert all(np.isfinite(g).all() for g in (out, dq, dk, dv))


def test_causal_masks_skip_the_blocks_above_the_diagonal(monkeypatch):
    monkeypatch.setattr(BLOCKED, "BLOCK_Q", 8)
    monkeypatch.setattr(BLOCKED, "BLOCK_K", 16)
    blocks = BLOCKED.plan(ATTENTION._mask4(F.causal_mask(40), (1, 1, 40, 40)), 40, 40)
    assert blocks == [(0, 8, [(0, 8)]), (8, 16, [(0, 16)]), (16, 24, [(0, 16), (16, 24)]),
                      (24, 32, [(0, 16), (16, 32)]), (32, 40, [(0, 16), (16, 32), (32, 40)])]
    none = BLOCKED.plan(ATTENTION._mask4(None, (1, 1, 9, 20)), 9, 20)
    assert none == [(0, 8, [(0, 16), (16, 20)]), (8, 9, [(0, 16), (16, 20)])]
    padded = np.arange(40)[None, None, None, :] < np.array([20, 30])[:, None, None, None]
    assert BLOCKED.plan(ATTENTION._mask4(padded, (2, 1, 8, 40)), 8, 40) == [(0, 8, [(0, 16),
                                                                                      (16, 30)])]


def test_the_same_bits_on_one_and_two_threads(small_blocks):
    """The parts (batch element, key/value heads), fixed by the shape, go to whichever thread is
    free; each writes its own outputs and sums its blocks in a fixed order."""
    q, k, v, dout, _ = inputs(np.float32, b=3, h=4, hkv=2, tq=70, tk=70, d=8)
    mask = F.causal_mask(70)
    assert len(BLOCKED.parts(3, 2, 2, 4)) >= 2

    def run():
        out, cache = K.attention_forward(q, k, v, mask, 0.1, np.random.default_rng(5), True)
        return [out.copy()] + [g.copy() for g in K.attention_backward(dout, cache)]
    assert_same_bits_on_threads(run)


def test_memory_is_linear_in_t():
    """At T = 4,096 (the default thresholds: this is the blocked path) the forward and backward
    allocate less than a tenth of one copy of the (B, H, T, T) scores, and the cache holds no
    array of T x T entries but the caller's mask."""
    rng = np.random.default_rng(0)
    b, h, t, d = 1, 1, 4096, 16
    q, k, v = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(3))
    dout = rng.standard_normal((b, h, t, d)).astype(np.float32)
    mask = F.causal_mask(t)
    scores_bytes = b * h * t * t * 4
    runtime.configure_runtime(threads=1)
    try:
        for trace in (False, True):             # the first call loads the compiled kernels
            if trace:
                tracemalloc.start()
            out, cache = K.attention_forward(q, k, v, mask, 0.1, np.random.default_rng(1), True)
            grads = K.attention_backward(dout, cache)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        runtime.configure_runtime()
    assert isinstance(cache[7], BLOCKED.Saved)
    assert peak < scores_bytes / 10, f"peak {peak / 2**20:.1f} MiB"
    saved = cache[7]
    kept = [x for x in (*cache[:3], saved.out, saved.row_max, saved.inv_sum)]
    assert all(x.size < t * t for x in kept)
    assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads)


def test_the_dispatch_rule_reads_the_shape_alone():
    use = ATTENTION.use_blocked
    assert not use((64, 6, 128, 32), (64, 6, 128, 32), 4)         # the recipes' T <= 128
    assert not use((256, 8, 15, 32), (256, 8, 14, 32), 4)
    assert not use((8, 6, 1, 32), (8, 6, 4096, 32), 4)            # a decoding step's one query
    assert not use((16, 6, 511, 32), (16, 6, 511, 32), 4)
    assert use((4, 6, 2048, 32), (4, 6, 2048, 32), 4)
    assert use((1, 6, 64, 32), (1, 6, 600, 32), 4)                # a prompt over a long cache
    assert use((4096, 8, 128, 32), (4096, 8, 128, 32), 8)         # 4 GiB of float64 scores
    assert not use((2, 6, 10, 32), (2, 2, 10, 32), 4)             # grouped heads: as the query
    assert use((1, 6, 64, 32), (1, 2, 600, 32), 4)                # heads' shapes would go


def test_short_sequences_keep_the_fused_path_and_its_weights():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 128, 8)).astype(np.float32) for _ in range(3))
    out, cache = K.attention_forward(q, k, v, F.causal_mask(128))
    assert cache[3] is not None and not isinstance(cache[7], BLOCKED.Saved)


def test_grouped_heads_are_refused_unless_they_divide():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 6, 4, 8)), rng.standard_normal((1, 4, 4, 8))
    with pytest.raises(ValueError, match="Hkv dividing H"):
        K.attention_forward(q, k, k)


def gpt_step(blocked, monkeypatch, kv_heads=None, **kw):
    """One AdamW step of a small GPT on 2 x 72 tokens, the attention on the blocked path or not;
    returns the logits and every parameter afterwards (and the key heads each attention read
    into ``kv_heads``)."""
    kv_heads = [] if kv_heads is None else kv_heads
    if blocked:
        monkeypatch.setattr(ATTENTION, "BLOCKED_MIN_KEYS", 1)
        monkeypatch.setattr(ATTENTION, "BLOCKED_MIN_QUERIES", 1)
    else:
        monkeypatch.setattr(ATTENTION, "BLOCKED_MIN_KEYS", 1 << 30)
    model = nf.GPT(13, d_model=16, n_heads=4, d_ff=24, n_layers=2, max_len=72, dtype=np.float64,
                   seed=3, **kw)
    opt = nf.AdamW(model, lr=1e-2, weight_decay=0.1)
    ids = np.random.default_rng(0).integers(0, 13, size=(2, 73))
    model.zero_grad()
    logits = model.forward(ids[:, :-1])
    _, dlogits = nf.cross_entropy(logits, ids[:, 1:])
    model.backward(dlogits)
    opt.step()
    weights = [a.attn_weights for a in (blk.self_attn for blk in model.blocks)]
    kv_heads.extend(blk.self_attn._cache[2][1].shape[1] for blk in model.blocks)  # keys read
    return logits.copy(), [p.data.copy() for _, p in model.named_parameters()], weights


@pytest.mark.parametrize("kw", [dict(dropout=0.1),
                                dict(norm="rmsnorm", ffn="gated", activation="silu", n_kv_heads=2,
                                     positions="rotary", dropout=0.1)])
def test_a_gpt_step_through_the_blocked_path_equals_the_fused_one(monkeypatch, kw):
    before = nf.get_backend()
    nf.set_backend("numba")
    try:
        monkeypatch.setattr(BLOCKED, "BLOCK_Q", 16)
        monkeypatch.setattr(BLOCKED, "BLOCK_K", 32)
        heads_b, heads_f = [], []
        logits_b, params_b, weights_b = gpt_step(True, monkeypatch, heads_b, **kw)
        logits_f, params_f, weights_f = gpt_step(False, monkeypatch, heads_f, **kw)
    finally:
        nf.set_backend(before)
    assert all(w is None for w in weights_b) and all(w is not None for w in weights_f)
    # grouped heads: both paths read the shared kv heads as they are (no repeat, dk and dv per
    # kv head)
    assert heads_b == heads_f == [kw.get("n_kv_heads", 4)] * 2
    close(logits_b, logits_f, 1e-12)
    for a, b in zip(params_b, params_f):
        close(a, b, 1e-10)
