"""``npformer exercises start``: the learner's files, made from the reference solutions by
replacing each ``# --- your code ---`` ... ``# --- end of your code ---`` block with
``raise NotImplementedError``, and written into a folder without ever replacing a file there.

A forward the learner is given that is the library's own is not copied into the solution: the
solution imports it with a ``# given, its docstring:`` comment, the docstring on the next line,
and the learner's file holds its text, written out from npformer.functional with that short
docstring (:func:`solution_source`). A backward that is the library's is imported likewise with
``# yours``: written out, its lines after those that unpack the cache are the learner's to write."""
import ast
import importlib
import inspect
import json
import os
import re
from pathlib import Path

from .catalogue import DERIVATIONS, EXERCISES
from .checker import MARKER, check_path_given
from .derivations import derivations

BEGIN, END = "# --- your code ---", "# --- end of your code ---"
HERE = Path(__file__).resolve().parent
GIVEN = re.compile(r'^from (npformer\.functional\.\w+) import (\w+)  # (given|yours), its '
                   r'docstring:\n# "(.*)"$', re.M)


def solution_source(exercise):
    """The text of ``exercise``'s solved file: the solution's, each ``# given`` or ``# yours``
    import written out as the function it imports."""
    text = (HERE / "solutions" / f"{exercise.module}.py").read_text(encoding="utf-8")
    return GIVEN.sub(_library_function, text)


def _library_function(match):
    """The source of the function a ``# given`` or ``# yours`` import names, with the docstring
    it gives; a ``# yours`` function has all but the lines that unpack its cache between the
    your-code markers."""
    module, name, kind, doc = match.groups()
    source = inspect.getsource(getattr(importlib.import_module(module), name)).rstrip("\n")
    body = ast.parse(source).body[0].body
    docstring = body[0]
    if not (isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)):
        raise ValueError(f"{module}.{name}: a function taken from the library needs a docstring")
    lines = source.splitlines()
    if kind == "yours":
        first = next(s for s in body[1:] if not _unpacks_cache(s)).lineno - 1
        indent = lines[first][:len(lines[first]) - len(lines[first].lstrip())]
        lines[first:] = [indent + BEGIN, *lines[first:], indent + END]
    lines[docstring.lineno - 1:docstring.end_lineno] = [f'    """{doc}"""']
    return "\n".join(lines)


def _unpacks_cache(statement):
    """Whether ``statement`` is ``... = cache``: given to the learner, not theirs to write."""
    return isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Name) and \
        statement.value.id == "cache"


def template(exercise, folder="DIR"):
    """The text of ``exercise``'s file as the learner gets it."""
    out, function, inside = [], None, False
    head = (f"# npformer exercise {exercise.key} of {len({e.number for e in EXERCISES})}: "
            f"{exercise.title}.\n"
            f"# Write {', '.join(exercise.writes)} below, then check it with\n"
            f"#     npformer exercises check {folder} {exercise.name}\n"
            f"# Leave the given forward as it is: the check holds it to npformer's first.\n")
    for line in _local_links(solution_source(exercise)).splitlines():
        match = re.match(r"def (\w+)\(", line)
        if match:
            function = match.group(1)
        stripped = line.strip()
        if stripped == BEGIN and exercise.staged:
            out.append(line.replace(BEGIN, "# your code: one line a step, in this order (None: "
                                           "not written yet)"))
            inside = True
        elif inside and exercise.staged and stripped != END:
            out.append(_step_left_to_write(line))
        elif stripped == BEGIN:
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}# your code here")
            out.append(f"{indent}raise NotImplementedError(\"{function}: not written yet\")")
            inside = True
        elif stripped == END:
            inside = False
        elif not inside:
            out.append(line)
    return head + "\n".join(out) + "\n"


