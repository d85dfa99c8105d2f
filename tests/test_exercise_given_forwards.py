"""The exercise solutions copy no function of npformer.functional that the learner is given: a
forward that is the library's own is imported with a ``# given, its docstring:`` comment, and
the learner's file (and the solved file the tests write) holds its text, with that docstring."""
import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import npformer.functional
from npformer.exercises.catalogue import EXERCISES
from npformer.exercises.templates import BEGIN, GIVEN, solution_source, template

SOLUTIONS = Path(npformer.exercises.__file__).parent / "solutions"


def code_without_docstring(function):
    """The AST dump of a function's definition, its docstring left out."""
    body = function.body[1:] if ast.get_docstring(function, clean=False) is not None else \
        function.body
    return ast.dump(function.args) + "".join(ast.dump(statement) for statement in body)


def library_functions():
    """{name: code without docstring} of every top-level function of npformer.functional."""
    found = {}
    for info in pkgutil.iter_modules(npformer.functional.__path__):
        module = importlib.import_module(f"npformer.functional.{info.name}")
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        found.update((f.name, code_without_docstring(f)) for f in tree.body
                     if isinstance(f, ast.FunctionDef))
    return found


@pytest.mark.parametrize("path", sorted(SOLUTIONS.glob("*.py")), ids=lambda p: p.stem)
def test_a_solution_copies_no_function_of_the_library(path):
    library = library_functions()
    text = path.read_text(encoding="utf-8")
    given = [f for f in ast.parse(text).body if isinstance(f, ast.FunctionDef)
             and BEGIN not in ast.get_source_segment(text, f)]      # no code for the learner
    copied = [f.name for f in given if library.get(f.name) == code_without_docstring(f)]
    assert not copied, f"{path.name} copies {copied}: import it with a '# given' comment"


GIVEN_EXERCISES = [e for e in EXERCISES if GIVEN.search(
    (SOLUTIONS / f"{e.module}.py").read_text(encoding="utf-8"))]


def test_some_solutions_take_their_forward_from_the_library():
    assert {"softmax", "layernorm", "linear"} <= {e.module for e in GIVEN_EXERCISES}


@pytest.mark.parametrize("exercise", GIVEN_EXERCISES, ids=lambda e: e.name)
def test_a_given_forward_is_written_out_in_the_learners_file(exercise):
    source = (SOLUTIONS / f"{exercise.module}.py").read_text(encoding="utf-8")
    library = library_functions()
    for text in (template(exercise), solution_source(exercise)):
        assert "# given" not in text
        written = {f.name: f for f in ast.parse(text).body if isinstance(f, ast.FunctionDef)}
        for module, name, doc in GIVEN.findall(source):
            assert code_without_docstring(written[name]) == library[name], name
            assert ast.get_docstring(written[name], clean=False) == doc
