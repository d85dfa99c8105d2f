"""The exercise solutions copy no function of npformer.functional: a forward the learner is given
that is the library's own is imported with a ``# given, its docstring:`` comment, a backward that
is the library's with ``# yours, its docstring:``, and the learner's file (and the solved file
the tests write) holds their text, with that docstring: a ``# yours`` function's lines after the
cache's unpacking are the learner's to write."""
import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import npformer.functional
from npformer.exercises.catalogue import EXERCISES
from npformer.exercises.templates import GIVEN, solution_source, template

SOLUTIONS = Path(npformer.exercises.__file__).parent / "solutions"


def code_without_docstring(function):
    """The AST dump of a function's arguments and body, its docstring left out."""
    body = function.body[1:] if ast.get_docstring(function, clean=False) is not None else \
        function.body
    return ast.dump(function.args) + "".join(ast.dump(statement) for statement in body)


def functions(text):
    return {f.name: f for f in ast.parse(text).body if isinstance(f, ast.FunctionDef)}


def library_functions():
    """{name: code without docstring} of every top-level function of npformer.functional."""
    found = {}
    for info in pkgutil.iter_modules(npformer.functional.__path__):
        module = importlib.import_module(f"npformer.functional.{info.name}")
        found.update((name, code_without_docstring(f)) for name, f in
                     functions(Path(module.__file__).read_text(encoding="utf-8")).items())
    return found


@pytest.mark.parametrize("path", sorted(SOLUTIONS.glob("*.py")), ids=lambda p: p.stem)
def test_a_solution_copies_no_function_of_the_library(path):
    library = library_functions()
    copied = [name for name, f in functions(path.read_text(encoding="utf-8")).items()
              if library.get(name) == code_without_docstring(f)]
    assert not copied, f"{path.name} copies {copied}: import it with a '# given' or '# yours'"


TAKEN = [e for e in EXERCISES if GIVEN.search(
    (SOLUTIONS / f"{e.module}.py").read_text(encoding="utf-8"))]


def test_some_solutions_take_their_functions_from_the_library():
    assert {"softmax", "layernorm", "linear"} <= {e.module for e in TAKEN}


@pytest.mark.parametrize("exercise", TAKEN, ids=lambda e: e.name)
def test_a_function_taken_from_the_library_is_written_out_in_the_learners_file(exercise):
    source = (SOLUTIONS / f"{exercise.module}.py").read_text(encoding="utf-8")
    library = library_functions()
    solved, learners = solution_source(exercise), template(exercise)
    for text in (solved, learners):
        assert "# given" not in text and "# yours" not in text
    for module, name, kind, doc in GIVEN.findall(source):
        assert code_without_docstring(functions(solved)[name]) == library[name], name
        mine = functions(learners)[name]
        assert ast.get_docstring(mine, clean=False) == doc
        if kind == "given":
            assert code_without_docstring(mine) == library[name], name
        else:
            assert isinstance(mine.body[-1], ast.Raise), name          # NotImplementedError
