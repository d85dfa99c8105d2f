"""``npformer exercises start DIR --notebook``: each exercise as a jupytext pair (``NN_name.ipynb``
beside ``NN_name.py``), for learners who work in Jupyter; ``check`` reads whichever of the two
was saved last and says which; without jupytext, ``start --notebook`` names the one command that
installs it and writes nothing."""
import json
import os
import sys

import pytest

from npformer.cli.main import main
from npformer.exercises import EXERCISES, check_exercise, find
from npformer.exercises.templates import solution_source, start

jupytext = pytest.importorskip("jupytext", reason="jupytext (the docs extra) writes the notebooks")


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "ex"
    start(path, notebook=True)
    return path


def save_notebook(path, code, later_than):
    """Save ``code`` as the notebook ``path``, as Jupyter without jupytext's pairing would (the
    .py left as it was), its time a second after ``later_than``'s."""
    jupytext.write(jupytext.reads(code, fmt="py:light"), str(path))
    t = later_than.stat().st_mtime + 1
    os.utime(path, (t, t))


def test_start_notebook_writes_each_exercise_as_a_paired_notebook(folder, capsys):
    for e in EXERCISES:
        py, ipynb = folder / e.file, folder / e.notebook
        notebook = json.loads(ipynb.read_text(encoding="utf-8"))
        assert notebook["metadata"]["jupytext"]["formats"] == "ipynb,py:light"
        code = "".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code")
        # a fused exercise raises in each function to write; a staged one has its steps as None
        assert code.count("raise NotImplementedError") == (0 if e.staged else len(e.writes)), e.file
        assert jupytext.writes(jupytext.read(str(ipynb)), fmt="py:light") == py.read_text(), e.file
        compile(py.read_text(encoding="utf-8"), e.file, "exec")
        assert ipynb.stat().st_mtime_ns <= py.stat().st_mtime_ns     # the .py is read first
    assert all(r.status == "not done" and r.read == "" for r in map(
        lambda e: check_exercise(folder, e.name), EXERCISES[:2]))
    assert main(["exercises", "start", str(folder.parent / "two"), "--notebook"]) == 0
    assert "open " + str(folder.parent / "two" / EXERCISES[0].notebook) in capsys.readouterr().out


def test_check_reads_the_notebook_saved_after_the_py_and_says_so(folder, capsys):
    e = find("embedding")
    wrong = solution_source(e).replace("np.add.at(dw, flat_ids, flat_dout)",
                                       "dw[flat_ids] += flat_dout")
    save_notebook(folder / e.notebook, wrong, later_than=folder / e.file)
    result = check_exercise(folder, "embedding")
    assert result.status == "WRONG" and result.read == "02_embedding.ipynb, saved after 02_embedding.py"
    assert main(["exercises", "check", str(folder), "embedding"]) == 1
    assert "== 2. embedding (02_embedding.ipynb, saved after 02_embedding.py): WRONG" in \
        capsys.readouterr().out
    (folder / e.file).write_text(solution_source(e))          # the .py saved last: it is read
    later = (folder / e.notebook).stat().st_mtime + 1           # (the notebook's time was set a
    os.utime(folder / e.file, (later, later))                   # second ahead: stay past it)
    result = check_exercise(folder, "embedding")
    assert result.status == "done" and result.read == ""


def test_a_notebook_is_read_without_jupytext_too_and_its_errors_name_it(folder, monkeypatch):
    e = find("linear")
    save_notebook(folder / e.notebook, solution_source(e), later_than=folder / e.file)
    monkeypatch.setitem(sys.modules, "jupytext", None)           # import jupytext fails
    assert check_exercise(folder, "linear").status == "done"
    (folder / e.notebook).write_text("{not json", encoding="utf-8")
    os.utime(folder / e.notebook, (os.path.getmtime(folder / e.file) + 1,) * 2)
    result = check_exercise(folder, "linear")
    assert result.status == "error" and result.message.startswith(
        "01_linear.ipynb: cannot be read as a notebook"), result.message


def test_start_notebook_without_jupytext_names_the_pip_command_and_writes_nothing(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jupytext", None)
    assert main(["exercises", "start", str(tmp_path / "ex"), "--notebook"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "--notebook: jupytext is not installed" in err and err.endswith("pip install jupytext")
    assert not (tmp_path / "ex").exists()
