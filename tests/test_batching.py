"""Tests for npformer.data.batching: padding, teacher forcing and the bucketed BatchSampler."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npformer.data.batching import (
    Batch, BatchSampler, iterate_batches, make_batch, pad_sequences,
)

PAD, BOS, EOS = 0, 1, 2
token_ids = st.integers(min_value=3, max_value=50)
sequences = st.lists(token_ids, min_size=1, max_size=9)
pairs_strategy = st.lists(st.tuples(sequences, st.lists(token_ids, max_size=9)), min_size=1, max_size=40)


def random_lengths(n, seed, high=30):
    rng = np.random.default_rng(seed)
    return rng.integers(1, high, size=n), rng.integers(1, high, size=n)


# ---- pad_sequences -----------------------------------------------------------------------

def test_pad_sequences_shape_values_and_padding():
    out = pad_sequences([[5, 6, 7], [8], []], pad_id=PAD)
    assert out.dtype == np.int64 and out.shape == (3, 3)
    assert out.tolist() == [[5, 6, 7], [8, PAD, PAD], [PAD, PAD, PAD]]
    assert pad_sequences([[5], [6, 7]], pad_id=9, length=4).tolist() == [[5, 9, 9, 9], [6, 7, 9, 9]]
    assert pad_sequences([np.array([4, 4])], pad_id=PAD).tolist() == [[4, 4]]


@pytest.mark.parametrize("args, kwargs, match", [
    (([],), {"pad_id": 0}, "at least one sequence"),
    (([[1, 2, 3]],), {"pad_id": 0, "length": 2}, r"length=2 is shorter than the longest sequence \(3"),
    (([[1.5, 2.0]],), {"pad_id": 0}, r"seqs\[0\] must be a 1-D sequence of integer ids"),
    (([[[1, 2]]],), {"pad_id": 0}, r"seqs\[0\] must be a 1-D"),
    (([[1]],), {"pad_id": 0.0}, "pad_id must be an integer"),
    (("abc",), {"pad_id": 0}, "list of token-id sequences"),
])
def test_pad_sequences_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pad_sequences(*args, **kwargs)


# ---- make_batch --------------------------------------------------------------------------

def test_make_batch_small_example():
    b = make_batch([[5, 6], [7]], [[8], [9, 10, 11]], PAD, BOS, EOS)
    assert b.src.tolist() == [[5, 6], [7, PAD]]
    assert b.tgt_in.tolist() == [[BOS, 8, PAD, PAD], [BOS, 9, 10, 11]]
    assert b.tgt_out.tolist() == [[8, EOS, PAD, PAD], [9, 10, 11, EOS]]
    assert (b.n_src_tokens, b.n_tgt_tokens) == (3, 6)
    assert b.indices.tolist() == [0, 1] and len(b) == 2


@settings(max_examples=60)
@given(pairs_strategy)
def test_make_batch_teacher_forcing_shift(pairs):
    src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
    b = make_batch(src, tgt, PAD, BOS, EOS, indices=np.arange(len(pairs)) + 100)
    B = len(pairs)
    assert b.src.shape == (B, max(map(len, src)))
    assert b.tgt_in.shape == b.tgt_out.shape == (B, max(map(len, tgt)) + 1)
    assert all(a.dtype == np.int64 for a in (b.src, b.tgt_in, b.tgt_out, b.indices))
    for r, (x, y) in enumerate(pairs):
        n = len(y)
        assert b.src[r, :len(x)].tolist() == x and (b.src[r, len(x):] == PAD).all()
        assert b.tgt_in[r, : n + 1].tolist() == [BOS] + y
        assert b.tgt_out[r, : n + 1].tolist() == y + [EOS]
        assert (b.tgt_in[r, n + 1:] == PAD).all() and (b.tgt_out[r, n + 1:] == PAD).all()
    # the decoder's input is the expected output shifted right by one
    real = b.tgt_out != PAD
    shifted = real[:, :-1] & (b.tgt_out[:, :-1] != EOS)      # target tokens y1..yn
    assert (b.tgt_in[:, 1:][shifted] == b.tgt_out[:, :-1][shifted]).all()
    assert b.n_src_tokens == int((b.src != PAD).sum())
    assert b.n_tgt_tokens == int(real.sum())
    assert b.indices.tolist() == list(range(100, 100 + B))


@pytest.mark.parametrize("src, tgt, kwargs, match", [
    ([[5]], [[6], [7]], {}, "same length, got 1 and 2"),
    ([], [], {}, "src_seqs must hold at least one sequence"),
    ([[5], []], [[6], [7]], {}, r"src_seqs\[1\] is empty"),
    ([[5, EOS]], [[6]], {}, r"src_seqs\[0\] contains a pad/bos/eos id"),
    ([[5]], [[BOS, 6]], {}, r"tgt_seqs\[0\] contains a pad/bos/eos id"),
    ([[5]], [[6, PAD]], {}, r"tgt_seqs\[0\] contains a pad/bos/eos id"),
    ([[5], [6, 7], [BOS]], [[8], [9], [10]], {}, r"src_seqs\[2\] contains .*got \[1\]"),
    ([[5], [6], [7]], [[8], [], [9, EOS, 3]], {}, r"tgt_seqs\[2\] contains .*got \[9, 2, 3\]"),
    ([[5], [6], []], [[8], [9], [10]], {}, r"src_seqs\[2\] is empty"),
    ([[5], [6]], [[7], [8]], {"indices": [1]}, "indices must be 2 integers"),
])
def test_make_batch_errors(src, tgt, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_batch(src, tgt, PAD, BOS, EOS, **kwargs)


# ---- BatchSampler ------------------------------------------------------------------------

sampler_config = st.fixed_dictionaries({
    "n": st.integers(1, 120),
    "lengths_seed": st.integers(0, 1000),
    "seed": st.integers(0, 1000),
    "epoch": st.integers(0, 5),
    "bucket_size": st.none() | st.integers(1, 150),      # None: the whole set in one bucket
    "shuffle": st.booleans(),
    "by": st.sampled_from(["batch_size", "max_tokens"]),
    "limit": st.integers(1, 200),
})


def build(cfg):
    src, tgt = random_lengths(cfg["n"], cfg["lengths_seed"])
    limit = {"batch_size": max(1, cfg["limit"] // 10)} if cfg["by"] == "batch_size" else {"max_tokens": cfg["limit"]}
    s = BatchSampler(src, tgt, shuffle=cfg["shuffle"], seed=cfg["seed"],
                     bucket_size=cfg["bucket_size"], **limit)
    s.set_epoch(cfg["epoch"])
    return s, src, tgt


@settings(max_examples=80)
@given(sampler_config)
def test_every_index_exactly_once_and_limits_respected(cfg):
    s, src, tgt = build(cfg)
    batches = list(s)
    assert len(batches) == len(s)
    assert sorted(np.concatenate(batches).tolist()) == list(range(cfg["n"]))
    for b in batches:
        assert b.dtype == np.int64 and len(b) >= 1
        if s.batch_size is not None:
            assert len(b) <= s.batch_size
        elif len(b) > 1:
            assert len(b) * (src[b].max() + tgt[b].max()) <= s.max_tokens
    if s.batch_size is not None:   # only one batch may be short
        assert sum(len(b) < s.batch_size for b in batches) <= 1


@settings(max_examples=40)
@given(sampler_config)
def test_same_seed_and_epoch_give_same_batches(cfg):
    a, b = build(cfg)[0], build(cfg)[0]
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert [x.tolist() for x in a] == [x.tolist() for x in a]   # iterating again repeats the epoch


def test_epochs_and_seeds_change_the_order():
    src, tgt = random_lengths(200, 0)
    def order(seed, epoch):
        s = BatchSampler(src, tgt, batch_size=16, seed=seed)
        s.set_epoch(epoch)
        return np.concatenate(list(s)).tolist()
    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0)


def test_whole_set_bucket_is_one_bucket_of_every_example():
    """bucket_size=None (fairseq's order) is the same as one bucket at least as large as the
    set; it pads less than buckets of a tenth of the set, and its state names it."""
    src, tgt = random_lengths(300, 2)
    for limit in ({"batch_size": 7}, {"max_tokens": 150}):
        whole = BatchSampler(src, tgt, bucket_size=None, seed=5, **limit)
        big = BatchSampler(src, tgt, bucket_size=300, seed=5, **limit)
        for epoch in (0, 3):
            whole.set_epoch(epoch), big.set_epoch(epoch)
            assert [b.tolist() for b in whole] == [b.tolist() for b in big]
    def padded(bucket_size):
        s = BatchSampler(src, tgt, max_tokens=150, bucket_size=bucket_size, seed=5)
        return sum(len(b) * (src[b].max() + tgt[b].max()) for b in s)
    assert padded(None) < padded(30)
    state = BatchSampler(src, tgt, batch_size=7, bucket_size=None).state_dict()
    assert state["bucket_size"] is None
    with pytest.raises(ValueError, match="bucket_size=None, but this sampler has bucket_size=1000"):
        BatchSampler(src, tgt, batch_size=7).load_state_dict(state)


def test_batches_group_similar_lengths():
    src, tgt = random_lengths(300, 1)
    s = BatchSampler(src, tgt, batch_size=10, bucket_size=300, seed=3)   # one bucket: fully sorted
    batches = list(s)
    # each batch is a run of the (src, tgt)-sorted data: no other example falls strictly inside it
    keys = [sorted(zip(src[b], tgt[b])) for b in batches]
    for i, k in enumerate(keys):
        lo, hi = k[0], k[-1]
        for j, other in enumerate(keys):
            if j != i:
                assert not any(lo < key < hi for key in other)
    padded = sum(len(b) * (src[b].max() + tgt[b].max()) for b in batches)
    rng = np.random.default_rng(0)
    perm = rng.permutation(300)
    random_padded = sum(10 * (src[perm[i:i + 10]].max() + tgt[perm[i:i + 10]].max()) for i in range(0, 300, 10))
    assert padded < 0.8 * random_padded


def test_no_shuffle_keeps_data_order_within_buckets():
    src, tgt = [5, 4, 3, 2, 1, 9], [1, 1, 1, 1, 1, 1]
    s = BatchSampler(src, tgt, batch_size=2, shuffle=False, bucket_size=3, seed=7)
    assert [b.tolist() for b in s] == [[2, 1], [0, 4], [3, 5]]
    s.set_epoch(4)
    assert [b.tolist() for b in s] == [[2, 1], [0, 4], [3, 5]]


def test_single_example_longer_than_max_tokens_gets_its_own_batch():
    s = BatchSampler([2, 50, 2, 2], [2, 50, 2, 2], max_tokens=16, shuffle=False)
    batches = sorted(b.tolist() for b in s)
    assert [1] in batches
    assert sorted(sum(batches, [])) == [0, 1, 2, 3]


def test_resume_mid_epoch_continues_bit_for_bit():
    src, tgt = random_lengths(100, 2)
    s = BatchSampler(src, tgt, max_tokens=120, seed=11, bucket_size=32)
    s.set_epoch(3)
    full = [b.tolist() for b in s]
    it = iter(s)
    head = [next(it).tolist() for _ in range(4)]
    state = json.loads(json.dumps(s.state_dict()))          # must survive a JSON checkpoint
    assert state["epoch"] == 3 and state["batches_done"] == 4
    fresh = BatchSampler(src, tgt, max_tokens=120, seed=11, bucket_size=32)
    fresh.load_state_dict(state)
    fresh.set_epoch(3)                                       # same epoch: keeps the position
    tail = [b.tolist() for b in fresh]
    assert head + tail == full
    assert [b.tolist() for b in fresh] == full               # the next pass is a whole epoch again
    fresh.set_epoch(4)
    assert fresh.state_dict()["batches_done"] == 0


def test_set_epoch_to_another_epoch_drops_the_restored_position():
    src, tgt = random_lengths(50, 3)
    s = BatchSampler(src, tgt, batch_size=5, seed=1)
    s.load_state_dict({**s.state_dict(), "epoch": 2, "batches_done": 7})
    s.set_epoch(5)
    expected = BatchSampler(src, tgt, batch_size=5, seed=1)
    expected.set_epoch(5)
    assert [b.tolist() for b in s] == [b.tolist() for b in expected]


@pytest.mark.parametrize("change, match", [
    ({"seed": 2}, "seed=2"), ({"batch_size": 8}, "batch_size=8"),
    ({"num_examples": 7}, "num_examples=7"), ({"lengths_crc32": 1}, "lengths_crc32"),
    ({"batches_done": 999}, "batches_done.*999"), ({"epoch": -1}, "epoch"),
])
def test_load_state_dict_rejects_mismatched_states(change, match):
    src, tgt = random_lengths(50, 4)
    s = BatchSampler(src, tgt, batch_size=5, seed=1)
    with pytest.raises(ValueError, match=match):
        s.load_state_dict({**s.state_dict(), **change})
    with pytest.raises(ValueError, match="missing"):
        s.load_state_dict({"epoch": 0})


@pytest.mark.parametrize("args, kwargs, match", [
    (([1, 2], [1, 2]), {}, "exactly one of batch_size and max_tokens"),
    (([1, 2], [1, 2]), {"batch_size": 2, "max_tokens": 10}, "exactly one of batch_size and max_tokens"),
    (([1, 2], [1, 2, 3]), {"batch_size": 2}, "same length, got 2 and 3"),
    (([], []), {"batch_size": 2}, "src_lengths must be a non-empty"),
    (([1, -2], [1, 2]), {"batch_size": 2}, "src_lengths must be a non-empty 1-D sequence of non-negative"),
    (([1, 2], [1.5, 2]), {"batch_size": 2}, "tgt_lengths"),
    (([1, 2], [1, 2]), {"batch_size": 0}, "batch_size must be >= 1"),
    (([1, 2], [1, 2]), {"max_tokens": 2.0}, "max_tokens must be an integer"),
    (([1, 2], [1, 2]), {"batch_size": 2, "bucket_size": 0}, "bucket_size must be >= 1"),
    (([1, 2], [1, 2]), {"batch_size": 2, "seed": -1}, "seed must be >= 0"),
    (([1, 2], [1, 2]), {"batch_size": 2, "shuffle": "yes"}, "shuffle must be a bool"),
])
def test_sampler_rejects_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        BatchSampler(*args, **kwargs)


def test_set_epoch_rejects_negative():
    s = BatchSampler([1], [1], batch_size=1)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        s.set_epoch(-1)


# ---- iterate_batches ---------------------------------------------------------------------

@settings(max_examples=30)
@given(pairs_strategy, st.integers(1, 60), st.integers(0, 100))
def test_iterate_batches_with_max_tokens(pairs, max_tokens, seed):
    sampler = BatchSampler.from_pairs(pairs, max_tokens=max_tokens, seed=seed, bucket_size=8)
    seen = []
    for b in iterate_batches(pairs, sampler, PAD, BOS, EOS):
        assert isinstance(b, Batch)
        if len(b) > 1:   # the budget counts the arrays the model really gets
            assert b.src.size + b.tgt_in.size <= max_tokens
        for row, i in enumerate(b.indices):
            x, y = pairs[i]
            assert b.src[row, :len(x)].tolist() == x
            assert b.tgt_out[row, :len(y) + 1].tolist() == y + [EOS]
        seen += b.indices.tolist()
    assert sorted(seen) == list(range(len(pairs)))


def test_iterate_batches_errors():
    pairs = [([5], [6]), ([7], [8])]
    sampler = BatchSampler.from_pairs(pairs, batch_size=1)
    with pytest.raises(ValueError, match="pairs_ids has 1 pairs but the sampler was built for 2"):
        list(iterate_batches(pairs[:1], sampler, PAD, BOS, EOS))
    with pytest.raises(ValueError, match="sampler must be a BatchSampler"):
        list(iterate_batches(pairs, [[0, 1]], PAD, BOS, EOS))
    with pytest.raises(ValueError, match="pairs_ids must hold at least one pair"):
        BatchSampler.from_pairs([], batch_size=1)
