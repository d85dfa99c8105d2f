"""Decoding: key/value-cached greedy, temperature/top-k sampling, beam search; a Translator that
turns sentences into sentences."""
from .cache import DecoderState, IncrementalDecoder
from .search import (LENGTH_PENALTY, Hypothesis, beam_search, greedy_decode, greedy_decode_uncached,
                     sample_decode)
from .translator import Translation, Translator, format_trace

__all__ = ["DecoderState", "Hypothesis", "IncrementalDecoder", "LENGTH_PENALTY", "Translation",
           "Translator", "beam_search", "format_trace", "greedy_decode", "greedy_decode_uncached",
           "sample_decode"]
