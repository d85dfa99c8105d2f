"""The front page can't regress: every Python code block in README.md and docs/*.md runs, or is
marked ``<!-- not run: reason -->`` on the line just before its fence. The blocks of one file
run in order in one namespace (a later block may use what an earlier one defined), in an empty
folder. Shell blocks are out of scope here.

Also: docs/example_test_gradients.py (the file users copy) passes, and setup.cfg lists every
package folder, so a plain ``pip install .`` never lacks one.
"""
import configparser
import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\s*$")
NOT_RUN = re.compile(r"^<!-- not run: (.+\S) -->$")


def python_blocks(path):
    """[(line number, code, reason it is not run or None)] of a Markdown file's python blocks."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            start = i
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            marker = NOT_RUN.match(lines[start - 1]) if start else None
            blocks.append((start + 1, "\n".join(lines[start + 1:j]), marker and marker.group(1)))
            i = j
        i += 1
    return blocks


@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_every_python_block_runs(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{path.stem}"}
    for line, code, reason in python_blocks(path):
        if reason:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                exec(compile(code, f"{path.name}:{line}", "exec"), namespace)
            except Exception as e:
                pytest.fail(f"{path.name}, the python block at line {line}: "
                            f"{type(e).__name__}: {e}")
        namespace.setdefault("_printed", []).append(out.getvalue())


def test_the_readme_gradcheck_example_prints_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = next(code for _, code, _ in python_blocks(ROOT / "README.md") if "gradcheck" in code)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    assert out.getvalue().startswith("gradcheck PASS"), out.getvalue()
    assert "WRONG" not in out.getvalue() and "FAIL" not in out.getvalue()


def test_every_not_run_marker_gives_a_reason_and_stands_before_a_block():
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.startswith("<!-- not run"):
                assert NOT_RUN.match(line), f"{path.name}:{i + 1}: '<!-- not run: reason -->'"
                assert i + 1 < len(lines) and lines[i + 1].startswith("```"), \
                    f"{path.name}:{i + 1}: the marker must stand just before a code fence"


def test_the_example_test_file_passes():
    """docs/example_test_gradients.py, as a user would run it in their project: each test
    function called (a Hypothesis one runs its examples)."""
    spec = importlib.util.spec_from_file_location("example_test_gradients",
                                                  ROOT / "docs" / "example_test_gradients.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [getattr(module, name) for name in dir(module) if name.startswith("test_")]
    assert len(tests) >= 3
    for test in tests:
        test()


def test_setup_cfg_lists_every_package_folder():
    """setup.cfg lists packages by hand; an editable install hides a missing entry that a plain
    install would expose."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = {line.strip() for line in config["options"]["packages"].splitlines() if line.strip()}
    folders = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "npformer").rglob("__init__.py") if "__pycache__" not in p.parts}
    folders.add("npformer.kernels")                    # kernels/, installed under npformer
    assert folders == listed, f"setup.cfg packages: missing {sorted(folders - listed)}, " \
                              f"stale {sorted(listed - folders)}"
    package_dir = config["options"]["package_dir"]
    assert "npformer.kernels = kernels" in package_dir
