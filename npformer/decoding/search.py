"""Search strategies over a decoder state: greedy, sampling, beam.

A decoder state (``Transformer.decoder_state(src, bos_id, eos_id, beams)``, or a language
model's state prefilled with a prompt) offers ``first_tokens()``, ``step(tokens) -> (R, V)
log-probabilities``, ``reorder(rows)``, ``batch_size`` (R rows), ``capacity`` (positions it
can hold), ``beams`` (rows per source) and ``eos_id`` (None: never stops by itself; greedy and
sampling also take a tuple of ids, stopping at any of them, as Llama 3's); it may also
offer ``step_top(tokens, n, offset) -> ids (R, n), log-probabilities (R, n)``, a step that
returns only each row's n best next tokens (by ``offset[r] + log p``, ties by the lower id),
which greedy and beam search then use instead of ``step``. A state with ``exact = False``
offers instead ``step_top_bounded(tokens, n, offset, offset_err) -> ids, logp, err, sure``:
the same on a fast path whose log-probabilities carry error bounds ``err`` (``sure`` (R,) says
whether each row's ids and order are certainly the exact path's; ``exact_rows`` counts the
rows the state took from the exact path itself); the searches then carry each hypothesis's
accumulated bound, check that every decision's gaps exceed the bounds, and where one does
not, redo the search from the start on ``state.exact_twin()`` (counted in ``FAST_PATH``):
the tokens are the exact path's either way. The searches read nothing else: no
layer, no vocabulary, no source. Each returns one ``Hypothesis`` per source: the generated ids
(without ``<bos>``/``<eos>``), the probability of every chosen token (``<eos>`` included, when
it was produced) and the total log-probability.

    hyps = greedy_search(model.decoder_state(src, bos_id=1, eos_id=2))
    hyps = beam_search(model.decoder_state(src, 1, 2, beams=4), beam_size=4, length_penalty=0.6)
    hyps = sample_search(model.decoder_state(src, 1, 2), temperature=0.8, top_k=5, rng=rng)
    hyps = sample_search(gpt.decoder_state(prompt_ids), temperature=0.8, top_p=0.9, rng=rng)
"""
from dataclasses import dataclass, field

import numpy as np

from ..validation import check_int, check_real
from .stats import FAST_PATH

LENGTH_PENALTY = 0.6        # beam search's default alpha (GNMT's value), also the CLI's default
ROUNDING = 2.0 ** -50       # a generous multiple of float64's unit roundoff, for the bounds


class _Unsure(Exception):
    """A decision of a search on the fast path that the error bounds cannot settle."""


def _fast(state):
    """Whether the state runs on the fast path (``step_top_bounded``, error bounds)."""
    return getattr(state, "exact", True) is False


def _with_fallback(search, state):
    """``search(state)``; on a fast state, redone from the start on ``state.exact_twin()`` if
    a decision turns out not to be certain (the tokens are then the exact path's)."""
    if not _fast(state):
        return search(state)
    FAST_PATH.searches += 1
    try:
        return search(state)
    except _Unsure:
        FAST_PATH.fallbacks += 1
        return search(state.exact_twin())
    finally:
        FAST_PATH.exact_rows += getattr(state, "exact_rows", 0)


@dataclass
class Hypothesis:
    ids: list                                   # generated ids, no <bos>/<eos>
    probs: list = field(default_factory=list)   # probability of each chosen token (+ <eos>)
    score: float = 0.0                          # sum of log-probabilities (beam: length-normalised)
    finished: bool = True                       # False if max_new_tokens ran out before <eos>


