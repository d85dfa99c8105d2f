"""Grouped key/value heads (n_kv_heads < n_heads) in the fused Numba attention: read in place,
never repeated, in training and in cached decoding steps.

The kernel is held against the NumPy reference (which repeats the heads: its readable
formulation), against its own path on repeated heads bit for bit (what the module computed
before the kernel read groups), across thread counts, and by a float64 gradient check; and no
(B, H, T, d) copy of the keys or values is made.
"""
import importlib

import numpy as np
import pytest

import npformer as nf
from npformer import backend
from npformer import functional as F
from npformer.nn import MultiHeadAttention
from thread_bits import assert_same_bits_on_threads

K = backend.load("numba")
ATTENTION = importlib.import_module("npformer.kernels.attention")
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def repeated(kv, group):
    """The reference's reading of grouped heads: each repeated for its group of query heads."""
    return np.repeat(kv, group, axis=1)


def group_sum(d, group):
    """The backward of ``repeated``: (B, H, T, d) -> (B, Hkv, T, d), summed over each group."""
    b, h, t, n = d.shape
    return d.reshape(b, h // group, group, t, n).sum(axis=2)


def inputs(b, h, group, tq, tk, d, dtype, seed):
    """q as a strided view of a projection's output, as in the model; k, v with H / group heads."""
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((b, tq, 3 * h * d)).astype(dtype)
    q = F.split_heads(qkv[..., :h * d], h)                              # (B, H, Tq, d)
    kv = rng.standard_normal((b, tk, 2 * (h // group) * d)).astype(dtype)
    k = F.split_heads(kv[..., :(h // group) * d], h // group)           # (B, Hkv, Tk, d)
    v = F.split_heads(kv[..., (h // group) * d:], h // group)
    return q, k, v, rng


def mask_of(kind, b, tq, tk, rng):
    if kind == "causal":
        return F.causal_mask(tq)
    if kind == "padding":
        lengths = rng.integers(1, tk + 1, size=b)
        return (np.arange(tk)[None, :] < lengths[:, None])[:, None, None, :]
    return None


def grouped_run(q, k, v, mask, dropout, dout):
    out, cache = K.attention_forward(q, k, v, mask, dropout, np.random.default_rng(5), True)
    return (out, cache[3], *K.attention_backward(dout, cache))


CASES = [(1, 2, 7, "none", 0.0), (2, 2, 33, "padding", 0.0), (3, 3, 64, "causal", 0.0),
         (2, 3, 100, "causal", 0.2), (2, 6, 130, "causal", 0.0), (1, 6, 96, "causal", 0.2),
         (3, 2, 1, "none", 0.0), (2, 3, 40, "padding", 0.2), (1, 2, 100, "causal", 0.0)]


@pytest.mark.parametrize("b, group, t, kind, dropout", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_kernel_matches_the_reference(b, group, t, kind, dropout, dtype):
    q, k, v, rng = inputs(b, 6, group, t, t, 8, dtype, seed=t)
    mask = mask_of(kind, b, t, t, rng)
    dout = rng.standard_normal((b, 6, t, 8)).astype(dtype)
    out, probs, dq, dk, dv = grouped_run(q, k, v, mask, dropout, dout)
    out_ref, cache = F.attention_forward(q, repeated(k, group), repeated(v, group), mask, dropout,
                                         np.random.default_rng(5), True)
    dq_ref, dk_ref, dv_ref = F.attention_backward(dout, cache)
    assert dk.shape == k.shape and dv.shape == v.shape               # per kv head
    for got, ref in ((out, out_ref), (probs, cache[3]), (dq, dq_ref),
                     (dk, group_sum(dk_ref, group)), (dv, group_sum(dv_ref, group))):
        scale = max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(got, ref, rtol=0, atol=TOL[dtype] * scale)


@pytest.mark.parametrize("b, group, t, kind, dropout", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_heads_give_the_bits_of_repeated_heads(b, group, t, kind, dropout, dtype):
    """Each product reads the same numbers as on repeated heads and dk, dv are summed over a
    group in the heads' order (NumPy's sum over the repeated heads): the same bits, at any
    thread count."""
    q, k, v, rng = inputs(b, 6, group, t, t, 8, dtype, seed=t + 1)
    mask = mask_of(kind, b, t, t, rng)
    dout = rng.standard_normal((b, 6, t, 8)).astype(dtype)
    got = assert_same_bits_on_threads(lambda: grouped_run(q, k, v, mask, dropout, dout))
    out, probs, dq, dk, dv = grouped_run(q, repeated(k, group), repeated(v, group), mask,
                                         dropout, dout)
    expected = (out, probs, dq, group_sum(dk, group), group_sum(dv, group))
    for a, e in zip(got, expected):
        assert a.shape == e.shape
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(e).tobytes()


def test_parts_over_heads_hold_whole_groups():
    """One batch element: the parts count key/value heads, each once, so a part holds every
    query head of its key/value heads and computes their whole gradient."""
    for shape, group in (((1, 6, 100, 100), 2), ((1, 8, 64, 64), 4), ((1, 6, 96, 96), 6)):
        parts, parallel = ATTENTION._parts(shape, 4, group=group)
        assert [i for _, lo, hi in parts for i in range(lo, hi)] == list(range(shape[1] // group))
        assert all(axis == 1 for axis, _, _ in parts)
        assert parallel == (shape[1] // group > 1)
        q = np.zeros(shape)
        assert sum(ATTENTION._part(q, p, group).shape[1] for p in parts) == shape[1]


@pytest.mark.parametrize("blocks", [False, True])
def test_gradcheck_of_the_grouped_kernel(monkeypatch, blocks):
    """float64, central differences; ``blocks``: the causal row-block path (blocks of 2 rows)."""
    if blocks:
        monkeypatch.setattr(ATTENTION, "MIN_BLOCK_ROWS", 2)
    q, k, v, rng = inputs(2, 4, 2, 8, 8, 3, np.float64, seed=3)
    q, k, v = q.copy(), k.copy(), v.copy()
    mask = F.causal_mask(8) if blocks else mask_of("padding", 2, 8, 8, rng)
    if blocks:
        assert ATTENTION._row_blocks(ATTENTION._mask4(mask, (2, 4, 8, 8)), 8, 8) is not None

    def f(q, k, v):
        out, cache = K.attention_forward(q, k, v, mask)
        return out, lambda dout: K.attention_backward(dout, cache)
    result = nf.gradcheck(f, [q, k, v], names=["q", "k", "v"])
    assert result.ok, result


def grouped_llama_attention(dtype=np.float32):
    rotary = F.rotary_tables(64, 8, dtype)
    return MultiHeadAttention(48, 6, rotary=rotary, rng=np.random.default_rng(0), dtype=dtype,
                              n_kv_heads=2, bias=False, out_bias=False)


def run_module(att, x, steps=3):
    """Training forward and backward (causal), then a prompt and single cached steps."""
    for p in att.parameters():
        p.grad = np.zeros_like(p.data)
    out = att.forward(x, mask=F.causal_mask(x.shape[1]))
    dx = att.backward(np.random.default_rng(1).standard_normal(out.shape).astype(x.dtype))
    results = [out, dx, att.in_proj_weight.grad.copy()]
    cache = att.new_cache(x.shape[0], x.shape[1], x.dtype)
    results.append(att.step(x[:, :4], cache))
    results += [att.step(x[:, i:i + 1], cache) for i in range(4, 4 + steps)]
    return results


def test_no_expanded_copy_of_keys_or_values(monkeypatch):
    """Neither np.repeat nor any (B, H, T, d) array of the keys or values: the kernels read
    the Hkv heads in place in forward, backward and cached steps, and dk, dv come per kv head."""
    def refuse(*args, **kwargs):
        raise AssertionError("np.repeat called: grouped heads were copied")
    before = nf.get_backend()
    nf.set_backend("numba")
    try:
        att = grouped_llama_attention()
        x = np.random.default_rng(2).standard_normal((2, 40, 48)).astype(np.float32)
        monkeypatch.setattr(np, "repeat", refuse)
        run_module(att, x)
        assert att._cache[2][1].shape[1] == 2                        # the kernel read 2 kv heads
    finally:
        nf.set_backend(before)


def test_grouped_module_matches_the_reference_backend_in_training_and_steps():
    x = np.random.default_rng(2).standard_normal((2, 40, 48))
    got = {}
    before = nf.get_backend()
    try:
        for name in ("numpy", "numba"):
            nf.set_backend(name)
            got[name] = run_module(grouped_llama_attention(np.float64), x)
    finally:
        nf.set_backend(before)
    for a, ref in zip(got["numba"], got["numpy"]):
        np.testing.assert_allclose(a, ref, rtol=0, atol=1e-11 * max(1.0, np.abs(ref).max()))


def test_grouped_module_steps_keep_their_bits_on_any_thread_count():
    x = np.random.default_rng(4).standard_normal((3, 40, 48)).astype(np.float32)
    before = nf.get_backend()
    nf.set_backend("numba")
    try:
        assert_same_bits_on_threads(lambda: run_module(grouped_llama_attention(), x))
    finally:
        nf.set_backend(before)
