"""The exercise folder carries its own derivations: ``npformer exercises start`` writes
``derivations.md`` (docs/backprop.md's sections that the exercises need, read when it runs), each
exercise file and ``npformer exercises list`` name their section of it, and nothing written or
printed points at a web page."""
import re
from pathlib import Path

import pytest

from npformer.cli.main import main
from npformer.exercises import DERIVATIONS, EXERCISES
from npformer.exercises import derivations as derivations_module
from npformer.exercises.templates import start

ROOT = Path(__file__).resolve().parents[1]
URL = re.compile(r"https?://")


@pytest.fixture
def folder(tmp_path):
    start(tmp_path / "ex")
    return tmp_path / "ex"


def headings(text):
    return [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]


def test_start_writes_the_derivations_each_file_names_its_section(folder):
    text = (folder / DERIVATIONS).read_text(encoding="utf-8")
    sections = headings(text)
    assert {"Notation", "Gradient checking"} <= set(sections)
    for e in EXERCISES:
        assert e.section in sections
        assert f'Derivation: {DERIVATIONS}, section "{e.section}".' in (folder / e.file).read_text()
    readme = (folder / "README.md").read_text(encoding="utf-8")
    assert f"`{DERIVATIONS}`" in readme and "Gradient checking" in readme


def test_the_derivations_are_backprop_md_s_sections_with_links_that_resolve(folder):
    text = (folder / DERIVATIONS).read_text(encoding="utf-8")
    backprop = (ROOT / "docs" / "backprop.md").read_text(encoding="utf-8")
    linear = backprop.split("\n## Linear\n", 1)[1].split("\n## ", 1)[0]
    written = text.split("\n## Linear\n", 1)[1].split("\n## ", 1)[0]
    formulas = [line for line in linear.splitlines() if "$" in line and "](" not in line]
    assert formulas and all(line in written.splitlines() for line in formulas)
    anchors = {derivations_module.anchor(h) for h in headings(text)}
    for label, target in re.findall(r"\[([^\]]+)\]\(([^)\s]+)\)", text):
        assert target.startswith("#") and target[1:] in anchors or URL.match(target), \
            f"[{label}]({target}) leads nowhere from the exercise folder"


# each exercise's result, as formula or code: only a collapsed block (<details>) may hold it
ANSWERS = {
    "Linear": [r"dW = dY^\top X", "what `linear_backward` returns"],
    "Embedding": ["np.add.at(", r"dW_{v,:} = s \sum"],
    "Dropout": ["`dout * keep * scale`"],
    "LayerNorm": ["`dx = rstd * (g - g.mean(-1)", r"d\gamma = \sum_n dy_n"],
    "RMSNorm": ["`dx = rstd * (g - xhat * (g * xhat).mean(-1))`", r"d\gamma = \sum_n dy_n"],
    "SwiGLU": [r"s\,\big(1 + a(1 - s)\big)", r"d\,\text{up} = d\text{out} \odot g"],
    "Softmax": ["`p * (dp - (dp * p).sum(-1, keepdims=True))`"],
    "Attention": [r"dQ = c\; dS\,K", r"dV = P'^\top dO"],
    "Multi-head attention": [r"dW_{in} = [dQ\;dK\;dV]^\top x"],
    "Residual and layer order": [r"dx = dz + f'\big(\delta'(dz)\big)"],
    "Cross-entropy": ["= p_j - q_j", "`cross_entropy_backward` builds exactly this"],
}


def collapsed_removed(text):
    return re.sub(r"<details markdown=\"1\">\n<summary>.*?</details>", "", text, flags=re.S)