def _check_max_new(state, max_new_tokens):
    """How many tokens a search may add: ``max_new_tokens``, at most the state's room (a state
    that slides over its context has no limit, so it needs the number)."""
    room = None if getattr(state, "slide", False) else state.capacity - state.length
    if max_new_tokens is None:
        if room is None:
            raise ValueError("max_new_tokens: expected a number of tokens for a state that slides "
                             "past its context (it has no end of its own), got None")
        return room
    max_new = check_int("max_new_tokens", max_new_tokens)
    if room is not None and max_new > room:
        raise ValueError(f"max_new_tokens: expected at most {room} (the state's capacity "
                         f"{state.capacity} less the {state.length} positions it holds), got "
                         f"{max_new}")
    return max_new


def _generate(state, next_tokens, max_new_tokens, in_order=False, on_step=None):
    """Shared loop of greedy and sampling: ``next_tokens(state, prev (R,)) -> ids (R,), their
    log-probabilities (R,)`` runs one step of the state and chooses; ``on_step(sources, ids)``,
    where given, hears each step's choices (the sources still running, an end token included) as
    they are made, to print them before the search ends. Finished sources leave the
    state's batch; the last running ones take their rows (:func:`_compacted`), unless
    ``in_order`` (sampling: the rows draw from one random stream in row order, so sources keep
    their order and a seeded run samples what it sampled before rows were moved this way)."""
    if state.beams != 1:
        raise ValueError(f"state: expected one row per source for greedy or sampling, got "
                         f"beams={state.beams}")
    max_new = _check_max_new(state, max_new_tokens)
    b, eos_id = state.batch_size, state.eos_id
    ends = () if eos_id is None else eos_id          # one id, or several (Llama 3: any of them)
    prev = state.first_tokens()
    done = np.zeros(b, dtype=bool)
    tokens = np.zeros((b, max_new), dtype=np.int64)   # what each source chose at each step
    probs = np.zeros((b, max_new))                    # ... and its probability
    steps = np.zeros(b, dtype=np.int64)               # steps each source took (<eos> included)
    rows = np.arange(b)                               # sources still running, in state order
    for t in range(max_new):
        nxt, logp = next_tokens(state, prev)          # (R_running,) each
        tokens[rows, t], probs[rows, t] = nxt, np.exp(logp)
        steps[rows] += 1
        if on_step is not None:
            on_step(rows.copy(), nxt.copy())
        done[rows] = np.isin(nxt, ends)
        keep = ~done[rows]
        if not keep.any():
            break
        if not keep.all():                            # drop finished sources from the batch
            index = np.flatnonzero(keep) if in_order else _compacted(keep)
            state.reorder(index)
            rows, nxt = rows[index], nxt[index]
        prev = nxt
    taken = np.arange(probs.shape[1]) < steps[:, None]           # (B, max_new)
    scores = np.where(taken, np.log(np.maximum(probs, 1e-300)), 0.0).sum(axis=1)
    return [Hypothesis(ids=tokens[r, :n - d].tolist(), probs=probs[r, :n].tolist(),
                       score=float(scores[r]), finished=bool(d))
            for r, (n, d) in enumerate(zip(steps.tolist(), done.tolist()))]


def _compacted(keep):
    """The rows ``keep`` (R,) bool marks, as a ``reorder`` index that moves as few cached rows
    as it can: a kept row among the first ``keep.sum()`` stays where it is, and the kept rows
    after those fill, in order, the places of the dropped ones."""
    n = int(keep.sum())
    index = np.arange(n)
    index[np.flatnonzero(~keep[:n])] = np.flatnonzero(keep[n:]) + n
    return index


def _greedy_tokens(state, prev):
    """The most probable next token of every row (the first on a tie) and its
    log-probability: from the state's ``step_top_bounded`` on the fast path (a row not
    certainly ranked stops the search: ``_Unsure``), its ``step_top`` where it has one (no
    (R, V) array), else from ``step``."""
    if _fast(state):
        ids, logp, _, sure = state.step_top_bounded(prev, 1)
        if not sure.all():
            raise _Unsure
        return ids[:, 0], logp[:, 0]
    if hasattr(state, "step_top"):
        ids, logp = state.step_top(prev, 1)
        return ids[:, 0], logp[:, 0]
    logp = state.step(prev)
    nxt = logp.argmax(axis=-1)
    return nxt, logp[np.arange(len(nxt)), nxt]


