"""Search strategies over a decoder state: greedy, sampling, beam.

A decoder state (``Transformer.decoder_state(src, bos_id, eos_id, beams)``, or a language
model's state prefilled with a prompt) offers ``first_tokens()``, ``step(tokens) -> (R, V)
log-probabilities``, ``reorder(rows)``, ``batch_size`` (R rows), ``capacity`` (positions it
can hold), ``beams`` (rows per source) and ``eos_id`` (None: never stops by itself). The searches
read nothing else: no layer, no vocabulary, no source. Each returns one ``Hypothesis`` per
source: the generated ids (without ``<bos>``/``<eos>``), the probability of every chosen token
(``<eos>`` included, when it was produced) and the total log-probability.

    hyps = greedy_search(model.decoder_state(src, bos_id=1, eos_id=2))
    hyps = beam_search(model.decoder_state(src, 1, 2, beams=4), beam_size=4, length_penalty=0.6)
    hyps = sample_search(model.decoder_state(src, 1, 2), temperature=0.8, top_k=5, rng=rng)
    hyps = sample_search(gpt.decoder_state(prompt_ids), temperature=0.8, top_p=0.9, rng=rng)
"""
from dataclasses import dataclass, field

import numpy as np

from ..validation import check_int, check_real

LENGTH_PENALTY = 0.6        # beam search's default alpha (GNMT's value), also the CLI's default


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


def _finish(out_ids, out_probs, done):
    hyps = []
    for ids, probs, d in zip(out_ids, out_probs, done):
        score = float(np.sum(np.log(np.maximum(probs, 1e-300)))) if probs else 0.0
        hyps.append(Hypothesis(ids=ids, probs=probs, score=score, finished=bool(d)))
    return hyps


def _generate(state, choose, max_new_tokens):
    """Shared loop of greedy and sampling: ``choose(logp (R, V)) -> ids (R,)``."""
    if state.beams != 1:
        raise ValueError(f"state: expected one row per source for greedy or sampling, got "
                         f"beams={state.beams}")
    max_new = _check_max_new(state, max_new_tokens)
    b, eos_id = state.batch_size, state.eos_id
    prev = state.first_tokens()
    done = np.zeros(b, dtype=bool)
    out_ids = [[] for _ in range(b)]
    out_probs = [[] for _ in range(b)]
    rows = np.arange(b)                           # sources still running, in state order
    for _ in range(max_new):
        logp = state.step(prev)                   # (R_running, V)
        nxt = choose(logp)
        p = np.exp(logp[np.arange(len(nxt)), nxt])
        for r, tok, prob in zip(rows, nxt, p):
            out_probs[r].append(float(prob))
            if tok == eos_id:
                done[r] = True
            else:
                out_ids[r].append(int(tok))
        keep = ~done[rows]
        if not keep.any():
            break
        if not keep.all():                        # drop finished sources from the batch
            state.reorder(np.flatnonzero(keep))
            rows, nxt = rows[keep], nxt[keep]
        prev = nxt
    return _finish(out_ids, out_probs, done)


def greedy_search(state, max_new_tokens=None):
    """The most probable token at every step. Returns one hypothesis per row of ``state``."""
    return _generate(state, lambda logp: logp.argmax(axis=-1), max_new_tokens)


def sample_search(state, temperature=1.0, top_k=None, rng=None, max_new_tokens=None, top_p=None):
    """Draw each token from softmax(logits / temperature), optionally among the ``top_k`` best
    and then among the smallest set of best tokens whose probability reaches ``top_p``
    (nucleus sampling; the best token is always kept), in that order, as Hugging Face's
    ``generate``.

    ``probs`` of the hypotheses are those of the model (temperature 1), not of the sampler.
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

    return _generate(state, choose, max_new_tokens)


def length_penalty_gnmt(length, alpha):
    """GNMT's ((5 + length) / 6) ** alpha; scores are divided by it (alpha 0: no penalty)."""
    return ((5.0 + length) / 6.0) ** alpha


