"""Pictures that read: the attention heatmaps draw Chinese, Japanese, Korean, Latin, Greek and
Cyrillic tokens with the ``plot`` extra's packaged font (``npformer.fonts``), and a character
no font has is named in a warning instead of drawn as an anonymous box."""
import warnings

import pytest

pytest.importorskip("matplotlib")

from npformer import fonts                                   # noqa: E402
from npformer.cli.main import main                           # noqa: E402

TOY_SENTENCE = "我们 有 两个 红色的 苹果"
EVERY_SCRIPT = ["attention", "Ωμέγα", "Привет", "我们", "红色的", "日本語", "한국어", "<bos>"]
NO_FONT_HAS = "\U00013000"                                   # an Egyptian hieroglyph


@pytest.fixture
def packaged_font():
    if fonts.packaged_font_file() is None:
        pytest.skip("the plot extra's font package (noto-cjk-sans-otc) is not installed: "
                    "pip install 'npformer[plot]'")
    return fonts.packaged_font_file()


def test_the_fallback_list_covers_every_script_of_the_labels(packaged_font):
    family = fonts.font_family()
    assert family[0] == "DejaVu Sans" and "CJK" in family[1], family
    assert fonts.missing_glyphs(EVERY_SCRIPT) == {}
    # the check can fail: matplotlib's own font alone has the Latin, Greek and Cyrillic only
    alone = fonts.missing_glyphs(EVERY_SCRIPT, family=["DejaVu Sans"])
    assert "我" in alone and "日" in alone and "한" in alone
    assert not any(ch in alone for ch in "attentionΩμέγαПривет<>")


def test_the_toy_plot_draws_no_missing_glyph_box(packaged_font, run_dir, tmp_path, capsys):
    out, _ = run_dir
    assert main(["plot", "--checkpoint", str(out), "--sentence", TOY_SENTENCE,
                 "--out", str(tmp_path / "plots")]) == 0
    written = capsys.readouterr()
    pngs = written.out.split()
    assert any(p.endswith("attention_encoder_0_self_attn.png") for p in pngs)
    assert all((tmp_path / "plots" / p.rsplit("/", 1)[-1]).stat().st_size > 1000 for p in pngs)
    # matplotlib says "Glyph N (...) missing from font(s)" while it draws a box; npformer's
    # own warning names the character; neither may appear
    assert "missing from font" not in written.err and "glyph" not in written.err.lower(), written.err


def test_the_heatmap_renders_with_no_glyph_warning_at_all(packaged_font, run_dir, tmp_path):
    """The same drawing called as a library, every warning recorded (not only the CLI's)."""
    from npformer.cli.plot import _pyplot, plot_attention
    out, _ = run_dir
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = plot_attention(_pyplot(), str(out), TOY_SENTENCE, str(tmp_path))
    assert paths
    glyphs = [str(w.message) for w in caught
              if issubclass(w.category, fonts.MissingGlyphWarning) or "missing from" in str(w.message)]
    assert glyphs == []


def test_a_character_no_font_has_is_named(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    label = f"x{NO_FONT_HAS}"
    assert list(fonts.missing_glyphs([label, "abc"])) == [NO_FONT_HAS]
    with pytest.warns(fonts.MissingGlyphWarning, match=r"U\+13000.*in 'x"):
        with fonts.readable_text([label]):
            fig, ax = plt.subplots()
            ax.set_title(label)
            fig.savefig(tmp_path / "a.png")
            plt.close(fig)
    # one that was not among the labels given is named after matplotlib meets it while drawing,
    # instead of matplotlib's "Glyph 77824 missing"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fonts.readable_text(["abc"]):
            fig, ax = plt.subplots()
            ax.set_title(label)
            fig.savefig(tmp_path / "b.png")
            plt.close(fig)
    messages = [str(w.message) for w in caught]
    assert any("U+13000" in m for m in messages), messages
    assert not any(m.startswith("Glyph") for m in messages), messages
