"""Chinese on the site renders without a system CJK font (issue 78): the site carries a subset of
Noto Sans CJK SC (docs/fonts, built by docs/fonts/build_font_subset.py) that must hold every CJK
character of every built page, so that a new Chinese word on a page fails here until the subset
is rebuilt."""
import importlib.util
import subprocess
import sys

import pytest

from site_build import ROOT, built_site

FONTS = ROOT / "docs" / "fonts"


def build_script():
    spec = importlib.util.spec_from_file_location("build_font_subset",
                                                  FONTS / "build_font_subset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fonts():
    pytest.importorskip("fontTools", reason="fontTools is in the docs extra: pip install -e '.[docs]'")
    return build_script()


def test_the_subset_draws_every_cjk_character_of_the_site(fonts, tmp_path_factory):
    site = built_site(tmp_path_factory)
    used = {}
    for page in sorted(site.rglob("*.html")):
        for char in fonts.cjk_characters(page.read_text(encoding="utf-8")):
            used.setdefault(char, page.relative_to(site).as_posix())
    assert len(used) > 20, "the site's Chinese is gone?"
    drawn = fonts.subset_characters()
    missing = {c: page for c, page in used.items() if c not in drawn}
    assert missing == {}, (f"characters of the site missing from {fonts.SUBSET.name} (run python "
                           f"docs/fonts/build_font_subset.py): {missing}")
    shipped = site / "fonts"
    assert (shipped / fonts.SUBSET.name).exists() and "Open Font License" in \
        (shipped / "LICENSE").read_text(encoding="utf-8")
    css = (site / "stylesheets" / "cjk.css").read_text(encoding="utf-8")
    assert f"../fonts/{fonts.SUBSET.name}" in css
    assert 'href="stylesheets/cjk.css"' in (site / "index.html").read_text(encoding="utf-8")


def test_cjk_characters_are_told_from_the_rest(fonts):
    assert fonts.cjk_characters("我 有 一个 苹果 → i have an apple, σ, é, &#x732b;") == \
        {"我", "有", "一", "个", "苹", "果", "猫"}


def test_the_script_rebuilds_a_subset_of_the_sources_characters(fonts, tmp_path):
    pytest.importorskip("noto_cjk_sans_otc", reason="Noto Sans CJK: pip install -e '.[docs]'")
    pytest.importorskip("brotli", reason="woff2 needs brotli: pip install -e '.[docs]'")
    out = tmp_path / "subset.woff2"
    r = subprocess.run([sys.executable, str(FONTS / "build_font_subset.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert fonts.subset_characters(out) == fonts.used_characters()
    assert fonts.subset_characters() == fonts.used_characters(), \
        "the committed subset is not the sources' characters: run docs/fonts/build_font_subset.py"
