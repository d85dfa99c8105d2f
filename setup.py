"""The package is configured in setup.cfg; this file adds one build step: docs/backprop.md is
copied into the built ``npformer/exercises/`` so that ``npformer exercises start`` can write an
exercise folder's ``derivations.md`` from an installed (not editable) npformer too. A checkout
(``pip install -e .``) reads docs/backprop.md where it is (npformer.exercises.derivations).
MANIFEST.in puts docs/backprop.md into the sdist, so that a wheel built from the sdist (as pip
does) has it too."""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BACKPROP = Path(__file__).resolve().parent / "docs" / "backprop.md"


class BuildPy(build_py):
    """build_py, then docs/backprop.md into the built npformer/exercises/ (package data)."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):   # an editable install reads docs/
            target = Path(self.build_lib) / "npformer" / "exercises" / "backprop.md"
            self.copy_file(str(BACKPROP), str(target))


setup(cmdclass={"build_py": BuildPy})
