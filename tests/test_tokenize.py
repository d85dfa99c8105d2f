"""Tests for npformer.data.tokenize: rules, inverse, properties and the Multi30k round trip."""

import doctest
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npformer.data.tokenize as tokenize_module
from npformer.data.multi30k import load_split
from npformer.data.tokenize import detokenize, tokenize

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


def test_docstring_examples():
    result = doctest.testmod(tokenize_module)
    assert result.attempted >= 6 and result.failed == 0


@pytest.mark.parametrize("text, tokens", [
    ("A man sleeping in a green room on a couch.",
     ["A", "man", "sleeping", "in", "a", "green", "room", "on", "a", "couch", "."]),
    ("Ein Junge mit Kopfhörern sitzt auf den Schultern einer Frau.",
     ["Ein", "Junge", "mit", "Kopfhörern", "sitzt", "auf", "den", "Schultern", "einer", "Frau",
      "."]),
    ("Mann's Hut", ["Mann", "'s", "Hut"]),
    ("I don't know, they're here!", ["I", "do", "n't", "know", ",", "they", "'re", "here", "!"]),
    ("McDonald’s", ["McDonald", "’s"]),
    ("O'Brien", ["O'Brien"]),
    ("Ein 3-jähriges Kind im T-Shirt", ["Ein", "3-jähriges", "Kind", "im", "T-Shirt"]),
    ("Fußball- und Basketballspieler", ["Fußball-", "und", "Basketballspieler"]),
    ("Teller und -tassen", ["Teller", "und", "-tassen"]),
    ('das „Mongolian BBQ“-Schild', ["das", "„", "Mongolian", "BBQ", "“", "-Schild"]),
    ('He says "hi" (loudly)...', ["He", "says", '"', "hi", '"', "(", "loudly", ")", "..."]),
    ("price of $2.52 at 11:27; 1,000 people", ["price", "of", "$", "2.52", "at", "11:27", ";",
                                               "1,000", "people"]),
    ("z.B. in den U.S.", ["z.B.", "in", "den", "U.S."]),
    ("Texas A&M, stone &amp; tile", ["Texas", "A&M", ",", "stone", "&amp;", "tile"]),
    ("Freund/in", ["Freund", "/", "in"]),
    ("Vier Menschen – drei Mädchen", ["Vier", "Menschen", "–", "drei", "Mädchen"]),
])
def test_tokenize_examples(text, tokens):
    assert tokenize(text, lowercase=False) == tokens
    assert detokenize(tokens) == text


def test_lowercase_keeps_eszett_and_umlauts():
    assert tokenize("GROẞE Straße ÜBER Äpfel") == ["große", "straße", "über", "äpfel"]
    assert tokenize("GROẞE Straße", lowercase=False) == ["GROẞE", "Straße"]


def test_nfc_normalisation():
    decomposed = "Mädchen".replace("ä", "a\u0308")
    assert tokenize(decomposed) == ["mädchen"]


def test_whitespace_of_all_kinds_separates_tokens():
    assert tokenize("  a\tb\u00a0c\n d  ") == ["a", "b", "c", "d"]
    assert tokenize("") == [] and tokenize(" \n ") == []


@pytest.mark.parametrize("tokens, text", [
    (["a", "man", "."], "a man."),
    (["the", "boys", "'", "bikes"], "the boys' bikes"),
    (["a", "sign", "says", "'", "free", "dinner", "'", "."], "a sign says 'free dinner'."),
    (["he", "said", "“", "hello", "”", "."], "he said “hello”."),
    (["„", "Hallo", "“", ",", "sagt", "er"], "„Hallo“, sagt er"),
    (["Mann", "-", "der"], "Mann - der"),
])
def test_detokenize_examples(tokens, text):
    assert detokenize(tokens) == text


def test_detokenize_rejects_bad_input():
    with pytest.raises(ValueError, match="tokens must be a list"):
        detokenize("a man .")
    with pytest.raises(ValueError, match=r"tokens\[1\]"):
        detokenize(["a", "", "man"])
    with pytest.raises(ValueError, match=r"tokens\[0\]"):
        detokenize([3])
    with pytest.raises(ValueError, match="text must be a str"):
        tokenize(b"bytes")


@settings(max_examples=300)
@given(st.text())
def test_tokens_are_nonempty_and_have_no_whitespace(text):
    for lowercase in (True, False):
        for tok in tokenize(text, lowercase=lowercase):
            assert tok != ""
            assert not any(ch.isspace() for ch in tok)


@settings(max_examples=300)
@given(st.text())
def test_tokenize_loses_no_characters(text):
    tokens = tokenize(text, lowercase=False)
    assert "".join(tokens) == "".join(unicodedata.normalize("NFC", text).split())


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["a", "Mann", "boys", ".", ",", "!", "?", ":", "(", ")", '"',
                                 "'", "„", "“", "”", "’s", "'s", "n't", "-", "–", "/", "#",
                                 "3-jährige", "2.52", "..."]), max_size=20))
def test_detokenize_output_is_a_tidy_string(tokens):
    text = detokenize(tokens)
    assert text == text.strip() and "  " not in text
    assert text.replace(" ", "") == "".join(tokens)


@pytest.fixture(scope="module")
def val_pairs():
    if not (DATA_DIR / "val.de.gz").is_file():
        pytest.skip(f"Multi30k data not found at {DATA_DIR} (see ../shared/data/multi30k)")
    return load_split(DATA_DIR, "val")


@pytest.mark.parametrize("side", [0, 1], ids=["de", "en"])
def test_round_trip_rate_on_val(val_pairs, side):
    sentences = [pair[side] for pair in val_pairs]
    exact = sum(detokenize(tokenize(s, lowercase=False)) == s for s in sentences)
    rate = exact / len(sentences)
    # Measured: 1012 / 1014 = 0.998 for each language (the two misses are a no-break space
    # and a spaced " ... "). The bar sits just below that.
    assert rate >= 0.995, f"round-trip rate {rate:.4f}"


@pytest.mark.parametrize("side", [0, 1], ids=["de", "en"])
def test_retokenizing_detokenized_text_is_stable_on_val(val_pairs, side):
    for sentence in (pair[side] for pair in val_pairs):
        tokens = tokenize(sentence, lowercase=False)
        assert tokenize(detokenize(tokens), lowercase=False) == tokens, sentence
