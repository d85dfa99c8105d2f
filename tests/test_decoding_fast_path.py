"""Decoding without a float64 exp over the vocabulary (kernels/bounded_top.py): the proven bound
on the log-probabilities, held on adversarial logits, and searches on the fast path that choose
the exact path's tokens, redoing a batch exactly where a decision is not certain."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import backend
from npformer import functional as F
from npformer.decoding import FAST_PATH
from npformer.decoding.search import beam_search, greedy_search

from thread_bits import assert_same_bits_on_threads

K = backend.load("numba")                  # the kernels' own module, bounded_top's package
B = K.bounded_top


# -- the bound --------------------------------------------------------------------------------

def test_the_tail_terms_keep_exp32s_bound_on_a_sample_of_arguments():
    """Each entry far below the maximum adds exp32(float32(d)) * (1 + the part float32 rounds
    away) to the sum: within EXP32_REL_ERROR (+ 1e-10 for the first-order correction) of
    exp(d), and at most EXP32_FLOOR from it below -87 (exp32 clamps there). Every 4099th float32
    of [-87, 0], every 7th of [-87, -86] (where the error is largest) and float64 arguments
    that float32 cannot hold, through the kernel itself."""
    top = np.float32(-87.0).view(np.int32)
    bits = np.r_[np.arange(top, np.float32(-0.0).view(np.int32), -4099, dtype=np.int32),
                 np.arange(top, np.float32(-86.0).view(np.int32), -7, dtype=np.int32)]
    rng = np.random.default_rng(0)
    d = np.concatenate([bits.view(np.float32).astype(np.float64), -rng.random(20000) * 87,
                        -87 - rng.random(200) * 700, [-np.inf]])
    terms = np.array([B._tail_sum(np.array([v]), 0.0, 1.0)[0] for v in d])   # each d alone
    exact = np.exp(d)
    within = np.abs(terms - exact) <= (B.EXP32_REL_ERROR + 1e-10) * exact
    floor = (d < -87) & (np.abs(terms - exact) <= B.EXP32_FLOOR)
    assert (within | floor).all(), d[~(within | floor)][:5]



def test_exp32_keeps_its_bound_through_the_vector_loop_here():
    """The once-per-process check the fast path runs before trusting exp32 (whole rows through
    ``_tail_sum``'s vector loop, as compiled on this machine) holds here: the fast path is on."""
    assert B.exp32_worst_error() <= B.EXP32_REL_ERROR
    assert B.exp32_within_bound()


def test_where_exp32_exceeds_its_bound_every_decision_comes_from_the_exact_path(monkeypatch):
    """A machine whose compiled exp32 errs beyond EXP32_REL_ERROR: one warning, no row is sure,
    and greedy and beam search return the exact path's tokens and probabilities to the bit.
    (The compiled kernels read EXP32_REL_ERROR when they compile, so it is never patched.)"""
    monkeypatch.setattr(B, "exp32_worst_error", lambda: 1e-3)
    monkeypatch.setattr(B, "_exp32_checked", [])
    with pytest.warns(nf.runtime.NpformerRuntimeWarning, match="fast top log-softmax is off"):
        assert not B.exp32_within_bound()
    ids, logp, err, sure = K.top_log_softmax_bounded(
        np.random.default_rng(0).standard_normal((5, 40)).astype(np.float32), 3)
    assert not sure.any()
    model, src = make_model(1), sources(1)
    for beams in (1, 3):
        fast, exact = search(model, src, beams, False), search(model, src, beams, True)
        assert [(h.ids, h.probs, h.score) for h in fast] == \
            [(h.ids, h.probs, h.score) for h in exact]


def _adversarial_rows(data, dtype):
    """Rows a search could meet at its worst: near-ties down to one ulp, values near float32's
    largest and smallest, huge spreads, -inf entries (``<pad>``, ``<bos>``), rows all equal."""
    n, vocab = data.draw(st.integers(1, 6)), data.draw(st.integers(2, 300))
    kind = data.draw(st.sampled_from(["ulp", "huge", "tiny", "spread", "equal", "normal"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal((n, vocab)) * 4
    if kind == "ulp":                          # neighbours one ulp apart around the maximum
        x = np.round(x, 1).astype(dtype)
        top = x.argmax(axis=1)
        for r, c in enumerate(top):
            steps = np.arange(1, 1 + min(5, vocab - 1))
            cols = (c + steps) % vocab
            x[r, cols] = np.nextafter(x[r, c], -np.inf) if rng.random() < 0.5 else x[r, c]
            x[r, cols[1:]] = [np.nextafter(x[r, cols[0]], -np.inf)] * (len(cols) - 1)
    elif kind == "huge":
        x = np.sign(x) * np.finfo(np.float32).max * rng.random((n, vocab)) ** 0.01
    elif kind == "tiny":
        x = x * 1e-38
    elif kind == "spread":
        x = x * 10.0 ** rng.integers(0, 37, (n, vocab))
    elif kind == "equal":
        x = np.full((n, vocab), x[0, 0])
    x = x.astype(dtype)
    x[:, rng.integers(0, vocab, 2)] = -np.inf
    return x


@settings(deadline=None, max_examples=150)
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64]),
       top=st.integers(1, 12), offset=st.sampled_from([None, "scores", "dead"]))
def test_sure_rows_are_the_references_ids_and_within_the_bound(data, dtype, top, offset):
    """Where ``top_log_softmax_bounded`` says a row is sure, its ids are the reference's, in the
    reference's order, and every log-probability is within its ``err`` of the reference's;
    ``err`` is never above the bound any row can get (``lse_error_bound``)."""
    x = _adversarial_rows(data, dtype)
    n, vocab = x.shape
    top = min(top, vocab)
    off = off_err = None
    if offset is not None:
        rng = np.random.default_rng(n * vocab)
        off = rng.integers(-40, 1, n) * 0.37
        off_err = rng.random(n) * 1e-6
        if offset == "dead":
            off[rng.random(n) < 0.5] = -np.inf
            off_err[off == -np.inf] = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        ids_ref, logp_ref = F.top_log_softmax(x, top, off)
    ids, logp, err, sure = K.top_log_softmax_bounded(x, top, off, off_err)
    np.testing.assert_array_equal(ids[sure], ids_ref[sure])
    with np.errstate(invalid="ignore"):                   # -inf - -inf: the same -inf
        apart = np.where(logp == logp_ref, 0.0, np.abs(logp - logp_ref))
    assert (apart[sure] <= err[sure]).all()
    likely = sure[:, None] & (logp >= -700)               # a probability float64 can hold
    assert (err[likely] <= B.lse_error_bound(vocab)).all()
    # rows of ordinary logits (distinct finite values of moderate size) are all sure
    for r, row in enumerate(x.astype(np.float64)):
        values = row[np.isfinite(row)]
        if len(np.unique(values)) == len(values) > 1 and 1e-3 < np.ptp(values) < 1e3:
            assert sure[r], row


def test_a_row_that_is_a_nan_or_all_the_same_is_not_sure():
    x = np.zeros((3, 6), dtype=np.float32)
    x[1, 2] = np.nan
    x[2] = np.arange(6)
    _, _, _, sure = K.top_log_softmax_bounded(x, 2)
    assert sure.tolist() == [False, False, True]          # row 0: a tie at the cut


def test_the_bound_on_real_logits_is_far_below_the_bound_of_any_row():
    """A row whose mass sits near its maximum gets the float32 error only on the tail's share:
    on rows shaped as a trained model's (a few large logits, thousands near zero) the bound is
    a small part of the one any row may get, and the values are within it."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 5921)) * 1.5).astype(np.float32)
    x[:, :8] += 12
    off = -rng.random(64) * 20
    ids_ref, logp_ref = F.top_log_softmax(x, 10, off)
    ids, logp, err, sure = K.top_log_softmax_bounded(x, 10, off)
    assert sure.all()
    np.testing.assert_array_equal(ids, ids_ref)
    assert (np.abs(logp - logp_ref) <= err).all()
    assert err.max() < B.lse_error_bound(5921) / 10


def test_the_fast_path_gives_the_same_bits_on_any_thread_count():
    """Its parts of rows are fixed by the shape, each row's arithmetic by the row alone: the
    workers that share them change nothing."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((100, 700)) * 3).astype(np.float32)
    off = -rng.random(100) * 9
    assert_same_bits_on_threads(lambda: K.top_log_softmax_bounded(x, 10, off, off * 1e-9))


# -- the searches -----------------------------------------------------------------------------

V_SRC, V_TGT = 12, 14


def make_model(seed):
    return nf.Transformer(V_SRC, V_TGT, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=1,
                          n_decoder_layers=2, dropout=0.0, max_len=24, seed=seed,
                          dtype=np.float32).eval()


def sources(seed, b=5, s=6):
    rng = np.random.default_rng(seed)
    src = rng.integers(4, V_SRC, size=(b, s))
    for row, n in zip(src, rng.integers(1, s + 1, size=b)):
        row[n:] = 0
    return src


def search(model, src, beams, exact):
    state = model.decoder_state(src, bos_id=1, eos_id=2, beams=beams, capacity=12, exact=exact)
    assert state.exact is exact
    return greedy_search(state) if beams == 1 else beam_search(state, beams, 0.6)


def same_tokens_probs_within_the_bound(fast, exact):
    assert [(h.ids, h.finished) for h in fast] == [(h.ids, h.finished) for h in exact]
    bound = B.lse_error_bound(V_TGT)
    for f, e in zip(fast, exact):
        np.testing.assert_allclose(np.log(f.probs), np.log(e.probs), rtol=0, atol=bound)
        assert abs(f.score - e.score) <= len(f.probs) * bound


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("beams", [1, 3, 5])
def test_fast_and_exact_searches_choose_the_same_tokens_on_small_models(seed, beams):
    """Greedy and beam search on the fast path (the Numba backend's default) against the exact
    path: the same tokens and ends; probabilities and scores within the bound."""
    model = make_model(seed)
    model.generator.bias.data[2] += np.random.default_rng(seed).normal(0, 2)   # <eos> varies
    src = sources(seed)
    assert model.decoder_state(src, 1, 2).exact is False          # the default on Numba
    same_tokens_probs_within_the_bound(search(model, src, beams, False),
                                       search(model, src, beams, True))


def tied_model(seed):
    """A model whose tokens 5 and 6 are one token under two ids (the same embedding, the same
    generator row) and likely: two prefixes ending in them have the same score and the same
    next logits, a tie across rows that the bounds cannot order."""
    model = make_model(seed)
    emb, gen = model.tgt_embed.weight.data, model.generator
    emb[6] = emb[5]
    gen.weight.data[6], gen.bias.data[6] = gen.weight.data[5], gen.bias.data[5]
    gen.bias.data[[5, 6]] += 4.0
    return model


def test_a_beam_search_forced_into_ties_across_rows_is_redone_exactly():
    """Ties across a source's rows (tokens 5 and 6 are one token): the fast path cannot order
    them and redoes the batch on the exact path (counted), whose tokens it then returns, those
    of the exact search."""
    model, src = tied_model(3), sources(3)
    FAST_PATH.reset()
    fast = search(model, src, 4, False)
    assert FAST_PATH.searches == 1 and FAST_PATH.fallbacks == 1
    exact = search(model, src, 4, True)
    assert [(h.ids, h.probs, h.score, h.finished) for h in fast] == \
        [(h.ids, h.probs, h.score, h.finished) for h in exact]


def test_a_fast_path_as_wrong_as_its_bound_allows_still_gives_the_exact_tokens(monkeypatch):
    """The searches' checks, against a fast path as bad as its bound lets it be: every
    log-probability off by its whole (here inflated) bound, up on odd rows and down on even
    ones, which flips the order of the tied rows. The search notices, redoes the batch exactly
    and returns the exact tokens (without the checks it returns others)."""
    real = K.top_log_softmax_bounded

    def worst(logits, n, offset=None, offset_err=None):
        ids, _, _, sure = real(logits, n, offset, offset_err)
        exact = np.take_along_axis(F.log_softmax(logits.astype(np.float64)), ids, axis=1)
        err = np.where(np.isfinite(exact), 1e-3, 0.0)
        sign = np.where(np.arange(len(ids)) % 2, 1.0, -1.0)[:, None]
        return ids, exact + np.where(err > 0, sign * err, 0.0), err, sure

    monkeypatch.setattr(K, "top_log_softmax_bounded", worst)
    for seed in range(3):
        model, src = tied_model(seed), sources(seed)
        FAST_PATH.reset()
        fast = search(model, src, 4, False)
        assert FAST_PATH.fallbacks == 1
        exact = search(model, src, 4, True)
        assert [(h.ids, h.probs, h.score) for h in fast] == \
            [(h.ids, h.probs, h.score) for h in exact]


def test_rows_the_fast_path_cannot_rank_are_taken_exactly_without_a_redo():
    """A generator that gives every token the same logit: each row's best is a tie at the cut,
    so the state takes those rows from the exact path on the spot (counted), and greedy's
    tokens are the exact path's, with no search redone."""
    model, src = make_model(0), sources(0)
    model.generator.weight.data[:] = 0
    model.generator.bias.data[:] = 0
    FAST_PATH.reset()
    fast = search(model, src, 1, False)
    assert FAST_PATH.exact_rows > 0 and FAST_PATH.fallbacks == 0
    exact = search(model, src, 1, True)
    assert [(h.ids, h.probs) for h in fast] == [(h.ids, h.probs) for h in exact]


def test_exact_false_is_refused_on_a_backend_without_the_fast_path():
    model = make_model(0)
    before = nf.get_backend()
    nf.set_backend("numpy")
    try:
        with pytest.raises(ValueError, match="exact"):
            model.decoder_state(sources(0), 1, 2, exact=False)
        assert model.decoder_state(sources(0), 1, 2).exact is True
    finally:
        nf.set_backend(before)
