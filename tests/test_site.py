"""The documentation site builds: ``mkdocs build --strict`` (mkdocs.yml) over README, docs/ and
the tutorials' stored outputs, so that a broken link or a missing page fails the tests; it has
the pages a learner needs, and none of its pages asks the network for anything (issue 78)."""
import re
import shutil
from html.parser import HTMLParser

import pytest

from site_build import ROOT, built_site, mkdocs_build


@pytest.fixture(scope="module")
def mkdocs():
    return mkdocs_build


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return built_site(tmp_path_factory)


def test_the_site_holds_readme_docs_and_tutorials_with_their_outputs(site):
    overview = (site / "overview.html").read_text(encoding="utf-8")
    assert "Quick start" in overview and 'href="backprop.html' in overview   # README's links
    backprop = (site / "backprop.html").read_text(encoding="utf-8")
    assert 'class="arithmatex"' in backprop                          # the math, for KaTeX
    assert 'href="source/npformer/functional/linear.py.html' in backprop   # a source file's page
    source = (site / "source" / "npformer" / "functional" / "linear.py.html").read_text(encoding="utf-8")
    assert "linear_backward" in source
    chapter = (site / "tutorials" / "02_attention_step_by_step.html").read_text(encoding="utf-8")
    assert "data:image/png;base64" in chapter or "<img" in chapter  # the stored heatmap
    assert "same as npformer&#39;s attention_forward: True" in chapter \
        or "same as npformer's attention_forward: True" in chapter   # a stored output
    for n in range(1, 7):
        assert list((site / "tutorials").glob(f"0{n}_*.html")), f"chapter {n} missing"


@pytest.mark.parametrize("required", ["1", None])
def test_a_missing_docs_extra_fails_where_ci_requires_the_site(monkeypatch, tmp_path, required):
    """With NPFORMER_REQUIRE_BROWSER=1 (.ci/run) a missing docs extra fails the build's tests;
    without it they skip, saying what to install."""
    import site_build
    monkeypatch.setattr(site_build, "DOCS_EXTRA", (*site_build.DOCS_EXTRA, "no_such_docs_module"))
    if required:
        monkeypatch.setenv("NPFORMER_REQUIRE_BROWSER", required)
    else:
        monkeypatch.delenv("NPFORMER_REQUIRE_BROWSER", raising=False)
    outcome = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises((pytest.fail.Exception, pytest.skip.Exception),
                       match="no_such_docs_module missing") as stopped:
        mkdocs_build(ROOT, tmp_path / "site")
    assert stopped.type is outcome
    assert not (tmp_path / "site").exists()


def test_a_broken_link_or_anchor_fails_the_build(mkdocs, tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("mkdocs.yml", "README.md", "BENCHMARKS.md"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "docs", root / "docs",
                    ignore=shutil.ignore_patterns("__pycache__", "*.py[co]"))
    with open(root / "docs" / "architecture.md", "a", encoding="utf-8") as f:
        f.write("\nSee [the missing page](no_such_page.md) and "
                "[a missing heading](backprop.md#no-such-heading).\n")
    r = mkdocs(root, tmp_path / "site")
    assert r.returncode != 0, r.stdout + r.stderr
    assert "no_such_page.md" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "#no-such-heading" in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_home_page_points_to_the_three_uses_and_the_site_teaches(site):
    home = (site / "index.html").read_text(encoding="utf-8")
    for use in ("Learn how backpropagation works", "Test your own layers", "Train a translator"):
        assert use in home, use
    for page in ("tutorials/index.html", "exercises.html", "backprop.html", "api.html"):
        assert f'href="{page}' in home, page
    assert "Quick start" not in home                                  # not the whole README
    exercises = re.sub(r"<[^>]+>", "", (site / "exercises.html").read_text(encoding="utf-8"))
    for step in ("npformer exercises start", "npformer exercises check", "--train"):
        assert step in exercises, step
    api = (site / "api.html").read_text(encoding="utf-8")
    for name in ("linear_backward", "layernorm_forward", "MultiHeadAttention", "gradcheck",
                 "TransformerConfig", "GPTConfig", "assert_gradients"):
        assert f'id="npformer.' in api and name in api, name        # generated from docstrings


class Resources(HTMLParser):
    """The http(s) URLs that a page would fetch: src/srcset/poster/data of any element, href of
    any element but a link to follow (<a>), url(...) and @import in styles, import() in scripts."""
    REMOTE = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"]|import\s*\(\s*['"]|from\s+['"])(https?://[^'")\s]+)""")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found, self.tag = [], None

    def handle_starttag(self, tag, attrs):
        self.tag = tag
        for name, value in attrs:
            value = value or ""
            fetched = name in ("src", "srcset", "poster", "data") or (name == "href" and tag != "a")
            if fetched and re.search(r"(^|[\s,])(https?:)?//", value):
                self.found.append(f"<{tag} {name}={value}>")
            elif name == "style":
                self.found += self.REMOTE.findall(value)

    def handle_data(self, data):
        if self.tag in ("script", "style"):
            self.found += self.REMOTE.findall(data)


def test_no_page_asks_the_network_for_a_resource(site):
    asked = {}
    for page in sorted(site.rglob("*.html")):
        parser = Resources()
        parser.feed(page.read_text(encoding="utf-8"))
        if parser.found:
            asked[page.relative_to(site).as_posix()] = parser.found[:3]
    for sheet in sorted(site.rglob("*.css")):
        found = Resources.REMOTE.findall(sheet.read_text(encoding="utf-8"))
        if found:
            asked[sheet.relative_to(site).as_posix()] = found[:3]
    assert asked == {}, asked
    assert (site / "vendor" / "katex" / "LICENSE").exists()          # the renderer's licence