def greedy_search(state, max_new_tokens=None, on_step=None):
    """The most probable token at every step. Returns one hypothesis per row of ``state``.
    ``on_step(sources, ids)`` hears every step's choices as they are made (on a fast state
    that redoes a search exactly, the choices of the redone steps again)."""
    return _with_fallback(
        lambda s: _generate(s, _greedy_tokens, max_new_tokens, on_step=on_step), state)


def sample_search(state, temperature=1.0, top_k=None, rng=None, max_new_tokens=None, top_p=None,
                  on_step=None):
    """Draw each token from softmax(logits / temperature), optionally among the ``top_k`` best
    and then among the smallest set of best tokens whose probability reaches ``top_p``
    (nucleus sampling; the best token is always kept), in that order, as Hugging Face's
    ``generate``.

    ``probs`` of the hypotheses are those of the model (temperature 1), not of the sampler.
    ``on_step(sources, ids)`` hears every step's choices as they are made.
    """
    temperature = check_real("temperature", temperature, minimum=0, min_open=True)
    top_k = check_int("top_k", top_k, allow_none=True)
    if top_p is not None:
        top_p = check_real("top_p", top_p, minimum=0, min_open=True, maximum=1)
    if rng is None:
        rng = np.random.default_rng()
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")

    def choose(logp):                                    # (B, V) -> (B,)
        z = logp / temperature
        if top_k is not None and top_k < z.shape[1]:
            kth = np.partition(z, -top_k, axis=1)[:, -top_k][:, None]
            z = np.where(z >= kth, z, -np.inf)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        if top_p is not None and top_p < 1:
            order = np.argsort(-p, axis=1, kind="stable")               # best first
            sorted_p = np.take_along_axis(p, order, axis=1)
            before = np.cumsum(sorted_p, axis=1) - sorted_p             # mass of the better ones
            drop = np.zeros_like(p, dtype=bool)
            np.put_along_axis(drop, order, before >= top_p, axis=1)     # the nucleus is reached
            p = np.where(drop, 0.0, p)
            p /= p.sum(axis=1, keepdims=True)
        u = rng.random((p.shape[0], 1))
        return np.minimum((np.cumsum(p, axis=1) < u).sum(axis=1), p.shape[1] - 1)

    def next_tokens(state, prev):
        logp = state.step(prev)                          # (R, V)
        nxt = choose(logp)
        return nxt, logp[np.arange(len(nxt)), nxt]

    return _generate(state, next_tokens, max_new_tokens, in_order=True, on_step=on_step)


def length_penalty_gnmt(length, alpha):
    """GNMT's ((5 + length) / 6) ** alpha; scores are divided by it (alpha 0: no penalty)."""
    return ((5.0 + length) / 6.0) ** alpha


def check_beam_size(beam_size, vocab_size):
    """``beam_size`` as an int in [1, vocab_size]: more beams than tokens buys nothing."""
    beam_size = check_int("beam_size", beam_size)
    if beam_size > vocab_size:
        raise ValueError(f"beam_size: expected at most the target vocabulary size {vocab_size}, "
                         f"got {beam_size}")
    return beam_size


