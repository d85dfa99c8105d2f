"""The exercise folder's ``derivations.md``: the sections of docs/backprop.md that the exercises
need, read from the installed npformer at the time ``npformer exercises start`` runs, so that the
folder carries its own derivations and no exercise points at a web page.

backprop.md is found beside this module (a built package: setup.py's ``build_py`` copies it
there) or in the checkout's ``docs/`` (an editable install). Its ``## `` sections are kept
whole, in the page's order; a link to a section left out, to a source file or to another page
of docs/ keeps its text and names where that is, since none of those is in the folder.
"""
import re
from pathlib import Path

from .catalogue import DERIVATIONS, EXERCISES

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "backprop.md", HERE.parents[1] / "docs" / "backprop.md")
# the sections every learner needs besides their exercises' own
ALWAYS = ("Notation", "Gradient checking")
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
DERIVE_FIRST = (
    "**Derive first, then read.** Each section gives the forward, its shapes and the steps\n"
    "back through it; the rules are in [Notation](#notation): the chain rule (a backward is a\n"
    "vector-Jacobian product), fan-out sums and the shape check. Write the forward as a chain of\n"
    "named intermediates (LayerNorm: mu, xc, var, rstd, xhat, y) and go back through it one\n"
    "step at a time, each step's gradient from the ones after it. The result and its line of\n"
    "code sit in a collapsed **Answer** block, the usual mistakes in a collapsed **What goes\n"
    "wrong** block (in a text editor: the `<details>` lines): open them once you have an\n"
    "answer of your own. `npformer exercises check DIR NAME --hint` and `--hint 2` say more\n"
    "about a mistake the check names.\n\n")


def backprop_source():
    """The path of docs/backprop.md as this npformer ships it (an OSError if it is missing)."""
    for path in SOURCES:
        if path.is_file():
            return path
    raise FileNotFoundError(f"npformer's derivations (backprop.md) are missing: looked for "
                            f"{' and '.join(map(str, SOURCES))}; reinstall npformer")


def anchor(heading):
    """The anchor Markdown viewers give a heading: lower case, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(text):
    """``[(heading, text)]`` of each ``## `` section of ``text`` (code blocks are not read for
    headings); what comes before the first one is left out."""
    found, fenced = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        if line.startswith("## ") and not fenced:
            found.append([line[3:].strip(), line])
        elif found:
            found[-1][1] += line
    return [tuple(section) for section in found]


def _relink(text, kept):
    """Links that lead somewhere in the folder stay; the others keep their text and say where."""
    def one(match):
        label, target = match.groups()
        if target.startswith("#"):
            return match.group(0) if target[1:] in kept else f"{label} (docs/backprop.md)"
        if target.startswith(("http://", "https://")):
            return match.group(0)
        if target.startswith("../"):                        # a source file: its path
            return f"`{target[3:]}`"
        return f"{label} (docs/{target} in npformer's repository)"
    return LINK.sub(one, text)


def derivations():
    """The text of ``derivations.md``: a title, its contents and the sections the exercises need
    (each exercise's ``section``, with Notation and Gradient checking)."""
    wanted = set(ALWAYS) | {e.section for e in EXERCISES}
    chosen = [(h, t) for h, t in sections(backprop_source().read_text(encoding="utf-8"))
              if h in wanted]
    missing = wanted - {h for h, _ in chosen}
    if missing:
        raise ValueError(f"backprop.md has no section {', '.join(sorted(missing))} (an exercise's "
                         f"section in npformer.exercises.catalogue)")
    kept = {anchor(h) for h, _ in chosen}
    head = ("# Derivations for the npformer exercises\n\n"
            "The sections of npformer's docs/backprop.md that the exercises need, as the npformer\n"
            "that wrote this folder has them. Each exercise file names its section here\n"
            f"(`{DERIVATIONS}`, section \"Linear\", ...).\n\n" + DERIVE_FIRST
            + "".join(f"- [{h}](#{anchor(h)})\n" for h, _ in chosen) + "\n")
    return head + "".join(_relink(t, kept) for _, t in chosen).rstrip("\n") + "\n"
