"""Decoding: greedy, temperature/top-k sampling and beam search over a decoder state (the
model's own layers, stepping with key/value caches); a Translator that turns sentences into
sentences."""
from .search import (LENGTH_PENALTY, Hypothesis, beam_search, check_beam_size, greedy_search,
                     sample_search)
from .stats import FAST_PATH
from .translator import Translation, Translator, format_trace

__all__ = ["FAST_PATH", "Hypothesis", "LENGTH_PENALTY", "Translation", "Translator", "beam_search",
           "check_beam_size", "format_trace", "greedy_search", "sample_search"]
