"""Exercises: write each layer's backward pass yourself, have it checked, then train the toy
translator, or a character model, with your own code (``npformer exercises``; README,
"Exercises").

- :mod:`.catalogue`: the exercises, the inputs each is checked on, the mistakes recognised;
- :mod:`.solutions`: the reference solutions, from which :mod:`.templates` makes the files;
- :mod:`.derivations`: the folder's ``derivations.md``, the sections of docs/backprop.md;
- :mod:`.learner`: the learner's code as the checks call it (the verdict, one-line errors,
  the reference solutions, the forward held against the given one);
- :mod:`.checker`: the checks, in a child process (:mod:`.runner`) under the time and memory
  limits that :mod:`.child` holds from outside it;
- :mod:`.namespace` and :mod:`.finale`: the learner's pairs as a backend, each function
  verified on a real training step, and the toy translator's training (``--train``);
- :mod:`.gpt` and :mod:`.gpt_finale`: the character model of ``--train gpt``.
"""
from .catalogue import DERIVATIONS, EXERCISES, find
from .checker import check_exercise, check_folder
from .learner import ExerciseResult

__all__ = ["DERIVATIONS", "EXERCISES", "ExerciseResult", "check_exercise", "check_folder", "find"]
