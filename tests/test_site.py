"""The documentation site builds: ``mkdocs build --strict`` (mkdocs.yml) over README, docs/ and
the tutorials' stored outputs, so that a broken link or a missing page fails the tests."""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS_EXTRA = ("mkdocs", "material", "mkdocs_jupyter")


@pytest.fixture(scope="module")
def mkdocs():
    missing = [m for m in DOCS_EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)} missing): "
                    f"pip install -e '.[docs]'")

    def build(root, out):
        # (not --quiet: it silences the warnings that --strict counts, and nothing then fails)
        return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                               "--config-file", str(root / "mkdocs.yml"), "--site-dir", str(out)],
                              capture_output=True, text=True, cwd=root, timeout=300,
                              env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    return build


@pytest.fixture(scope="module")
def site(mkdocs, tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = mkdocs(ROOT, out)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_the_site_holds_readme_docs_and_tutorials_with_their_outputs(site):
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Quick start" in home and 'href="backprop.html' in home   # README's docs/ links
    backprop = (site / "backprop.html").read_text(encoding="utf-8")
    assert 'class="arithmatex"' in backprop                          # the math, for MathJax
    assert "https://github.com/npformer/npformer/blob/main/npformer/functional/linear.py" in backprop
    chapter = (site / "tutorials" / "02_attention_step_by_step.html").read_text(encoding="utf-8")
    assert "data:image/png;base64" in chapter or "<img" in chapter  # the stored heatmap
    assert "same as npformer&#39;s attention_forward: True" in chapter \
        or "same as npformer's attention_forward: True" in chapter   # a stored output
    for n in range(1, 7):
        assert list((site / "tutorials").glob(f"0{n}_*.html")), f"chapter {n} missing"


def test_a_broken_link_fails_the_build(mkdocs, tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("mkdocs.yml", "README.md", "BENCHMARKS.md"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "docs", root / "docs",
                    ignore=shutil.ignore_patterns("__pycache__", "*.py[co]"))
    with open(root / "docs" / "architecture.md", "a", encoding="utf-8") as f:
        f.write("\nSee [the missing page](no_such_page.md).\n")
    r = mkdocs(root, tmp_path / "site")
    assert r.returncode != 0 and "no_such_page.md" in r.stdout + r.stderr, r.stdout + r.stderr
