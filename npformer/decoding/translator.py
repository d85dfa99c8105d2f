"""Sentences in, sentences out: vocabulary lookup, batching by length, a search strategy.

    translator = Translator(model, vocabs)       # vocabs: the model's Vocabularies
    results = translator.translate(["我 有 一个 苹果"])          # greedy
    results[0].text                                               # 'i have an apple'
    results = translator.translate(lines, method="beam", beam_size=4)
    for window in translator.translate_windows(iter_lines("-")):  # a batch at a time,
        print("\n".join(t.text for t in window), flush=True)     # as standard input comes

Bad input is handled as the CLI promises: unknown words become ``<unk>`` with a warning naming
them, an empty line gives an empty translation, a sentence longer than the model's ``max_len``
raises ``ValueError`` (or is cut, with a warning, under ``truncate=True``).
"""
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..data.vocab import Vocabularies
from ..validation import check_int
from .search import LENGTH_PENALTY, beam_search, check_beam_size, greedy_search, sample_search

METHODS = ("greedy", "beam", "sample")
MAX_TOKENS = 16384          # a batch's rows (sentences x beams) x its longest source, at most
MAX_ROWS = 2048             # ... and its rows, at most (each step writes a (rows, V) array)


@dataclass
class Translation:
    source: str
    text: str                                    # detokenised output ('' for an empty line)
    tokens: list = field(default_factory=list)   # output tokens
    probs: list = field(default_factory=list)    # probability of each chosen token (+ <eos>)
    unknown: list = field(default_factory=list)  # source words mapped to <unk>
    truncated: bool = False
    finished: bool = True


def whitespace_tokenize(text):
    return text.split()


