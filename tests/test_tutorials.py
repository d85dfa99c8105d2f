"""The tutorials run: every chapter of docs/tutorials (jupytext text notebooks) executes top to
bottom in a fresh Jupyter kernel, in under a minute, and the outputs the documentation site
shows (``NN_*.ipynb``) were made from the chapter's current code."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
LIMIT_S = 60                                  # the "each runs in under a minute"
DOCS_EXTRA = ("jupytext", "nbclient", "ipykernel", "nbformat", "matplotlib", "matplotlib_inline")

_spec = importlib.util.spec_from_file_location("npformer_tutorial_runner",
                                               TUTORIALS / "run_tutorials.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)
CHAPTERS = runner.chapters()


def test_the_six_chapters_are_there():
    assert [p.name[:2] for p in CHAPTERS] == ["01", "02", "03", "04", "05", "06"]


@pytest.fixture
def docs_extra():
    missing = [m for m in DOCS_EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)} missing): "
                    f"pip install -e '.[docs]'")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_the_tutorial_runs_in_under_a_minute(path, docs_extra, monkeypatch, tmp_path):
    if path.name.startswith("04"):           # the download, as `npformer download` leaves it
        if not SHAKESPEARE.exists():
            pytest.skip(f"tiny Shakespeare not found at {SHAKESPEARE} (a local mirror of "
                        f"`npformer download tinyshakespeare`)")
        (tmp_path / "tinyshakespeare.txt").symlink_to(SHAKESPEARE)
        monkeypatch.setenv("NPFORMER_DATA", str(tmp_path))
    nb, seconds = runner.execute(path)
    errors = [o for cell in nb.cells if cell.cell_type == "code"
              for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    assert seconds < LIMIT_S, f"{path.name} took {seconds:.0f} s; a chapter must run in under {LIMIT_S} s"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_the_stored_outputs_come_from_the_current_text(path, docs_extra):
    stored = path.with_suffix(".ipynb")
    assert stored.exists(), f"{stored.name} missing: python docs/tutorials/run_tutorials.py --store {path.name[:2]}"
    import nbformat
    ran = nbformat.read(str(stored), as_version=4)
    cells = [(c.cell_type, c.source) for c in runner.read(path).cells]
    assert [(c.cell_type, c.source) for c in ran.cells] == cells, \
        f"{stored.name} is older than {path.name}: python docs/tutorials/run_tutorials.py --store {path.name[:2]}"
    assert all(c.get("outputs") is not None for c in ran.cells if c.cell_type == "code")
    assert any(c.get("outputs") for c in ran.cells if c.cell_type == "code"), "no outputs stored"


PROXY_PAGE = b"<html><body>Please sign in to use this network.</body></html>\n"


@pytest.mark.parametrize("fetch, why", [
    ("closed", "(could not download https://raw.githubuser"),
    ("proxy-page", "has the wrong sha256"),
])
def test_chapter_4_without_the_text_or_a_network_is_skipped_and_the_run_goes_on(
        docs_extra, monkeypatch, tmp_path, capsys, fetch, why):
    """No download and no way to fetch one: every https request goes to a closed local port, or
    the download hands back other bytes (a proxy's sign-in page, here served from a file:// URL
    that a sitecustomize.py puts in the kernel's table). Chapter 4 says so in one line, the
    runner reports it skipped and runs the next chapter."""
    import socket
    if fetch == "proxy-page":
        (tmp_path / "served").mkdir()
        (tmp_path / "served" / "input.txt").write_bytes(PROXY_PAGE)
        (tmp_path / "site").mkdir()
        served = (tmp_path / "served").as_uri() + "/"
        (tmp_path / "site" / "sitecustomize.py").write_text(
            "import dataclasses\n"
            "from npformer.data import download as _d\n"
            "_d.DATASETS['tinyshakespeare'] = dataclasses.replace(\n"
            f"    _d.DATASETS['tinyshakespeare'], base_url={served!r})\n", encoding="utf-8")
        monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    with socket.socket() as sock:                          # find a port, then close it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for var in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("NPFORMER_DATA", str(tmp_path / "data"))
    after = tmp_path / "99_after.py"
    after.write_text('# %%\nprint("the next chapter ran")\n', encoding="utf-8")
    chapter_4 = [p for p in CHAPTERS if p.name.startswith("04")]
    monkeypatch.setattr(runner, "chapters", lambda names=(): chapter_4 + [after])
    assert runner.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("04_char_gpt.py: skipped: tiny Shakespeare is not downloaded and "
                               "could not be fetched ("), lines
    assert why in lines[0]
    assert "run `npformer download tinyshakespeare`" in lines[0]
    assert lines[1].startswith("99_after.py: ")
    assert not (tmp_path / "data").exists() or list((tmp_path / "data").iterdir()) == []
