"""The tutorials' index tells a learner how to open a chapter in Jupyter without touching the
stored notebooks (``docs/tutorials/NN_*.ipynb``, the outputs the site shows; issue 78): its
``jupytext`` command, run as written, makes a notebook of the chapter elsewhere, with the
chapter's cells, and leaves every stored notebook as it was."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
BASH_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def index_commands(word):
    """The index's shell lines that run ``word``."""
    text = (TUTORIALS / "index.md").read_text(encoding="utf-8")
    lines = [line.split("#")[0].strip() for block in BASH_BLOCK.findall(text)
             for line in block.splitlines()]
    return [line for line in lines if re.search(rf"(^|&&\s*){word}\b", line)]


def test_the_index_opens_a_chapter_without_writing_over_its_stored_notebook(tmp_path):
    if importlib.util.find_spec("jupytext") is None:
        pytest.skip("jupytext is in the docs extra: pip install -e '.[docs]'")
    commands = index_commands("jupytext")
    assert commands, "docs/tutorials/index.md gives no jupytext command to open a chapter"
    stored = {p: p.read_bytes() for p in sorted(TUTORIALS.glob("*.ipynb"))}
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = Path(sys.executable).parent            # the jupytext of this Python
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    assert shutil.which("jupytext", path=env["PATH"]), "jupytext's command is not installed"
    for command in index_commands("mkdir") + commands:
        r = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, f"{command}: {r.stderr}"

    assert {p: p.read_bytes() for p in sorted(TUTORIALS.glob("*.ipynb"))} == stored
    made = sorted(home.rglob("*.ipynb"))
    assert made, f"{commands} made no notebook under the learner's home folder"
    import jupytext
    import nbformat
    for notebook in made:
        chapter = TUTORIALS / notebook.with_suffix(".py").name
        cells = [(c.cell_type, c.source) for c in nbformat.read(notebook, as_version=4).cells]
        assert cells == [(c.cell_type, c.source) for c in jupytext.read(chapter).cells]
