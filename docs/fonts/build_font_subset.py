"""Rebuild the site's Chinese web font: Noto Sans CJK SC cut down to the characters the site uses.

The site's pages hold Chinese (the toy translator's sentences, in README, the tutorials and
their outputs). A reader without a CJK system font would see boxes, so the site carries its own
font: the Simplified Chinese face of the plot extra's Noto Sans CJK (the PyPI package
``noto-cjk-sans-otc``, SIL Open Font License, see LICENSE beside this file), subset to the
characters that the site's sources use, as woff2. docs/stylesheets/cjk.css uses it for those
characters only. A page that gains a new character fails tests/test_site_font.py until this is
run again:

    pip install -e ".[docs]"                      # fontTools and brotli (woff2), Noto Sans CJK
    python docs/fonts/build_font_subset.py
"""
import argparse
import html
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUBSET = Path(__file__).resolve().parent / "noto-sans-cjk-sc-subset.woff2"
FACE = "Noto Sans CJK SC"
# the blocks that Latin system fonts lack and Noto Sans CJK draws: CJK radicals, symbols and
# punctuation, kana, bopomofo, Hangul, the ideographs (and extension A), compatibility forms,
# full-width forms
CJK_BLOCKS = ((0x2E80, 0x2FDF), (0x3000, 0x33FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
              (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF))


def is_cjk(char):
    return any(lo <= ord(char) <= hi for lo, hi in CJK_BLOCKS)


def cjk_characters(text):
    """The CJK characters of ``text`` (HTML character references read as the characters)."""
    return {c for c in html.unescape(text) if is_cjk(c)}


def site_sources(root=ROOT):
    """The files the site's text comes from: README, BENCHMARKS, docs/ (pages and notebooks
    with their outputs) and npformer/'s docstrings (the API reference)."""
    yield root / "README.md"
    yield root / "BENCHMARKS.md"
    for pattern in ("docs/**/*.md", "docs/**/*.ipynb", "npformer/**/*.py"):
        yield from sorted(root.glob(pattern))


def used_characters(root=ROOT):
    found = set()
    for path in site_sources(root):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".ipynb":      # JSON, where a character may be written as \uXXXX
            text = json.dumps(json.loads(text), ensure_ascii=False)
        found |= cjk_characters(text)
    return found


def noto_collection():
    try:
        from noto_cjk_sans_otc import FONT_PATH
    except ImportError:
        sys.exit("build_font_subset: Noto Sans CJK is not installed: pip install noto-cjk-sans-otc")
    return Path(str(FONT_PATH))


def subset_characters(path=SUBSET):
    """The characters that the subset at ``path`` can draw."""
    from fontTools.ttLib import TTFont
    return {chr(code) for code in TTFont(path).getBestCmap()}


def build(characters, out=SUBSET):
    """Write the woff2 subset of Noto Sans CJK SC holding ``characters``, atomically."""
    from fontTools import subset
    from fontTools.ttLib import TTCollection
    collection = TTCollection(str(noto_collection()))
    faces = [f["name"].getDebugName(1) for f in collection.fonts]
    font = collection.fonts[faces.index(FACE)]
    options = subset.Options()
    options.flavor = "woff2"
    options.hinting = False               # browsers draw CJK without TrueType hints
    options.name_IDs = ["*"]              # keep the copyright and licence names (OFL)
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=sorted(ord(c) for c in characters))
    subsetter.subset(font)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name, suffix=".partial")
    os.close(fd)
    try:
        font.flavor = "woff2"
        font.recalcTimestamp = False      # the same characters give the same bytes
        font.save(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SUBSET, help="the woff2 file to write")
    args = parser.parse_args(argv)
    for module, package in (("fontTools", "fonttools"), ("brotli", "brotli")):
        if importlib.util.find_spec(module) is None:
            sys.exit(f"build_font_subset: {package} is not installed: pip install -e '.[docs]'")
    characters = used_characters()
    build(characters, args.out)
    print(f"{args.out}: {len(characters)} characters: {''.join(sorted(characters))}")


if __name__ == "__main__":
    main()
