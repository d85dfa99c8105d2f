"""The papers' preprocessing of Multi30k text, for their way of counting BLEU.

The multimodal-translation papers that report Multi30k results (Wu et al. 2021 and successors,
fairseq's ``transformer_tiny_wu2021`` baseline) score lowercased, Moses-tokenised text: Moses
punctuation normalisation, lowercasing, then the Moses tokenizer **with its default escaping**
(``'`` -> ``&apos;``, ``"`` -> ``&quot;``, ``&`` -> ``&amp;``), BLEU on the result without any
further tokenisation (``sacrebleu --tokenize none``, as fairseq's BLEU4 / multi-bleu). Applied
to the raw test references this reproduces theirs exactly, e.g. test_2016_flickr's English
line 30::

    one man holds another man &apos;s head down and prepares to punch him in the face .

The same steps are a preprocessing of the training data (``npformer train --dataset multi30k
--preprocess moses``, the Transformer-Tiny preset's): the model then learns on such text, and its
output goes back to plain text through ``papers_detokenize`` (the Moses detokenizer, unescaping).

It needs the optional ``sacremoses`` package (``pip install "npformer[moses]"``).
"""
from __future__ import annotations

import functools
import importlib.util
from typing import Iterable

__all__ = ["papers_tokenize", "papers_detokenize", "PapersPreprocessor", "available"]


def available() -> bool:
    """Whether sacremoses is installed."""
    return importlib.util.find_spec("sacremoses") is not None


def papers_tokenize(lines: Iterable[str], lang: str) -> list[str]:
    """Each line normalised (Moses punctuation), lowercased and Moses-tokenised with escaping,
    the tokens joined by single spaces. ``lang``: the language code ("de", "en")."""
    preprocess = PapersPreprocessor(lang)
    return [preprocess(line) for line in lines]


def papers_detokenize(lines: Iterable[str], lang: str) -> list[str]:
    """The way back for a model's output: each line of such tokens (space-separated) joined by
    the Moses detokenizer, ``&apos;`` etc. unescaped. The case stays lowered."""
    detokenizer = _moses(lang)[2]
    return [detokenizer.detokenize(line.split(), unescape=True) for line in lines]


class PapersPreprocessor:
    """``papers_tokenize`` of one sentence of language ``lang``, as a picklable callable."""

    def __init__(self, lang: str):
        _moses(lang)                             # fails now, clearly, without sacremoses
        self.lang = lang

    def __call__(self, line: str) -> str:
        normalizer, tokenizer, _ = _moses(self.lang)
        return tokenizer.tokenize(normalizer.normalize(line).lower(), return_str=True, escape=True)


@functools.lru_cache(maxsize=None)
def _moses(lang):
    """(normalizer, tokenizer, detokenizer) of ``lang``, built once per process."""
    try:
        from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer
    except ImportError:
        raise ValueError("the papers' preprocessing needs the sacremoses package: "
                         "pip install 'npformer[moses]'") from None
    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang)