def test_derive_first_the_answers_sit_in_collapsed_blocks(folder):
    """The forward, the rules and the steps are open; each exercise's result and code line,
    and its mistakes, sit in a <details> block (which GitHub, Jupyter and the site fold)."""
    text = (folder / DERIVATIONS).read_text(encoding="utf-8")
    assert text.count("<details markdown") == text.count("</details>") >= 2 * len(ANSWERS)
    for section, answers in ANSWERS.items():
        part = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
        assert "<summary>Answer (derive it first, then open)</summary>" in part, section
        assert "<summary>What goes wrong (read it after your first try)</summary>" in part, section
        for answer in answers:
            assert answer in part and answer not in collapsed_removed(part), (section, answer)
    open_text = collapsed_removed(text)
    assert "**Derive first, then read.**" in open_text
    for rule in ("Fan-out sums", "Shape check", "chain rule", "$$\\mu = \\tfrac1D"):
        assert rule in open_text, rule


def test_the_derivations_are_read_from_backprop_md_when_start_runs(tmp_path, monkeypatch):
    """Made from the file as it is (so a change to backprop.md reaches new folders), its links
    to sections left out and to source files kept as text."""
    page = "# Title\n\nintro\n\n" + "".join(
        f"## {h}\n\nAbout {h}: $x^{i}$, see [Adam](#adam) and [`f.py`](../npformer/f.py).\n\n"
        for i, h in enumerate(["Notation", "Rotary positions", "Gradient checking",
                               *(e.section for e in EXERCISES)]))
    (tmp_path / "backprop.md").write_text(page.replace("[Adam](#adam) and ", "[RoPE]"
                                                       "(#rotary-positions), [Adam](#adam) and ", 1))
    monkeypatch.setattr(derivations_module, "SOURCES", (tmp_path / "backprop.md",))
    text = derivations_module.derivations()
    assert "Rotary positions" not in headings(text) and "intro" not in text
    assert "About Notation: $x^0$, see RoPE (docs/backprop.md), [Adam](#adam) and " \
           "`npformer/f.py`." in text


def test_missing_backprop_md_is_a_clear_error_and_start_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(derivations_module, "SOURCES", (tmp_path / "backprop.md",))
    with pytest.raises(FileNotFoundError, match="backprop.md.*reinstall npformer"):
        start(tmp_path / "ex")
    assert not (tmp_path / "ex").exists()


def test_nothing_written_or_listed_points_at_a_web_page(folder, capsys):
    for path in folder.iterdir():
        if path.name != DERIVATIONS:               # backprop.md's own references: the URL test
            assert not URL.search(path.read_text(encoding="utf-8")), path.name
    assert main(["exercises", "list"]) == 0
    out = capsys.readouterr().out
    assert not URL.search(out)
    for e in EXERCISES:
        assert re.search(rf"^\s*{e.key}\s+{e.name}\s.*{re.escape(e.derivation)}$", out, re.M)


def test_a_built_package_ships_backprop_md_for_the_derivations(tmp_path):
    """setup.py's build step, as pip does it from the published sdist: ``setup.py sdist`` of a
    copy of the tree (so that the checkout gets no build/ folder), then a wheel built from that
    sdist alone. The wheel holds docs/backprop.md as npformer/exercises/backprop.md, where an
    installed (not editable) npformer's ``start`` reads it; MANIFEST.in must put it in the
    sdist for that build step to find it."""
    import shutil
    import subprocess
    import sys
    import zipfile
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "MANIFEST.in"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    for folder in ("npformer", "kernels"):
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (src / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "backprop.md", src / "docs" / "backprop.md")

    def run(*args, cwd=None):
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=240, cwd=cwd)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]

    run("setup.py", "-q", "sdist", "-d", str(tmp_path / "sdist"), cwd=src)
    (sdist,) = (tmp_path / "sdist").glob("npformer-*.tar.gz")
    run("-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
        "-w", str(tmp_path / "wheel"), str(sdist))
    (wheel,) = (tmp_path / "wheel").glob("npformer-*.whl")
    with zipfile.ZipFile(wheel) as z:
        shipped = z.read("npformer/exercises/backprop.md")
        assert "npformer/exercises/templates/README.md" in z.namelist()
    assert shipped == (ROOT / "docs" / "backprop.md").read_bytes()
