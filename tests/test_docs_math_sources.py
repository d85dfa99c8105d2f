"""The Markdown that a reader of the repository sees writes its math so that the common viewers
render it (issue 78): ``$...$`` and ``$$...$$``, which GitHub, Jupyter and the site's KaTeX all
read, never ``\\(...\\)`` or ``\\[...\\]``; and no control character (a ``\\theta`` or ``\\big``
turned into a tab or a backspace by an unescaped string) hides in a formula."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md")),
           *sorted((ROOT / "docs" / "tutorials").glob("[0-9][0-9]_*.py"))]
CODE = re.compile(r"^\s*```.*?^\s*```|`[^`\n]*`", re.S | re.M)   # fenced blocks, inline code
OLD_DELIMITERS = re.compile(r"\\\(|\\\)|\\\[|\\\]")
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")          # a tab too


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_math_uses_dollar_delimiters_and_no_control_characters(path):
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":       # a tutorial: its Markdown cells are the '# ' comment lines
        text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    prose = CODE.sub("", text)
    for line in prose.splitlines():
        assert not CONTROL.search(line), f"{path.name}: a control character in {line!r}"
        assert not OLD_DELIMITERS.search(line), \
            f"{path.name}: write math as $...$ or $$...$$, not {line.strip()!r}"
