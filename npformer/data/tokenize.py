"""A small, documented word-level tokenizer for German and English, and its inverse.

``tokenize`` turns a sentence into a list of word and punctuation tokens; ``detokenize``
glues such a list back into readable text (for display, and for BLEU, which wants plain text).

Rules of ``tokenize``:

1. The text is normalised to Unicode NFC (``"a" + U+0308`` becomes ``"ä"``) and split on
   whitespace (every character for which ``str.isspace()`` is true, the no-break space too).
2. Inside each whitespace-free chunk the first matching pattern wins, from left to right:

   * an abbreviation of single letters with periods: ``z.B.``, ``U.S.``;
   * a word: letters, digits and ``_`` (Unicode-aware, so ``ä ö ü ß é`` are letters), which
     may be joined by inner ``- ' ’ &`` (``T-Shirt``, ``3-jährige``, ``O'Brien``, ``A&M``)
     and, between digits, by ``. , :`` (``2.52``, ``1,000``, ``11:27``). A hyphen that ends
     the chunk stays on the word (German ``Fußball- und Basketballspieler``);
   * a hyphen that starts a word and follows no letter or digit stays on that word, as in
     German ``Papierteller und -tassen`` and ``„Mongolian BBQ“-Leuchtreklame``, which gives
     ``„ Mongolian BBQ “ -Leuchtreklame``;
   * an HTML entity such as ``&amp;`` (the English side of Multi30k contains a few);
   * a run of periods ``...``;
   * any other single character: ``. , ! ? ; : " ' ( ) „ “ – / # $ %`` and so on.

3. A clitic is split off the end of a word, so that the stem is shared with other sentences:
   ``'s 're 've 'll 'd 'm`` (with ``'`` or the typographic ``’``) and ``n't``::

       Mann's -> Mann 's      don't -> do n't      geht's -> geht 's

4. With ``lowercase=True`` (the default) every token is lowercased with ``str.lower()``
   (not ``str.casefold()``, which would turn German ``ß`` into ``ss``).

Examples::

    >>> tokenize("Ein Mann schläft auf einem Sofa.")
    ['ein', 'mann', 'schläft', 'auf', 'einem', 'sofa', '.']
    >>> tokenize("A boy sits on a woman's shoulders.", lowercase=False)
    ['A', 'boy', 'sits', 'on', 'a', 'woman', "'s", 'shoulders', '.']
    >>> tokenize('Auf dem Schild steht: „Welcome Bikers“.', lowercase=False)
    ['Auf', 'dem', 'Schild', 'steht', ':', '„', 'Welcome', 'Bikers', '“', '.']
    >>> tokenize("Two men (one sitting) don't see the T-shirt.")
    ['two', 'men', '(', 'one', 'sitting', ')', 'do', "n't", 'see', 'the', 't-shirt', '.']

``detokenize`` joins the tokens with single spaces, except that

* closing punctuation ``. , ! ? ; : ) ] } ...`` and clitics (``'s``, ``n't``) attach to the
  token before them, and so does a word with a leading hyphen after a punctuation token
  (``“ -Leuchtreklame``); opening brackets ``( [ {`` and ``# $`` attach to the token after
  them; ``/`` attaches on both sides (``Freund/in``);
* quotes are paired: a straight ``"`` opens (attaches to the next token) and the next ``"``
  closes (attaches to the previous token); German ``„`` is closed by ``“``; English ``“`` by
  ``”``; ``‘`` by ``’``. A ``'`` closes an open ``'``; if none is open and no other ``'``
  follows, it is a possessive after a word ending in ``s`` (``the boys' bikes``); otherwise
  it opens a quote (``a sign that says 'free dinner'``).

Examples::

    >>> detokenize(["a", "man", "."])
    'a man.'
    >>> detokenize(["the", "sign", "says", '"', "thumbs", "up", '"', "."])
    'the sign says "thumbs up".'

Whitespace itself is not recorded, so ``detokenize(tokenize(s, lowercase=False)) == s`` holds
for ordinary sentences (99.8% of the Multi30k validation sentences in each language, see
``tests/test_tokenize.py``) but not for text with double spaces, no-break spaces or unusual
spacing around punctuation (``dog , cat`` comes back as ``dog, cat``).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

__all__ = ["tokenize", "detokenize"]

# One token inside a whitespace-free chunk; the alternatives are tried left to right.
_TOKEN_RE = re.compile(
    r"""
      (?:\w\.){2,}                                       # abbreviation: z.B.  U.S.
    | \w+(?:(?:&[A-Za-z]+;|[-'’&]|(?<=\d)[.,:](?=\d))\w+)*  # word, with inner joiners
      (?:-$)?                                            #   a hyphen ending the chunk stays
    | (?<!\w)-\w+(?:[-'’&]\w+)*                          # leading hyphen: -tassen, “-Banner
    | &(?:[A-Za-z]+|\#\d+);                              # HTML entity: &amp;  &#39;
    | \.{2,}                                             # ellipsis: ...
    | \S                                                 # any other single character
    """,
    re.VERBOSE,
)

# Clitics split off the end of a word: 's 're 've 'll 'd 'm (with ' or ’) and n't.
_CLITIC_RE = re.compile(r"^(\w.*?)(n['’]t|['’](?:s|re|ve|ll|d|m))$", re.IGNORECASE)
_CLITICS = frozenset(
    a + c for a in "'’" for c in ("s", "re", "ve", "ll", "d", "m")
) | {"n't", "n’t"}

# detokenize: tokens that attach to the token before them / after them / on both sides.
_ATTACH_LEFT = frozenset([".", ",", "!", "?", ";", ":", ")", "]", "}", "…", "»"])
_ATTACH_RIGHT = frozenset(["(", "[", "{", "#", "$", "«", "¿", "¡"])
_ATTACH_BOTH = frozenset(["/"])
# Quote characters and the opening quote that each one closes (None: it always opens).
_CLOSES = {'"': '"', "'": "'", "“": "„", "”": "“", "’": "‘", "„": None, "‘": None, "`": None}


def _split_clitic(word: str) -> list[str]:
    """``"Mann's"`` -> ``["Mann", "'s"]``; words without a clitic come back unchanged."""
    match = _CLITIC_RE.match(word)
    return [word] if match is None else [match.group(1), match.group(2)]


def tokenize(text: str, lowercase: bool = True) -> list[str]:
    """Split ``text`` into word and punctuation tokens (rules in the module docstring).

    Never returns empty tokens or tokens that contain whitespace.
    """
    if not isinstance(text, str):
        raise ValueError(f"tokenize: text must be a str, got {type(text).__name__}")
    text = unicodedata.normalize("NFC", text)
    tokens: list[str] = []
    for chunk in text.split():
        for piece in _TOKEN_RE.findall(chunk):
            tokens.extend(_split_clitic(piece))
    if lowercase:
        tokens = [tok.lower() for tok in tokens]
    return tokens


def detokenize(tokens: Sequence[str]) -> str:
    """Join ``tokens`` into text, attaching punctuation, quotes and clitics (module docstring)."""
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise ValueError(
            f"detokenize: tokens must be a list of str, got {type(tokens).__name__}"
        )
    for i, tok in enumerate(tokens):
        if not isinstance(tok, str) or tok == "":
            raise ValueError(f"detokenize: tokens[{i}] must be a non-empty str, got {tok!r}")

    pieces: list[str] = []
    glue_next = True              # no space before the first token
    open_quotes: list[str] = []   # quotes opened and not yet closed, innermost last
    prev = ""
    apostrophes_left = sum(tok == "'" for tok in tokens)

    for tok in tokens:
        attach_left = attach_right = False
        apostrophes_left -= tok == "'"
        if tok in _ATTACH_LEFT or tok.lower() in _CLITICS or set(tok) == {"."}:
            attach_left = True
        elif len(tok) > 1 and tok[0] == "-" and tok[1].isalnum():
            attach_left = prev != "" and not prev[-1].isalnum()   # “-Banner, but: und -tassen
        elif tok in _ATTACH_RIGHT:
            attach_right = True
        elif tok in _ATTACH_BOTH:
            attach_left = attach_right = True
        elif tok in _CLOSES:
            opener = _CLOSES[tok]
            if opener is not None and open_quotes and open_quotes[-1] == opener:
                attach_left = True                # closing quote
                open_quotes.pop()
            elif tok == "’" or (tok == "'" and apostrophes_left == 0
                                and prev[-1:] in ("s", "S") and prev.lower() not in _CLITICS):
                attach_left = True                # apostrophe: the boys' bikes
            else:
                attach_right = True               # opening quote
                open_quotes.append(tok)

        if pieces and not (attach_left or glue_next):
            pieces.append(" ")
        pieces.append(tok)
        glue_next = attach_right
        prev = tok
    return "".join(pieces)