class Translator:
    """Wraps a trained model and its vocabularies (``npformer.data.vocab.Vocabularies``: a
    source and a target vocabulary, or one joint vocabulary).

    Sentences are sorted by length and batched by tokens: a batch takes the next sentences
    while its rows (sentences, times the beams of a beam search) times its longest source stay
    within ``max_tokens``, its rows within ``MAX_ROWS`` (every step writes a row of logits over
    the target vocabulary for each), and at most ``batch_size`` sentences (None: no such
    limit). Short sentences thus go in large batches, whose products use the cores better, and
    long ones in smaller batches, so a batch's decoder caches stay about the same size.

    ``exact``: the decoder states' choice between the exact path and the fast one (None: the
    backend's default; see ``TranslationState``): the tokens are the same either way."""

    def __init__(self, model, vocabs, tokenize=whitespace_tokenize, detokenize=" ".join,
                 batch_size=None, max_tokens=MAX_TOKENS, exact=None):
        if getattr(model.config, "capability", None) != "seq2seq":
            raise ValueError(f"model: translation needs an encoder-decoder (a 'seq2seq' model), "
                             f"got a {getattr(model.config, 'arch', type(model).__name__)!r} model "
                             f"(a language model continues text: npformer sample)")
        Vocabularies.check_fits(vocabs, model.config.vocab_sizes(), pad_id=model.config.pad_id)
        self.batch_size = check_int("batch_size", batch_size, allow_none=True)
        self.max_tokens = check_int("max_tokens", max_tokens)
        self.model, self.vocabs, self.exact = model, vocabs, exact
        self.tokenize, self.detokenize = tokenize, detokenize

    def encode_sources(self, sentences, truncate=False):
        """Token ids per sentence, plus the unknown words and a truncation flag of each."""
        return [self.encode_source(sentence, n, truncate) for n, sentence in enumerate(sentences)]

    def encode_source(self, sentence, n, truncate=False):
        """``(ids, unknown words, truncated)`` of the input's sentence ``n`` (0-based)."""
        max_len = self.model.max_len
        if not isinstance(sentence, str):
            raise ValueError(f"sentences[{n}]: expected a str, got {type(sentence).__name__}")
        tokens = self.tokenize(sentence)
        cut = len(tokens) > max_len
        if cut:
            if not truncate:
                raise ValueError(f"sentences[{n}]: {len(tokens)} tokens exceed the model's "
                                 f"max_len={max_len}; shorten it or pass truncate=True "
                                 f"(--truncate): {sentence[:60]!r}")
            warnings.warn(f"sentence {n + 1}: {len(tokens)} tokens cut to max_len={max_len}",
                          stacklevel=4)
            tokens = tokens[:max_len]
        ids, unknown = self.vocabs.src.encode_with_unknowns(tokens)
        if unknown:
            warnings.warn(f"sentence {n + 1}: unknown words mapped to <unk>: "
                          + ", ".join(repr(u) for u in unknown), stacklevel=4)
        return ids, unknown, cut

    def translate(self, sentences, method="greedy", beam_size=4, length_penalty=LENGTH_PENALTY,
                  temperature=1.0, top_k=None, rng=None, truncate=False, max_new_tokens=None):
        """Translate a list of source strings; returns one ``Translation`` each, in order."""
        if isinstance(sentences, str):
            raise ValueError("sentences: expected a list of strings, got one str; wrap it in a list")
        sentences = list(sentences)
        search = self._search_settings(method, beam_size, length_penalty, temperature, top_k,
                                       rng, max_new_tokens)
        return self._translate(sentences, self.encode_sources(sentences, truncate), search)

    def translate_windows(self, sentences, method="greedy", beam_size=4,
                          length_penalty=LENGTH_PENALTY, temperature=1.0, top_k=None, rng=None,
                          truncate=False, max_new_tokens=None):
        """Translate an iterable of source strings (the lines of standard input, say) a window
        at a time; yields a list of ``Translation`` per window, in order. A window is what one
        batch holds (``batches``; every line counts as a row, an empty one too), so only a
        window is held in memory and the first translations come before the input has ended.
        An input that fits one window is translated exactly as ``translate`` translates it;
        sampled output depends on the windows (they draw from ``rng`` in turn)."""
        if isinstance(sentences, str):
            raise ValueError("sentences: expected an iterable of strings, got one str; wrap it "
                             "in a list")
        search = self._search_settings(method, beam_size, length_penalty, temperature, top_k,
                                       rng, max_new_tokens)
        window, encoded, longest = [], [], 0
        for n, sentence in enumerate(sentences):
            source = self.encode_source(sentence, n, truncate)
            if window and not self._fits(len(window) + 1, max(longest, len(source[0])),
                                         search["beam_size"]):
                yield self._translate(window, encoded, search)
                window, encoded, longest = [], [], 0
            window.append(sentence)
            encoded.append(source)
            longest = max(longest, len(source[0]))
            if not self._fits(len(window) + 1, longest, search["beam_size"]):
                yield self._translate(window, encoded, search)   # full whatever comes next:
                window, encoded, longest = [], [], 0             # don't wait for the next line
        if window:
            yield self._translate(window, encoded, search)

    def _search_settings(self, method, beam_size, length_penalty, temperature, top_k, rng,
                         max_new_tokens):
        """The search's arguments, checked once for all batches (``beam_size``: the beams a
        source takes, 1 but for beam search)."""
        if method not in METHODS:
            raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
        if method == "sample" and rng is None:
            rng = np.random.default_rng()
        beams = check_beam_size(beam_size, len(self.vocabs.tgt)) if method == "beam" else 1
        if max_new_tokens is not None:
            max_new_tokens = check_int("max_new_tokens", max_new_tokens)
            if max_new_tokens > self.model.max_len:
                raise ValueError(f"max_new_tokens: expected at most the model's "
                                 f"max_len={self.model.max_len}, got {max_new_tokens}")
        return dict(method=method, beam_size=beams, length_penalty=length_penalty,
                    temperature=temperature, top_k=top_k, rng=rng, max_new_tokens=max_new_tokens)

    def _translate(self, sentences, encoded, search):
        """The ``Translation`` of each of ``sentences`` (``encoded`` by ``encode_sources``),
        sorted by length into ``batches``."""
        results = [Translation(source=s, text="", unknown=u, truncated=c)
                   for s, (_, u, c) in zip(sentences, encoded)]
        todo = [i for i, (ids, _, _) in enumerate(encoded) if ids]     # empty line -> empty text
        todo.sort(key=lambda i: len(encoded[i][0]))                     # similar lengths together
        pad = self.vocabs.src.pad_id
        for chunk in self.batches([len(encoded[i][0]) for i in todo], search["beam_size"]):
            chunk = [todo[j] for j in chunk]
            width = max(len(encoded[i][0]) for i in chunk)
            src = np.full((len(chunk), width), pad, dtype=np.int64)    # (B, S)
            for row, i in enumerate(chunk):
                src[row, :len(encoded[i][0])] = encoded[i][0]
            hyps = self.search(src, **search)
            for i, hyp in zip(chunk, hyps):
                r = results[i]
                r.tokens = [self.vocabs.tgt.id_to_token(t) for t in hyp.ids]   # as chosen
                r.probs, r.finished = hyp.probs, hyp.finished
                r.text = self.detokenize(self.vocabs.tgt.decode(hyp.ids))      # <pad>/<bos> dropped
        return results

    def batches(self, lengths, beams=1):
        """Consecutive runs of the positions of ``lengths`` (sentences sorted by length), one
        per batch: each as long as its rows (``beams`` a sentence) stay within ``MAX_ROWS`` and,
        times its longest length, within ``max_tokens`` (one sentence at least), and it holds
        at most ``batch_size``."""
        start, longest = 0, 0
        for j, n in enumerate(lengths):
            longest = max(longest, n)
            if not self._fits(j - start + 1, longest, beams):
                yield range(start, j)
                start, longest = j, n
        if start < len(lengths):
            yield range(start, len(lengths))

    def _fits(self, count, longest, beams):
        """Whether ``count`` sentences of at most ``longest`` tokens, ``beams`` rows each, make
        one batch (one sentence always does)."""
        return count == 1 or not (count * beams * longest > self.max_tokens
                                  or count * beams > MAX_ROWS
                                  or (self.batch_size is not None and count > self.batch_size))

    def search(self, src, method, beam_size, length_penalty, temperature, top_k, rng,
               max_new_tokens):
        """One batch of sources ``src`` (B, S), padded -> one ``Hypothesis`` each, in order.
        ``max_new_tokens`` None: the decoder state's capacity, ``min(max_len, 2 * S + 10)``.
        (``npformer.ct2.CT2Translator`` runs an exported model here instead.)"""
        tgt = self.vocabs.tgt
        state = self.model.decoder_state(src, tgt.bos_id, tgt.eos_id, beams=beam_size,
                                         capacity=max_new_tokens, exact=self.exact)
        if method == "greedy":
            return greedy_search(state)
        if method == "beam":
            return beam_search(state, beam_size, length_penalty)
        return sample_search(state, temperature, top_k, rng)


def format_trace(translation):
    """One line per chosen token with its probability (the ``--trace`` view)."""
    return format_token_trace("source", translation.source, translation.tokens, translation.probs,
                              "<eos>" if translation.finished else None, translation.text)


def format_token_trace(label, source, tokens, probs, end, text):
    """The ``--trace`` view of any generation: ``label: source``, one line per chosen token with
    its probability (``end``: the token that ended the output, None where the length ran out
    first), then ``=> text``."""
    lines = [f"{label}: {source}"]
    for t, (tok, p) in enumerate(zip(list(tokens) + ([end] if end is not None else []), probs)):
        lines.append(f"  {t:3d}  {tok:<16s} p={p:.4f}")
    lines.append(f"=> {text}")
    return "\n".join(lines)