def beam_search(state, beam_size=4, length_penalty=LENGTH_PENALTY, max_new_tokens=None):
    """Keep the ``beam_size`` best prefixes per source; return the best finished one.

    ``state`` holds ``beam_size`` rows per source (``beams=beam_size``). Finished hypotheses
    are ranked by log-probability / ``length_penalty_gnmt(len, alpha)`` (length counts the
    ``<eos>``). The prefixes of all running sources go as one batch of (running sources *
    beam_size) rows through the state; a source leaves the batch as soon as no open prefix can
    beat its best finished hypothesis.

    One step, for every running source at once (arrays, no loop over sources or hypotheses):
    the (E+1)K best continuations of its K prefixes (ranked by total log-probability, ties by
    the lower prefix row, then the lower token id; with E end ids (one, or several as Llama 3's
    ``eos_id`` tuple) at most EK of them end the sequence, E per prefix, so at least K remain)
    are read best first, as a reader would walk the list: a candidate ending in an end id
    becomes a finished hypothesis, any other the next open prefix, until K prefixes are taken
    (:func:`_walk_candidates`). The (E+1)K best of a source are among the (E+1)K best of each
    of its rows, which the state gives (``step_top``) without writing the rows' whole (V,)
    distributions. Prefixes are rows of two arrays, the tokens and their
    probabilities, gathered by parent row at every step.
    """
    beam_size = check_int("beam_size", beam_size)
    if state.beams != beam_size:
        raise ValueError(f"beam_size: expected the state's {state.beams} rows per source "
                         f"(build it with beams={beam_size}), got {beam_size}")
    if state.eos_id is None:
        raise ValueError("state: beam search needs an end-of-sequence id (eos_id is None)")
    length_penalty = check_real("length_penalty", length_penalty, minimum=0)
    max_new = _check_max_new(state, max_new_tokens)
    return _with_fallback(lambda s: _beam(s, beam_size, length_penalty, max_new), state)


