"""Fonts for npformer's pictures: token labels in Chinese, Japanese, Korean, Latin, Greek and
Cyrillic, and a warning that names any character no font can draw.

Matplotlib's own font, DejaVu Sans, draws Latin, Greek and Cyrillic but no CJK: the toy
translator's Chinese tokens came out as empty boxes. The ``plot`` extra installs Noto Sans CJK
as a Python package (``noto-cjk-sans-otc``, the Noto CJK collection under the SIL Open Font
License), so no system font is needed. ``font_family()`` registers it with matplotlib's font
manager and gives the fallback list to draw with: DejaVu Sans first, then the CJK font
(matplotlib takes each character from the first font of the list that has it).

    with readable_text(tokens):          # font.family set; a warning names missing glyphs
        fig.savefig(path)
"""
import contextlib
import importlib.util
import os
import re
import unicodedata
import warnings

BASE_FAMILY = "DejaVu Sans"              # matplotlib's own: Latin, Greek, Cyrillic
# (module, file inside it): packages that carry a Noto Sans CJK file; the first installed wins
PACKAGED_FONTS = (("noto_cjk_sans_otc", "NotoSansCJK-Regular.ttc"),
                  ("mplfonts", os.path.join("fonts", "NotoSansCJKsc-Regular.otf")))
# the face of a collection to draw Chinese with (its Han glyphs in their simplified forms)
PREFERRED_FACES = ("Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK JP")
# installed fonts used where no package brings one
SYSTEM_CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans SC", "Source Han Sans SC",
                    "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "SimHei", "Microsoft YaHei",
                    "PingFang SC", "Heiti SC", "AR PL UMing CN", "Droid Sans Fallback")
INSTALL_HINT = "`pip install 'npformer[plot]'` brings Noto Sans CJK for Chinese, Japanese and Korean"
MATPLOTLIB_MISSING = re.compile(r"Glyph (\d+) .*missing from (?:current )?font")


class MissingGlyphWarning(UserWarning):
    """A label holds a character that no font of ``font_family()`` can draw (it shows as a box)."""


def packaged_font_file():
    """The path of the first installed package's Noto Sans CJK file, or None."""
    for module, name in PACKAGED_FONTS:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                return path
    return None


_family = None


def font_family():
    """The font families to draw labels with, most preferred first: DejaVu Sans, then a CJK
    font (the packaged Noto Sans CJK, registered with matplotlib's font manager on the first
    call, or else an installed one of ``SYSTEM_CJK_FONTS``). Just DejaVu Sans where there is
    none: ``missing_glyphs`` then names the characters that cannot be drawn."""
    global _family
    if _family is not None:
        return list(_family)
    from matplotlib import font_manager
    manager = font_manager.fontManager
    cjk = None
    path = packaged_font_file()
    if path is not None:
        known = {f.fname for f in manager.ttflist}
        if path not in known:
            manager.addfont(path)
        faces = [f.name for f in manager.ttflist if f.fname == path]
        cjk = next((name for name in PREFERRED_FACES if name in faces), faces[0] if faces else None)
    if cjk is None:
        installed = {f.name for f in manager.ttflist}
        cjk = next((name for name in SYSTEM_CJK_FONTS if name in installed), None)
    _family = [BASE_FAMILY] + ([cjk] if cjk else [])
    return list(_family)


_charmaps = {}


def _charmap(family):
    """The set of code points the font ``family`` (a registered name) has glyphs for."""
    if family not in _charmaps:
        from matplotlib import font_manager, ft2font
        entry = next((f for f in font_manager.fontManager.ttflist if f.name == family), None)
        codes = set()
        if entry is not None:
            index = getattr(entry, "index", 0)
            try:
                font = ft2font.FT2Font(entry.fname, face_index=index)
            except TypeError:                        # a matplotlib without face_index
                font = ft2font.FT2Font(entry.fname)
            codes = set(font.get_charmap())
        _charmaps[family] = codes
    return _charmaps[family]


def missing_glyphs(labels, family=None):
    """``{character: first label holding it}`` for the characters of ``labels`` that no font
    of ``family`` (default ``font_family()``) has a glyph for; spaces and control characters
    are not drawn and never missing."""
    family = font_family() if family is None else family
    covered = [_charmap(name) for name in family]
    missing = {}
    for label in labels:
        for ch in str(label):
            if ch in missing or ch.isspace() or unicodedata.category(ch).startswith("C"):
                continue
            if not any(ord(ch) in codes for codes in covered):
                missing[ch] = label
    return missing


def describe(ch):
    name = unicodedata.name(ch, "")
    return f"{ch!r} (U+{ord(ch):04X}{' ' + name if name else ''})"


def warn_missing(missing, stacklevel=3):
    """One ``MissingGlyphWarning`` naming every character of ``missing`` (``missing_glyphs``)."""
    if not missing:
        return
    chars = ", ".join(f"{describe(ch)} in {label!r}" for ch, label in list(missing.items())[:8])
    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
    warnings.warn(f"no font here has a glyph for {chars}{more}: drawn as an empty box; "
                  f"{INSTALL_HINT}", MissingGlyphWarning, stacklevel=stacklevel)


@contextlib.contextmanager
def readable_text(labels=()):
    """Draw (and save) figures inside it with ``font_family()``'s fonts. A character of
    ``labels`` that none of them has is named in one ``MissingGlyphWarning`` up front; one that
    matplotlib still finds missing while drawing (a title, a label not given) is named in
    another, instead of matplotlib's "Glyph N missing from font(s)"."""
    import matplotlib
    family = font_family()
    missing = missing_glyphs(labels, family)
    warn_missing(missing, stacklevel=4)
    with matplotlib.rc_context({"font.family": family}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield family
    late = {}
    for w in caught:
        m = MATPLOTLIB_MISSING.search(str(w.message))
        if m is None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            continue
        ch = chr(int(m.group(1)))
        if ch not in missing:
            late.setdefault(ch, "a title or label")
    warn_missing(late, stacklevel=4)