def _step_left_to_write(line):
    """A staged solution's ``dxc = ...  # (..., D)`` as the learner gets it: ``dxc = None``,
    the comment (the shape, the values it is computed from) kept."""
    match = re.match(r"(\s*)(d\w+) = .*?(#.*)?$", line)
    if match is None:
        raise ValueError(f"a staged solution's step is not one line 'dNAME = ...': {line!r}")
    indent, name, comment = match.groups()
    return f"{indent}{name} = None" + (f"  {comment}" if comment else "")


def _local_links(source):
    """A solution's ``docs/backprop.md#linear (section "Linear")`` as the learner's file says it:
    the section of the folder's own derivations."""
    return re.sub(r'docs/backprop\.md#[\w-]+ \(section "([^"]+)"\)',
                  lambda m: f'{DERIVATIONS}, section "{m.group(1)}"', source)


def readme(folder):
    text = (HERE / "templates" / "README.md").read_text(encoding="utf-8")
    return text.replace("{docs}", DERIVATIONS).replace("{folder}", str(folder))


NOTEBOOK_FORMATS = "ipynb,py:light"      # jupytext's pairing: the notebook and the .py beside it


def jupytext_module():
    """jupytext, or a ValueError with the one command that installs it."""
    try:
        import jupytext
    except ImportError:
        raise ValueError("--notebook: jupytext is not installed (it writes the notebooks and "
                         "keeps each paired with its .py): pip install jupytext") from None
    return jupytext


def notebook_pair(text):
    """(the .py text, the .ipynb text) of a jupytext pair holding the exercise file ``text``:
    opened in Jupyter (with jupytext) either one is saved into the other."""
    jupytext = jupytext_module()
    notebook = jupytext.reads(text, fmt="py:light")
    notebook.metadata["jupytext"] = {"formats": NOTEBOOK_FORMATS}
    return jupytext.writes(notebook, fmt="py:light"), jupytext.writes(notebook, fmt="ipynb")


def files(folder, notebook=False):
    """{file name: text} of a new exercise folder; with ``notebook``, each exercise as a
    jupytext pair (its ``.ipynb`` first, so that the ``.py`` is not older)."""
    out = {}
    for e in EXERCISES:
        text = template(e, folder)
        if notebook:
            text, out[e.notebook] = notebook_pair(text)
        out[e.file] = text
    out["README.md"] = readme(folder)
    out[DERIVATIONS] = derivations()
    out[MARKER] = json.dumps({"npformer_exercises": 1,
                              "files": [e.file for e in EXERCISES]}, indent=1) + "\n"
    return out


def write_new(path, text):
    """Write ``text`` to ``path`` unless a file is there already (then leave it and return
    False). Atomic: the file appears whole, through a hard link that fails if the name exists."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:                                  # no hard links here: exclusive create
        try:
            with open(path, "x", encoding="utf-8") as f:
                f.write(text)
            return True
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)


def start(folder, overwrite=False, notebook=False):
    """Write the exercise files into ``folder`` (made if absent), with ``notebook`` each as a
    notebook too (a jupytext pair). A folder that holds anything is refused unless
    ``overwrite``, and even then no file already there is replaced. Returns (written, kept):
    the file names of each kind."""
    check_path_given(folder)
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise ValueError(f"DIR: {folder} is a file; expected a new or empty folder")
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ValueError(f"DIR: {folder} cannot be made: {above} is a file, not a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ValueError(f"DIR: {folder} is not empty; pass --overwrite to add the exercise "
                         f"files it lacks (files already there are kept, never overwritten)")
    contents = files(folder, notebook)            # all made before the folder is touched
    for name in contents:
        if (path / name).exists() and not (path / name).is_file():
            raise ValueError(f"DIR: {path / name} is a folder, not the exercise file; move it "
                             f"away, then run start --overwrite again")
    path.mkdir(parents=True, exist_ok=True)
    written, kept = [], []
    for name, text in contents.items():
        (written if write_new(path / name, text) else kept).append(name)
    return written, kept
