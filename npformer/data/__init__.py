"""Data: the built-in toy corpus, Multi30k, vocabularies and batching.

The word tokenizer is ``npformer.data.tokenize.tokenize`` / ``detokenize`` (not re-exported here,
so that ``npformer.data.tokenize`` stays the module).
"""
from .batching import Batch, BatchSampler, iterate_batches, make_batch, pad_sequences
from .download import MULTI30K_FILES, download_multi30k
from .multi30k import SPLITS, MissingDataError, available_splits, load_split, resolve_data_dir
from .textfile import read_lines, read_parallel
from .toy import ToyCorpus, generate_toy_corpus, toy_examples
from .vocab import Vocab, Vocabularies

__all__ = [
    "Batch", "BatchSampler", "MULTI30K_FILES", "MissingDataError", "SPLITS", "ToyCorpus", "Vocab",
    "Vocabularies",
    "available_splits", "download_multi30k", "generate_toy_corpus",
    "iterate_batches", "load_split", "make_batch", "pad_sequences", "read_lines",
    "read_parallel", "resolve_data_dir", "toy_examples",
]
