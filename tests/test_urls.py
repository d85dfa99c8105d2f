"""Links that resolve: every http(s) URL in the package (npformer/, kernels/, the exercise
templates among them), the top-level Markdown (README.md, ...), docs/ (the notebooks' cell
sources, not their outputs), examples/, benchmarks/ and the packaging files is held to a short
allow-list of real, stable places. An unlisted URL fails with its file and line.

Each entry was checked to exist when it was added: the data sets' files (char-rnn's
tinyshakespeare/input.txt and Multi30k's data/task1/raw/ in their GitHub repositories), the
projects that are cited, the papers' and registries' pages, and the licence texts that vendored
files quote. Add a URL here only for a place known to exist and to stay."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ALLOWED = {
    # the data sets, as npformer download fetches them
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/":
        "tiny Shakespeare (char-rnn's input.txt)",
    "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/":
        "Multi30k task 1, raw",
    # projects cited, by their repositories
    "https://github.com/OpenNMT/CTranslate2": "CTranslate2, the export's engine",
    "https://github.com/karpathy/llm.c": "llm.c, a benchmark's reference",
    "https://prng.di.unimi.it/": "SplitMix64's reference code (S. Vigna's page)",
    # papers and registries' project pages
    "https://arxiv.org/abs/": "papers",
    "https://pypi.org/project/": "PyPI project pages",
    # licence texts that vendored fonts and scripts quote
    "http://www.apache.org/licenses/": "the Apache licence",
    "https://www.apache.org/licenses/": "the Apache licence",
    "http://scripts.sil.org/OFL": "the SIL Open Font License",
    "https://openfontlicense.org": "the SIL Open Font License",
    "https://opensource.org/licenses/": "OSI licences",
    # this machine (mkdocs serve)
    "http://127.0.0.1:": "this machine",
    "http://localhost:": "this machine",
}
TREES = ("npformer", "kernels", "docs", "examples", "benchmarks")
TOP = ("*.md", "setup.py", "setup.cfg", "pyproject.toml")
SUFFIXES = {".py", ".md", ".txt", ".cfg", ".toml", ".yml", ".yaml", ".json", ".js", ".css",
            ".html", ".ipynb", ".rst"}
# third-party files kept as they came (their own links are theirs), and caches
SKIPPED_FOLDERS = {"vendor", "vendored", "node_modules", "__pycache__", ".ipynb_checkpoints"}
URL = re.compile(r"https?://[^\s<>()\[\]{}\"'`\\|]+")


def allowed(url):
    """Whether ``url`` is under an entry of ALLOWED (a whole path segment: an entry
    ``https://github.com/a/b`` does not admit ``https://github.com/a/b-other``)."""
    return any(url == entry or url.startswith(entry if entry.endswith(("/", ":")) else entry + "/")
               or url.startswith(entry + "#") for entry in ALLOWED)


def files(root=ROOT):
    """The files whose URLs are held to the list."""
    found = [p for pattern in TOP for p in root.glob(pattern)]
    for tree in TREES:
        found += [p for p in (root / tree).rglob("*")
                  if p.is_file() and p.suffix in SUFFIXES
                  and not SKIPPED_FOLDERS & set(p.relative_to(root).parts)]
    return sorted(found)


def lines(path):
    """``(line number, text)`` of a file; a notebook's are its cells' sources, numbered as
    ``cell N line M`` would be read (the cell's index times 10,000 plus the line)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".ipynb":
        return list(enumerate(text.splitlines(), 1))
    cells = json.loads(text).get("cells", [])
    return [(10_000 * i + j, line) for i, cell in enumerate(cells, 1)
            for j, line in enumerate("".join(cell.get("source", "")).splitlines(), 1)]


def urls(paths, root=ROOT):
    """``[(where, url)]``: each http(s) URL of ``paths`` with its ``file:line``."""
    out = []
    for path in paths:
        for number, line in lines(path):
            for url in URL.findall(line):
                out.append((f"{path.relative_to(root)}:{number}", url.rstrip(".,;:!?*_")))
    return out


def test_every_url_is_a_known_place():
    found = urls(files())
    assert found, "no URL found at all: the collector is broken"
    unlisted = [f"{where}: {url}" for where, url in found if not allowed(url)]
    assert not unlisted, ("URLs not in tests/test_urls.py's ALLOWED (a place not known to exist; "
                          "remove it or, for a real and stable one, list it):\n"
                          + "\n".join(unlisted))


def test_the_collector_finds_urls_in_code_text_and_notebook_sources(tmp_path):
    (tmp_path / "npformer").mkdir()
    (tmp_path / "npformer" / "m.py").write_text(
        'X = 1\nURL = "https://github.com/npformer/npformer/blob/main/docs/backprop.md#linear"\n')
    (tmp_path / "docs" / "vendor").mkdir(parents=True)
    (tmp_path / "docs" / "vendor" / "lib.js").write_text("// https://example.com/theirs\n")
    (tmp_path / "docs" / "t.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["a\n", "see https://arxiv.org/abs/1706.03762."]},
        {"cell_type": "code", "source": "x = 1", "outputs": [
            {"output_type": "stream", "text": "https://example.com/an-output"}]}]}))
    (tmp_path / "README.md").write_text("[CTranslate2](https://github.com/OpenNMT/CTranslate2)\n")
    found = urls(files(tmp_path), tmp_path)
    assert found == [
        ("README.md:1", "https://github.com/OpenNMT/CTranslate2"),
        ("docs/t.ipynb:10002", "https://arxiv.org/abs/1706.03762"),
        ("npformer/m.py:2", "https://github.com/npformer/npformer/blob/main/docs/backprop.md#linear"),
    ]
    assert [allowed(url) for _, url in found] == [True, True, False]


@pytest.mark.parametrize("url, ok", [
    ("https://github.com/OpenNMT/CTranslate2", True),
    ("https://github.com/OpenNMT/CTranslate2/blob/master/README.md", True),
    ("https://github.com/OpenNMT/CTranslate2-fork", False),
    ("https://github.com/npformer/npformer", False),
    ("http://127.0.0.1:8000", True),
    ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
     True),
    ("https://raw.githubusercontent.com/someone/else/master/input.txt", False),
])
def test_entries_admit_their_own_paths_only(url, ok):
    assert allowed(url) is ok