def _beam(state, k, length_penalty, max_new):
    """``beam_search`` on a checked state. On the fast path, every prefix also carries
    ``score_err`` >= |its score - the exact path's| and every source's best finished hypothesis
    ``best_err``; each decision (the order of the best candidates and the cut after them, a
    finished hypothesis against the best one, whether a source is done, the best open prefix
    when the room runs out) must be settled by gaps larger than the bounds, else ``_Unsure``."""
    fast = _fast(state)
    ends = np.atleast_1d(np.asarray(state.eos_id, dtype=np.int64))     # (E,) end ids
    n_best = (len(ends) + 1) * k                 # continuations read per source and step
    b = state.batch_size // k
    active = np.arange(b)                        # sources still searching, k rows each
    # only the first beam of each source is live at the start (the others are copies)
    scores = np.tile(np.r_[0.0, np.full(k - 1, -np.inf)], b)             # (A*K,)
    score_err = np.zeros(b * k)                                          # (A*K,) fast path
    seqs = np.zeros((b * k, 0), dtype=np.int64)                          # (A*K, t) tokens
    seq_probs = np.zeros((b * k, 0))                                     # (A*K, t) their probs
    prev = state.first_tokens()
    # the state's row of each prefix: a source's prefixes sit in its block of K rows in any
    # order, and finished sources' blocks are taken by the last running ones, so that a step
    # moves as few cached rows as it can (_place_prefixes, _compacted); the search itself keeps
    # its sources in order and their prefixes best first
    slot = np.arange(b * k)
    # per source: finished hypotheses so far, and the best one (the first of the highest score)
    n_finished = np.zeros(b, dtype=np.int64)
    best_norm = np.full(b, -np.inf)
    best_err = np.zeros(b)                                               # fast path
    best = [None] * b                                                    # (ids, probs)
    bound_norm = length_penalty_gnmt(max_new, length_penalty)

    for t in range(max_new):
        a = len(active)
        # each row's N = (E+1)K best continuations, then each source's N best of its K rows'
        # (ties: the lower row, then the lower id, as in one list of its K*V continuations)
        if fast:
            ids, logp, err, sure = state.step_top_bounded(
                _in_rows(prev, slot), n_best, _in_rows(scores, slot), _in_rows(score_err, slot))
            if not sure.all():
                raise _Unsure
            err = err[slot]
        else:
            ids, logp = _step_top(state, _in_rows(prev, slot), n_best, _in_rows(scores, slot))
        ids, logp = ids[slot], logp[slot]                                # (A*K, N) each
        n_top = ids.shape[1]
        cand = (scores[:, None] + logp).reshape(a, k * n_top)            # (A, K*N)
        beam = np.repeat(np.arange(k), n_top)                            # (K*N,) row in source
        ids, logp = ids.reshape(a, k * n_top), logp.reshape(a, k * n_top)
        order = np.lexsort((ids, np.broadcast_to(beam, ids.shape), -cand), axis=1)
        top = order[:, :n_best]
        top_scores = np.take_along_axis(cand, top, axis=1)               # (A, N) best first
        top_rows = beam[top] + (np.arange(a) * k)[:, None]               # rows of the state
        top_tok = np.take_along_axis(ids, top, axis=1)
        top_logp = np.take_along_axis(logp, top, axis=1)
        if fast:
            terms_err = np.repeat(score_err, n_top).reshape(a, -1) + err.reshape(a, -1)
            cand_err = _sum_err(cand, terms_err)                         # (A, K*N)
            _check_order(order, n_best, cand, cand_err, beam, logp)
            top_err = np.take_along_axis(cand_err, top, axis=1)
        ended, opens = _walk_candidates(top_scores, np.isin(top_tok, ends), k)

        # candidates ending in <eos>: finished hypotheses; a source's first one this step is its
        # best this step (same length, so the best score has the best normalised score)
        src_pos, cand_pos = np.nonzero(ended)
        if len(src_pos):
            n_finished += np.bincount(active[src_pos], minlength=b)
            first = np.r_[True, src_pos[1:] != src_pos[:-1]]
            src_pos, cand_pos = src_pos[first], cand_pos[first]
            penalty = length_penalty_gnmt(t + 1, length_penalty)
            norms = top_scores[src_pos, cand_pos] / penalty
            norm_errs = (_quotient_err(norms, top_err[src_pos, cand_pos], penalty) if fast
                         else np.zeros(len(norms)))
            if fast:
                _check_apart(norms, norm_errs, best_norm[active[src_pos]],
                             best_err[active[src_pos]])
            better = norms > best_norm[active[src_pos]]          # ties: the earlier one stays
            rows, lps = top_rows[src_pos, cand_pos][better], top_logp[src_pos, cand_pos][better]
            for s, norm, e, row, lp in zip(active[src_pos][better], norms[better],
                                           norm_errs[better], rows, lps):
                best_norm[s], best_err[s] = norm, e
                best[s] = (seqs[row].tolist(), seq_probs[row].tolist() + [float(np.exp(lp))])

        # the K open prefixes of each source, best first; a source with fewer live candidates
        # is padded with dead ones (score -inf, extending its first row by <eos>)
        pick = np.argsort(~opens, axis=1, kind="stable")[:, :k]          # (A, K) positions
        live = np.take_along_axis(opens, pick, axis=1)
        new_rows = np.where(live, np.take_along_axis(top_rows, pick, axis=1),
                            (np.arange(a) * k)[:, None]).reshape(-1)     # (A*K,)
        new_tok = np.where(live, np.take_along_axis(top_tok, pick, axis=1), ends[0]).reshape(-1)
        scores = np.where(live, np.take_along_axis(top_scores, pick, axis=1), -np.inf).reshape(-1)
        if fast:
            score_err = np.where(live, np.take_along_axis(top_err, pick, axis=1), 0.0).reshape(-1)
        new_probs = np.exp(np.take_along_axis(top_logp, pick, axis=1).reshape(-1))
        seqs = np.concatenate([seqs[new_rows], new_tok[:, None]], axis=1)
        seq_probs = np.concatenate([seq_probs[new_rows], new_probs[:, None]], axis=1)
        # a sentence is done when K hypotheses are finished and no open beam can beat the best:
        # log-probabilities only fall, and with alpha >= 0 the best possible normaliser is the
        # largest length still reachable
        best_open = scores.reshape(a, k).max(axis=1)                     # (A,)
        if fast:
            asked = (n_finished[active] >= k) & np.isfinite(best_open)
            limit = best_open[asked] / bound_norm
            _check_apart(best_norm[active][asked], best_err[active][asked], limit,
                         _quotient_err(limit, score_err.reshape(a, k).max(axis=1)[asked],
                                       bound_norm))
        done = ((n_finished[active] >= k) & (best_norm[active] >= best_open / bound_norm)) \
            | ~np.isfinite(best_open)
        if done.all():
            active = active[:0]
            break
        group = slot[::k] // k                   # the block of K rows of each source
        if done.any():                           # drop finished sentences from the batch
            rows = np.flatnonzero(np.repeat(~done, k))                   # (A'*K,)
            new_rows, scores, new_tok = new_rows[rows], scores[rows], new_tok[rows]
            score_err = score_err[rows]
            seqs, seq_probs = seqs[rows], seq_probs[rows]
            kept = np.zeros(len(done), dtype=bool)   # their blocks go to the last running ones
            kept[group] = ~done                  # by block of the state
            blocks = _compacted(kept)            # the old block of each new one
            moved_to = np.empty(len(kept), dtype=np.int64)
            moved_to[blocks] = np.arange(len(blocks))
            active, group = active[~done], moved_to[group[~done]]
        parents = slot[new_rows]                         # the state's rows of the new prefixes'
        slot = _place_prefixes(parents, group, k)
        state.reorder(_in_rows(parents, slot))
        prev = new_tok

    hyps = [None if best[s] is None else
            Hypothesis(ids=best[s][0], probs=best[s][1], score=float(best_norm[s]), finished=True)
            for s in range(b)]
    for j, s in enumerate(active):               # sentences that ran out of room
        if hyps[s] is None:
            block = slice(j * k, (j + 1) * k)
            row = j * k + int(np.argmax(scores[block]))
            if fast:
                others = np.arange(j * k, (j + 1) * k) != row
                _check_apart(np.full(k - 1, scores[row]), np.full(k - 1, score_err[row]),
                             scores[block][others], score_err[block][others])
            hyps[s] = Hypothesis(ids=seqs[row].tolist(), probs=seq_probs[row].tolist(),
                                 score=float(scores[row]), finished=False)
    return hyps


