"""Search strategies over a Transformer's next-token distribution: greedy, sampling, beam.

Each takes a padded source batch ``src`` (B, S) and returns one ``Hypothesis`` per sentence:
the generated ids (without ``<bos>``/``<eos>``), the probability of every chosen token
(``<eos>`` included, when it was produced) and the total log-probability.

    hyps = greedy_decode(model, src)                  # KV-cached, batched
    hyps = beam_search(model, src, beam_size=4, length_penalty=0.6)
    hyps = sample_decode(model, src, temperature=0.8, top_k=5, rng=np.random.default_rng(0))
"""
from dataclasses import dataclass, field

import numpy as np

from .. import functional as F
from ..validation import check_int, check_real, check_token_ids
from .cache import IncrementalDecoder

BOS_ID, EOS_ID = 1, 2
LENGTH_PENALTY = 0.6        # beam search's default alpha (GNMT's value), also the CLI's default


@dataclass
class Hypothesis:
    ids: list                                   # generated ids, no <bos>/<eos>
    probs: list = field(default_factory=list)   # probability of each chosen token (+ <eos>)
    score: float = 0.0                          # sum of log-probabilities (beam: length-normalised)
    finished: bool = True                       # False if max_new_tokens ran out before <eos>


def _check_src(model, src):
    return check_token_ids("src", src, model.config.src_vocab_size, model.max_len)


def default_max_new_tokens(model, src):
    """Room for 2 * S + 10 tokens, capped by the model's positional table."""
    return int(min(model.max_len, 2 * src.shape[1] + 10))


def _check_max_new(model, src, max_new_tokens):
    if max_new_tokens is None:
        return default_max_new_tokens(model, src)
    if not isinstance(max_new_tokens, (int, np.integer)) or not 1 <= max_new_tokens <= model.max_len:
        raise ValueError(f"max_new_tokens: expected an integer in [1, max_len={model.max_len}], "
                         f"got {max_new_tokens!r}")
    return int(max_new_tokens)


def _log_softmax(logits, banned):
    """(B, V) -> (B, V) float64 log-probabilities; ``banned`` ids (<pad>, <bos>) get -inf:
    they are never a valid next token (and a generated <pad> would be masked out as a key)."""
    logits = logits.astype(np.float64)                 # a copy, even if already float64
    logits[:, banned] = -np.inf
    return F.log_softmax(logits)


def _finish(out_ids, out_probs, done):
    hyps = []
    for ids, probs, d in zip(out_ids, out_probs, done):
        score = float(np.sum(np.log(np.maximum(probs, 1e-300)))) if probs else 0.0
        hyps.append(Hypothesis(ids=ids, probs=probs, score=score, finished=bool(d)))
    return hyps


def _generate(model, src, choose, max_new_tokens, bos_id, eos_id):
    """Shared loop of greedy and sampling: ``choose(logp (B, V)) -> ids (B,)``."""
    src = _check_src(model, src)
    max_new = _check_max_new(model, src, max_new_tokens)
    b = src.shape[0]
    state = IncrementalDecoder(model).start(src)
    prev = np.full(b, bos_id, dtype=np.int64)
    done = np.zeros(b, dtype=bool)
    out_ids = [[] for _ in range(b)]
    out_probs = [[] for _ in range(b)]
    rows = np.arange(b)                           # sentences still running, in state order
    for _ in range(max_new):
        logp = _log_softmax(state.step(prev), [model.pad_id, bos_id])    # (B_running, V)
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
        if not keep.all():                        # drop finished sentences from the batch
            state.reorder(np.flatnonzero(keep))
            rows, nxt = rows[keep], nxt[keep]
        prev = nxt
    return _finish(out_ids, out_probs, done)


def greedy_decode(model, src, max_new_tokens=None, bos_id=BOS_ID, eos_id=EOS_ID):
    """Most probable token at every step, with the key/value cache. src (B, S) -> B hypotheses."""
    return _generate(model, src, lambda logp: logp.argmax(axis=-1), max_new_tokens, bos_id, eos_id)


