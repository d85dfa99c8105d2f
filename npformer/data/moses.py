"""The papers' preprocessing of Multi30k text, for their way of counting BLEU.

The multimodal-translation papers that report Multi30k results (Wu et al. 2021 and successors,
fairseq's ``transformer_tiny_wu2021`` baseline) score lowercased, Moses-tokenised text: Moses
punctuation normalisation, lowercasing, then the Moses tokenizer **with its default escaping**
(``'`` -> ``&apos;``, ``"`` -> ``&quot;``, ``&`` -> ``&amp;``), BLEU on the result without any
further tokenisation (``sacrebleu --tokenize none``, as fairseq's BLEU4 / multi-bleu). Applied
to the raw test references this reproduces theirs exactly, e.g. test_2016_flickr's English
line 30::

    one man holds another man &apos;s head down and prepares to punch him in the face .

It needs the optional ``sacremoses`` package (``pip install "npformer[moses]"``).
"""
from __future__ import annotations

import importlib.util
from typing import Iterable

__all__ = ["papers_tokenize", "available"]


def available() -> bool:
    """Whether sacremoses is installed."""
    return importlib.util.find_spec("sacremoses") is not None


def papers_tokenize(lines: Iterable[str], lang: str) -> list[str]:
    """Each line normalised (Moses punctuation), lowercased and Moses-tokenised with escaping,
    the tokens joined by single spaces. ``lang``: the language code ("de", "en")."""
    try:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer
    except ImportError:
        raise ValueError("the papers' preprocessing needs the sacremoses package: "
                         "pip install 'npformer[moses]'") from None
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(line).lower(), return_str=True, escape=True)
            for line in lines]