def _sum_err(total, err):
    """A bound on |total - the exact path's| for sums ``total`` of terms whose errors add up to
    ``err``: theirs plus both paths' rounding; 0 where the terms are exact (the same sum on
    both paths) or the total is -inf (on both paths)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(total) & (err > 0),
                        err * (1 + ROUNDING) + ROUNDING * np.abs(total), 0.0)


def _quotient_err(quotient, err, divisor):
    """A bound on |quotient - the exact path's| for ``quotient`` = x / divisor (the same
    divisor on both paths, >= 1) where x is within ``err`` of its exact value (0: exact)."""
    with np.errstate(invalid="ignore"):
        return np.where(err > 0, err / divisor * (1 + ROUNDING) + ROUNDING * np.abs(quotient),
                        0.0)


def _check_apart(x, x_err, y, y_err):
    """``_Unsure`` unless every x and y (arrays of one shape, each within its error of the exact
    path's value) compare as their exact values do: both exact (error 0), -inf on one side or
    both (exact on both paths), or a gap larger than both errors."""
    with np.errstate(invalid="ignore"):
        settled = ((np.abs(x - y) > x_err + y_err) | (x == -np.inf) | (y == -np.inf)
                   | ((x_err == 0) & (y_err == 0)))
    if not settled.all():
        raise _Unsure


def _check_order(order, n, cand, cand_err, beam, logp):
    """``_Unsure`` unless each source's n best candidates (A, M: ``cand`` in the sorted
    ``order``, by score, then row, then id) are certainly the exact path's n best in this order:
    every one before the next, and the n-th before every later one. Candidate p is certainly
    before q when both are exact (error 0: the same values and order on both paths) or -inf,
    when the gap exceeds both errors, or when both come from one row (``beam``) and log p of p
    is not below q's (a sure row of ``step_top_bounded`` is ranked as on the exact path,
    whatever the row's shared error)."""
    c = np.take_along_axis(cand, order, axis=1)
    e = np.take_along_axis(cand_err, order, axis=1)
    r = beam[order]
    lp = np.take_along_axis(logp, order, axis=1)
    n = min(n, c.shape[1])
    pairs = [(slice(0, n - 1), slice(1, n)), (slice(n - 1, n), slice(n, None))]
    for p, q in pairs:
        with np.errstate(invalid="ignore"):
            sure = (((c[:, p] == -np.inf) & (c[:, q] == -np.inf))
                    | ((e[:, p] == 0) & (e[:, q] == 0))
                    | (c[:, p] - c[:, q] > e[:, p] + e[:, q])
                    | ((r[:, p] == r[:, q]) & (lp[:, p] >= lp[:, q])))
        if not sure.all():
            raise _Unsure