def _top_candidates(cand, n):
    """Column indices of the ``n`` largest entries of each row of ``cand`` (B, M), best first,
    ties by index. ``argpartition`` finds them in O(M), then only those n are sorted."""
    n = min(n, cand.shape[1])
    part = np.argpartition(-cand, n - 1, axis=1)[:, :n]                  # (B, n), unordered
    vals = np.take_along_axis(cand, part, axis=1)
    order = np.lexsort((part, -vals), axis=1)                            # by score, then index
    return np.take_along_axis(part, order, axis=1)


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
    """
    beam_size = check_int("beam_size", beam_size)
    if state.beams != beam_size:
        raise ValueError(f"beam_size: expected the state's {state.beams} rows per source "
                         f"(build it with beams={beam_size}), got {beam_size}")
    if state.eos_id is None:
        raise ValueError("state: beam search needs an end-of-sequence id (eos_id is None)")
    length_penalty = check_real("length_penalty", length_penalty, minimum=0)
    max_new = _check_max_new(state, max_new_tokens)
    k, eos_id = beam_size, state.eos_id
    b = state.batch_size // k
    active = np.arange(b)                        # sources still searching, k rows each
    # only the first beam of each source is live at the start (the others are copies)
    scores = np.tile(np.r_[0.0, np.full(k - 1, -np.inf)], b)             # (A*K,)
    seqs = [[] for _ in range(b * k)]
    probs = [[] for _ in range(b * k)]
    prev = state.first_tokens()
    finished = [[] for _ in range(b)]                                    # (norm score, ids, probs)
    bound_norm = length_penalty_gnmt(max_new, length_penalty)

    for t in range(max_new):
        a = len(active)
        logp = state.step(prev)                                          # (A*K, V)
        v = logp.shape[1]
        cand = (scores[:, None] + logp).reshape(a, k * v)                # (A, K*V)
        top = _top_candidates(cand, 2 * k)                               # (A, 2K) best first
        new_rows, new_tok, new_scores = [], [], []
        for j in range(a):
            s, kept = active[j], 0
            for c in top[j]:
                score = cand[j, c]
                if score == -np.inf:
                    break
                row, tok = j * k + c // v, int(c % v)
                if tok == eos_id:
                    norm = score / length_penalty_gnmt(t + 1, length_penalty)
                    finished[s].append((norm, list(seqs[row]),
                                        probs[row] + [float(np.exp(logp[row, tok]))]))
                    continue
                new_rows.append(row)
                new_tok.append(tok)
                new_scores.append(score)
                kept += 1
                if kept == k:
                    break
            while kept < k:                                              # pad with dead beams
                new_rows.append(j * k)
                new_tok.append(eos_id)
                new_scores.append(-np.inf)
                kept += 1
        new_rows = np.array(new_rows)
        probs = [probs[r] + [float(np.exp(logp[r, tok]))] for r, tok in zip(new_rows, new_tok)]
        seqs = [seqs[r] + [tok] for r, tok in zip(new_rows, new_tok)]
        scores = np.array(new_scores)
        # a sentence is done when K hypotheses are finished and no open beam can beat the best:
        # log-probabilities only fall, and with alpha >= 0 the best possible normaliser is the
        # largest length still reachable
        best_open = scores.reshape(a, k).max(axis=1)                     # (A,)
        keep = np.ones(a, dtype=bool)
        for j in range(a):
            f = finished[active[j]]
            if (len(f) >= k and max(x[0] for x in f) >= best_open[j] / bound_norm) \
                    or not np.isfinite(best_open[j]):
                keep[j] = False
        if not keep.any():
            active = active[:0]
            break
        if not keep.all():                       # drop finished sentences from the batch
            rows = np.flatnonzero(np.repeat(keep, k))                    # (A'*K,)
            new_rows, scores = new_rows[rows], scores[rows]
            seqs, probs = [seqs[r] for r in rows], [probs[r] for r in rows]
            new_tok = [new_tok[r] for r in rows]
            active = active[keep]
        state.reorder(new_rows)
        prev = np.array(new_tok, dtype=np.int64)

    open_best = {}                               # sentences that ran out of room
    for j, s in enumerate(active):
        row = j * k + int(np.argmax(scores[j * k:(j + 1) * k]))
        open_best[s] = row
    hyps = []
    for s in range(b):
        if finished[s]:
            norm, ids, p = max(finished[s], key=lambda f: f[0])
            hyps.append(Hypothesis(ids=ids, probs=p, score=float(norm), finished=True))
        else:
            row = open_best[s]
            hyps.append(Hypothesis(ids=seqs[row], probs=probs[row], score=float(scores[row]),
                                   finished=False))
    return hyps
