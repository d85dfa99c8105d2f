"""Incremental decoding in the layers: ``MultiHeadAttention.step``, ``DecoderLayer.step`` and the
``TranslationState`` the searches run over. T steps equal one forward over T positions on both
backends; the encoder and the cross-attention keys run once per source; bad use is a clear
``ValueError``."""
import importlib
import numpy as np
import pytest

import npformer as nf
from npformer import functional as F
from npformer.decoding.search import beam_search, greedy_search, sample_search
from npformer.nn.attention import KVCache, MultiHeadAttention

V_SRC, V_TGT = 13, 11
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-10, atol=1e-10)}


def make_model(dtype=np.float64, seed=0, **kw):
    return nf.Transformer(V_SRC, V_TGT, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=2,
                          n_decoder_layers=2, dropout=0.1, max_len=24, dtype=dtype, seed=seed,
                          **kw).eval()


def sources(rng, b, s):
    src = rng.integers(4, V_SRC, size=(b, s))
    for row, n in zip(src, rng.integers(1, s + 1, size=b)):
        row[n:] = 0                                            # right padding
    return src


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_self_attention_steps_equal_one_causal_forward(backend, dtype):
    rng = np.random.default_rng(0)
    attn = MultiHeadAttention(16, 4, qk_dim=8, rng=rng, dtype=dtype)
    attn.eval()
    x = rng.standard_normal((3, 6, 16)).astype(dtype)                  # (B, T, D)
    full = attn.forward(x, mask=F.causal_mask(6))
    cache = attn.new_cache(3, 6, dtype)
    steps = np.concatenate([attn.step(x[:, t:t + 1], cache) for t in range(6)], axis=1)
    np.testing.assert_allclose(steps, full, **TOL[dtype])
    assert cache.length == 6 and cache.k.shape == (3, 4, 6, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm_first,qk_dim", [(False, None), (True, 8)])
def test_t_steps_of_the_state_equal_one_forward_over_t_positions(backend, dtype, norm_first,
                                                                qk_dim):
    model = make_model(dtype, norm_first=norm_first, qk_dim=qk_dim)
    rng = np.random.default_rng(1)
    src = sources(rng, 3, 5)
    tgt_in = np.concatenate([np.ones((3, 1), int), rng.integers(3, V_TGT, size=(3, 6))], axis=1)
    memory, src_mask = model.encode(src)
    full = model.decode(tgt_in, memory, src_mask).astype(np.float64)
    full[..., [0, 1]] = -np.inf                                        # <pad>, <bos>
    state = model.decoder_state(src, bos_id=1, eos_id=2)
    steps = np.stack([state.step(tgt_in[:, t]) for t in range(7)], axis=1)
    np.testing.assert_allclose(steps, F.log_softmax(full), **TOL[dtype])


def test_beams_share_their_sources_encoder_output_and_cross_attention_keys():
    model = make_model(seed=2)
    src = sources(np.random.default_rng(2), 2, 4)
    state = model.decoder_state(src, bos_id=1, eos_id=2, beams=3)
    memory = state.memory_caches[0]
    assert state.batch_size == 6 and memory.batch_size == 2          # once per source
    keys = memory.k
    state.step(state.first_tokens())
    state.reorder([2, 0, 0, 5, 4, 3])                                  # beams move within sources
    assert memory.batch_size == 2 and memory.k is keys
    before = memory.keys().copy()
    state.reorder([3, 4, 5])                                           # source 0 finished
    assert state.batch_size == 3 and memory.batch_size == 1
    np.testing.assert_array_equal(memory.keys()[0], before[1])
    assert state.step(np.array([3, 4, 5])).shape == (3, V_TGT)


def test_beam_rows_decode_as_their_source_decoded_alone():
    """Cross-attention reads each source's keys for all its beams (the beams as query
    positions): every beam row gives the log-probabilities its source gives on its own."""
    model = make_model(seed=3)
    src = sources(np.random.default_rng(3), 2, 5)
    beams = model.decoder_state(src, bos_id=1, eos_id=2, beams=2)
    tokens = np.array([[1, 1, 1, 1], [4, 5, 6, 7], [8, 3, 9, 10]])     # (steps, rows)
    for t in range(3):
        logp = beams.step(tokens[t])
    for row in range(4):
        solo = model.decoder_state(src[[row // 2]], bos_id=1, eos_id=2)
        for t in range(3):
            solo_logp = solo.step(tokens[t][[row]])
        np.testing.assert_allclose(logp[row], solo_logp[0], rtol=1e-10, atol=1e-10)


def test_a_first_step_of_equal_tokens_runs_one_row_per_source_and_repeats_it(backend):
    """Beam search's first step gives every beam of a source ``<bos>``: the state computes one
    row per source and copies its result and cached keys and values to the other beams, which
    is what each beam row computes on its own. Different tokens within a source run in full."""
    model = make_model(seed=4)
    src = sources(np.random.default_rng(4), 3, 5)
    beams = model.decoder_state(src, bos_id=1, eos_id=2, beams=4)
    solo = model.decoder_state(src, bos_id=1, eos_id=2)
    rows, decoder_step = [], model.decoder.step
    model.decoder.step = lambda x, *args: rows.append(len(x)) or decoder_step(x, *args)
    logp = beams.step(beams.first_tokens())                            # (12, V)
    assert rows == [3]                                                 # one row per source
    np.testing.assert_allclose(logp, np.repeat(solo.step(solo.first_tokens()), 4, axis=0),
                               rtol=1e-12, atol=1e-12)
    assert beams.batch_size == 12 and beams.length == 1
    for wide, narrow in zip(beams.caches, solo.caches):
        np.testing.assert_array_equal(wide.keys(), np.repeat(narrow.keys(), 4, axis=0))
        np.testing.assert_array_equal(wide.values(), np.repeat(narrow.values(), 4, axis=0))
    tokens = np.array([3, 4, 5, 6] * 3)                                # rows now differ
    step = beams.step(tokens)
    assert rows[-1] == 12                                              # in full
    for row in (0, 5, 11):
        alone = model.decoder_state(src[[row // 4]], bos_id=1, eos_id=2)
        alone.step(np.array([1]))
        np.testing.assert_allclose(step[row], alone.step(tokens[[row]])[0], rtol=1e-10,
                                   atol=1e-10)
    mixed = model.decoder_state(src, bos_id=1, eos_id=2, beams=2)
    first = np.array([1, 3, 1, 1, 4, 1])                 # sources 0 and 2: their rows differ
    with pytest.raises(ValueError, match=r"tokens: .*\[0, 11\)"):
        mixed.step(np.full(6, 99))                       # refused before any row is computed
    assert mixed.batch_size == 6 and mixed.length == 0
    logp = mixed.step(first)
    assert rows[-1] == 6                                                # in full
    for row in range(6):
        alone = model.decoder_state(src[[row // 2]], bos_id=1, eos_id=2)
        np.testing.assert_allclose(logp[row], alone.step(first[[row]])[0], rtol=1e-10,
                                   atol=1e-10)


def test_kv_cache_repeat_rows_spreads_each_row_over_consecutive_rows(backend):
    cache = KVCache(6, 2, 3, 2, 3, np.float64)
    cache.batch_size = 2
    cache.append(np.arange(2.0)[:, None, None, None] + np.zeros((2, 2, 1, 2)),
                 -np.arange(2.0)[:, None, None, None] + np.zeros((2, 2, 1, 3)))
    k = cache.k
    cache.repeat_rows(3)
    assert cache.k is k and cache.batch_size == 6 and cache.length == 1
    np.testing.assert_array_equal(cache.keys()[:, 0, 0, 0], [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(cache.values()[:, 1, 0, 2], [0, 0, 0, -1, -1, -1])
    with pytest.raises(ValueError, match="KVCache: 12 rows exceed the 6 it holds"):
        cache.repeat_rows(2)


def test_kv_cache_grows_in_place_and_gathers_rows_between_two_buffers(backend):
    cache = KVCache(3, 2, 4, 5, 6, np.float64)
    k, v = cache.k, cache.v
    for t in range(2):
        cache.append(np.arange(3)[:, None, None, None] * 10 + np.full((3, 2, 1, 5), t),
                     np.full((3, 2, 1, 6), t))
    assert cache.k is k and cache.v is v                       # appended in place
    cache.reorder(np.array([2, 0, 2]))             # row 0 is read after row 0 is written
    assert cache.k is not k and cache.keys().shape == (3, 2, 2, 5)
    np.testing.assert_array_equal(cache.keys()[:, 0, :, 0], [[20, 21], [0, 1], [20, 21]])
    gathered = cache.k
    cache.reorder(np.array([1, 0, 0]))                         # back into the first pair
    assert cache.k is k and cache.v is v
    np.testing.assert_array_equal(cache.keys()[:, 0, :, 0], [[0, 1], [20, 21], [20, 21]])
    cache.reorder(np.array([0, 1]))                            # nothing moves
    assert cache.k is k and gathered is not k and cache.keys().shape == (2, 2, 2, 5)
    with pytest.raises(ValueError, match="KVCache: 5 positions exceed its capacity of 4"):
        cache.append(np.zeros((2, 2, 3, 5)), np.zeros((2, 2, 3, 6)))


@pytest.mark.parametrize("index, rows", [([0, 0, 2, 2], [0, 0, 2, 2]),    # beam: firsts stay
                                         ([0, 3, 2], [0, 3, 2]),          # a finished row's place
                                         ([3, 1], [3, 1])])               # taken by the last
def test_kv_cache_moves_only_the_rows_that_change_where_each_takes_a_row_that_stays(backend,
                                                                                     index, rows):
    cache = KVCache(4, 2, 3, 2, 3, np.float64)
    for t in range(2):
        cache.append(np.arange(4)[:, None, None, None] * 10.0 + t + np.zeros((4, 2, 1, 2)),
                     np.arange(4)[:, None, None, None] * -10.0 + t + np.zeros((4, 2, 1, 3)))
    k, v = cache.k, cache.v
    before_k, before_v = cache.keys().copy(), cache.values().copy()
    cache.reorder(np.array(index))
    assert cache.k is k and cache.v is v                       # in place, no gather
    np.testing.assert_array_equal(cache.keys(), before_k[rows])
    np.testing.assert_array_equal(cache.values(), before_v[rows])


def test_move_rows_refuses_a_row_it_would_read_after_writing(backend):
    x = np.arange(24.0).reshape(4, 1, 2, 3)
    np.testing.assert_array_equal(nf.backend.ops().move_rows(x.copy(), np.array([3, 3]),
                                                             np.array([0, 1])),
                                  x[[3, 3, 2, 3]])
    if backend == "numba":
        with pytest.raises(ValueError, match="a row of dst is also in src"):
            nf.backend.ops().move_rows(x, np.array([1, 0]), np.array([0, 1]))


LAYOUTS = {                                     # (B, H, T, d) buffer -> a 4-D view of it
    "cache rows": lambda buf: buf[:, :, :10],                   # the first t positions
    "whole buffer": lambda buf: buf,
    "one position": lambda buf: buf[:, :, 3:4],
    "one head": lambda buf: buf[:, 1:2, :10],
    "every other dimension": lambda buf: buf[:, :, :10, ::2],
    "heads reversed": lambda buf: buf[:, ::-1, :10],
    "heads inside positions": lambda buf: buf.reshape(buf.shape[0], -1, *buf.shape[1::2])
                                            .transpose(0, 2, 1, 3),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rows", [12, 256])
@pytest.mark.parametrize("in_parts", [False, True])
def test_the_row_movers_equal_the_reference_on_every_layout(layout, rows, in_parts, monkeypatch):
    """The Numba movers copy what the reference copies, in one pass and cut into parts for the
    runtime's workers (``in_parts``: a part's size made small enough that even 12 rows are cut)."""
    kernels, reference = nf.backend.load("numba"), nf.backend.load("numpy")
    if in_parts:
        monkeypatch.setattr(importlib.import_module("npformer.kernels.kv_cache"),
                            "PART_ELEMENTS", 512)
    rng = np.random.default_rng(rows)
    buf = rng.standard_normal((rows, 4, 16, 32)).astype(np.float32)
    src, dst = np.arange(0, rows, 2), np.arange(1, rows, 2)[::-1].copy()
    index = rng.integers(0, rows, rows + 3)
    moved = [buf.copy(), buf.copy()]
    for ops, copy in zip((kernels, reference), moved):
        ops.move_rows(LAYOUTS[layout](copy), src, dst)
    np.testing.assert_array_equal(moved[0], moved[1])             # the rows and nothing else
    x = LAYOUTS[layout](buf)
    outs = [np.full((rows + 3,) + buf.shape[1:], np.nan, np.float32) for _ in range(2)]
    for ops, out in zip((kernels, reference), outs):
        ops.take_rows(x, index, LAYOUTS[layout](out))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_beam_search_gives_the_same_bits_on_any_thread_count(backend):
    """The row movers' parallel kernels and the products share their work between threads:
    every token, probability and score stays the same on 1 and 2 threads."""
    from thread_bits import assert_same_bits_on_threads
    model = nf.Transformer(13, 40, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
                           n_decoder_layers=2, dropout=0.0, max_len=16, seed=3)
    src = np.random.default_rng(5).integers(3, 13, size=(24, 6))

    def run():
        hyps = beam_search(model.decoder_state(src, bos_id=1, eos_id=2, beams=3), 3,
                           max_new_tokens=8)
        return [np.array(h.ids + h.probs + [h.score]) for h in hyps]
    assert_same_bits_on_threads(run)


def test_bad_use_of_a_state_is_a_clear_error():
    model = make_model()
    src = sources(np.random.default_rng(4), 2, 3)
    with pytest.raises(ValueError, match="src: .*max_len=24"):
        model.decoder_state(np.full((1, 30), 5), bos_id=1, eos_id=2)     # longer than max_len
    with pytest.raises(ValueError, match="capacity: expected at most the model's max_len=24"):
        model.decoder_state(src, bos_id=1, eos_id=2, capacity=25)
    with pytest.raises(ValueError, match=r"eos_id: expected a target token id in \[0, 11\)"):
        model.decoder_state(src, bos_id=1, eos_id=11)
    state = model.decoder_state(src, bos_id=1, eos_id=2, beams=2, capacity=2)
    with pytest.raises(ValueError, match=r"tokens: expected 4 integer ids"):
        state.step(np.array([1, 1]))
    with pytest.raises(ValueError, match=r"reorder: expected row numbers in \[0, 4\)"):
        state.reorder([0, 4, 1, 1])
    with pytest.raises(ValueError, match="each run of 2 rows .* must come from one source"):
        state.reorder([0, 2, 1, 3])
    state.step(state.first_tokens())
    state.step(state.first_tokens())
    with pytest.raises(ValueError, match=r"step: the state is full \(2 positions"):
        state.step(state.first_tokens())
    empty = model.decoder_state(src, bos_id=1, eos_id=2)
    empty.reorder(np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="step: the state has no rows left"):
        empty.step(np.array([], dtype=np.int64))


class BigramState:
    """A decoder state with no source and no end-of-sequence id (a language model's shape):
    the next token's log-probabilities depend on the previous token alone."""

    def __init__(self, table, prompt_last, capacity):
        self.table, self.prev = table, np.asarray(prompt_last)
        self.beams, self.eos_id, self.capacity, self.length = 1, None, capacity, 0

    @property
    def batch_size(self):
        return len(self.prev)

    def first_tokens(self):
        return self.prev

    def step(self, tokens):
        self.length += 1
        return self.table[tokens]

    def reorder(self, index):
        self.prev = self.prev[index]


def test_searches_read_only_the_state_protocol():
    rng = np.random.default_rng(5)
    table = F.log_softmax(rng.standard_normal((6, 6)) * 3)
    hyps = greedy_search(BigramState(table, [0, 3], capacity=5))
    expected = []
    for tok in (0, 3):
        seq = []
        for _ in range(5):
            tok = int(table[tok].argmax())
            seq.append(tok)
        expected.append(seq)
    assert [h.ids for h in hyps] == expected and not any(h.finished for h in hyps)
    sampled = sample_search(BigramState(table, [1], capacity=4), rng=np.random.default_rng(0))
    assert len(sampled[0].ids) == 4
    with pytest.raises(ValueError, match="beam search needs an end-of-sequence id"):
        beam_search(BigramState(table, [1], capacity=3), beam_size=1)
    with pytest.raises(ValueError, match=r"max_new_tokens: expected at most 3"):
        greedy_search(BigramState(table, [1], capacity=3), max_new_tokens=4)