def _in_rows(x, slot):
    """Per-prefix values ``x`` (R,) put in the state's row order: out[slot[i]] = x[i]."""
    out = np.empty_like(x)
    out[slot] = x
    return out


def _place_prefixes(parents, group, k):
    """The state's row of each new prefix, given the state's row of each one's parent (R,),
    R = sources * K, each source's K prefixes best first and their parents among its K rows,
    and the block of K rows each source (A,) takes now (``group``: a source whose block is
    freed by finished ones moves to another).

    A parent's first (best) continuation takes the parent's own row, whose cached keys and
    values are then already in place; the other continuations take, in order, the rows whose
    prefix had none. Every row that changes thus takes a row that stays, and the cache moves
    only those (``KVCache.reorder``), where placing the prefixes best first moves most rows.
    """
    place = (parents % k).reshape(-1, k)             # (A, K) the parent's row in its source
    a, rows = len(place), np.arange(len(place))
    taken = np.zeros((a, k), dtype=bool)             # rows a first continuation has taken
    first = np.zeros((a, k), dtype=bool)
    for j in range(k):                               # prefixes best first
        first[:, j] = ~taken[rows, place[:, j]]
        taken[rows, place[:, j]] = True
    later = np.argsort(first, axis=1, kind="stable")     # other continuations first, in order
    free = np.argsort(taken, axis=1, kind="stable")      # rows no continuation took, in order
    pair = np.arange(k) < (~first).sum(axis=1)[:, None]
    place[np.nonzero(pair)[0], later[pair]] = free[pair]
    return (place + (group * k)[:, None]).reshape(-1)


def _step_top(state, prev, n, offset):
    """One step of the state: the ``n`` best next tokens of every row by ``offset[r] + log p``,
    best first, ties by the lower id, and their log-probabilities: ids (R, n), logp (R, n).
    From the state's ``step_top`` where it has one (no (R, V) array), else from ``step``."""
    if hasattr(state, "step_top"):
        return state.step_top(prev, n, offset)
    logp = state.step(prev)                                              # (R, V)
    ids = np.argsort(-(offset[:, None] + logp), axis=1, kind="stable")[:, :n]
    return ids, np.take_along_axis(logp, ids, axis=1)


def _walk_candidates(top_scores, is_eos, k):
    """Which of each source's candidates (A, N), best first, a reader walking the list takes:
    ``ends`` (ending in ``<eos>``: finished) and ``opens`` (the open prefixes, at most K). The
    walk stops at the first dead candidate (score -inf) or once K open prefixes are taken, so
    an ``<eos>`` candidate counts only if it comes before the K-th open one."""
    alive = top_scores > -np.inf
    extends = alive & ~is_eos
    opened_before = np.cumsum(extends, axis=1) - extends       # open prefixes taken before each
    walked = alive & (opened_before < k)
    return walked & is_eos, walked & ~is_eos