def greedy_decode_uncached(model, src, max_new_tokens=None, bos_id=BOS_ID, eos_id=EOS_ID):
    """Reference greedy: re-run ``model.decode`` on the whole growing prefix at every step.

    Slow (quadratic), for tests and teaching: ``greedy_decode`` must give the same tokens.
    """
    src = _check_src(model, src)
    max_new = _check_max_new(model, src, max_new_tokens)
    was_training = model.training
    model.eval()
    try:
        memory, src_mask = model.encode(src)
        ys = np.full((src.shape[0], 1), bos_id, dtype=np.int64)       # (B, t)
        probs = []
        for _ in range(max_new):
            logp = _log_softmax(model.decode(ys, memory, src_mask)[:, -1],
                                [model.pad_id, bos_id])   # (B, V)
            nxt = logp.argmax(axis=-1)
            probs.append(np.exp(logp[np.arange(len(nxt)), nxt]))
            ys = np.concatenate([ys, nxt[:, None]], axis=1)           # (B, t+1)
            if (ys[:, 1:] == eos_id).any(axis=1).all():
                break
    finally:
        model.train(was_training)
    out_ids, out_probs, done = [], [], []
    for r in range(src.shape[0]):
        seq = ys[r, 1:].tolist()
        n = seq.index(eos_id) + 1 if eos_id in seq else len(seq)
        out_ids.append(seq[:n] if eos_id not in seq else seq[:n - 1])
        out_probs.append([float(p[r]) for p in probs[:n]])
        done.append(eos_id in seq)
    return _finish(out_ids, out_probs, done)


def sample_decode(model, src, temperature=1.0, top_k=None, rng=None, max_new_tokens=None,
                  bos_id=BOS_ID, eos_id=EOS_ID):
    """Draw each token from softmax(logits / temperature), optionally among the ``top_k`` best.

    ``probs`` of the hypotheses are those of the model (temperature 1), not of the sampler.
    """
    temperature = check_real("temperature", temperature, minimum=0, min_open=True)
    top_k = check_int("top_k", top_k, allow_none=True)
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
        u = rng.random((p.shape[0], 1))
        return np.minimum((np.cumsum(p, axis=1) < u).sum(axis=1), p.shape[1] - 1)

    return _generate(model, src, choose, max_new_tokens, bos_id, eos_id)


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


def beam_search(model, src, beam_size=4, length_penalty=LENGTH_PENALTY, max_new_tokens=None,
                bos_id=BOS_ID, eos_id=EOS_ID):
    """Keep the ``beam_size`` best prefixes per sentence; return the best finished one.

    Finished hypotheses are ranked by log-probability / ``length_penalty_gnmt(len, alpha)``
    (length counts the ``<eos>``). The prefixes of all running sentences go as one batch of
    (running sentences * beam_size) rows through the cache; a sentence leaves the batch as soon
    as no open prefix can beat its best finished hypothesis.
    """
    beam_size = check_int("beam_size", beam_size)
    vocab = model.config.tgt_vocab_size
    if beam_size > vocab:                        # more beams than tokens buys nothing, costs memory
        raise ValueError(f"beam_size: expected at most the target vocabulary size {vocab}, "
                         f"got {beam_size}")
    length_penalty = check_real("length_penalty", length_penalty, minimum=0)
    src = _check_src(model, src)
    max_new = _check_max_new(model, src, max_new_tokens)
    b, k = src.shape[0], int(beam_size)
    state = IncrementalDecoder(model).start(np.repeat(src, k, axis=0))   # rows (B*K,)
    active = np.arange(b)                        # sentences still searching, k rows each
    # only the first beam of each sentence is live at the start (the others are copies)
    scores = np.tile(np.r_[0.0, np.full(k - 1, -np.inf)], b)             # (A*K,)
    seqs = [[] for _ in range(b * k)]
    probs = [[] for _ in range(b * k)]
    prev = np.full(b * k, bos_id, dtype=np.int64)
    finished = [[] for _ in range(b)]                                    # (norm score, ids, probs)
    bound_norm = length_penalty_gnmt(max_new, length_penalty)

    for t in range(max_new):
        a = len(active)
        logp = _log_softmax(state.step(prev), [model.pad_id, bos_id])       # (A*K, V)
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
