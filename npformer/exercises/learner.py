"""The learner's code as the checks call it: the verdict on one exercise
(:class:`ExerciseResult`), the ways a learner's function stops a check (:class:`NotDone`,
:class:`LearnerError`, the time limit's :class:`Timeout`), the call that turns whatever it raised
into one line (:func:`call_learner`), the reference solutions (:func:`solution`) and the test that
the given forward was left as it was (:func:`forward_changed`). :mod:`.checker` (whole layers) and
:mod:`.stepcheck` (staged chains) both judge through these."""
import importlib
import json
import math
import os
import traceback
from dataclasses import dataclass, field

import numpy as np

from .child import memory_message

FORWARD_RTOL = 1e-9                   # a forward this close to the given one is the given one


@dataclass
class ExerciseResult:
    """The verdict on one exercise: ``status`` (one of ``STATUSES``), a one-line ``message``
    (for "error", "timed out" and "not done"), the per-case ``reports`` [(label, text)] and the
    ``hints``: each the symptom and where to look, with ``more[hint]`` = [idea, formula], the
    next two levels, for a mistake the catalogue names."""

    name: str
    status: str
    message: str = ""
    reports: list = field(default_factory=list)
    hints: list = field(default_factory=list)
    worst: float = None                 # the largest tensor error over the cases (None: none)
    note: str = ""                      # what kept a case unmeasured: "forward" (the given
                                        # forward was changed), "shape" (a gradient's) or ""
    more: dict = field(default_factory=dict)    # hint -> [idea, formula]
    read: str = ""                      # the file checked, where it is not the exercise's .py

    def to_json(self):
        return json.dumps({"name": self.name, "status": self.status, "message": self.message,
                           "reports": self.reports, "hints": self.hints, "worst": self.worst,
                           "note": self.note, "more": self.more, "read": self.read})

    @classmethod
    def from_record(cls, d):
        return cls(d["name"], d["status"], d["message"], [tuple(r) for r in d["reports"]],
                   d["hints"], d["worst"], d.get("note", ""), d.get("more", {}), d.get("read", ""))

    def add_mistake(self, mistake):
        """Name ``mistake`` (a catalogue :class:`Mistake`) once among the hints."""
        if mistake.symptom not in self.hints:
            self.hints.append(mistake.symptom)
        if mistake.idea or mistake.formula:
            self.more[mistake.symptom] = [mistake.idea, mistake.formula]


class LearnerError(Exception):
    """The learner's code cannot be checked (a syntax error, a wrong number of gradients, an
    exception): the message is the one line the learner reads."""


class NotDone(Exception):
    """A function the learner still has to write raised NotImplementedError."""


class Timeout(BaseException):
    """An exercise ran past its time limit (a BaseException, so that the learner's
    ``except Exception`` cannot swallow it)."""


def learner_error(e, path, function, during="", hint=""):
    """The LearnerError for an exception ``e`` that the learner's ``function`` ('' on import)
    raised: one line, whatever it was (a KeyboardInterrupt, a MemoryError, a SystemExit too)."""
    head = f"{path.name}{where_in(e, path)}: " + (f"{function} " if function else "")
    if isinstance(e, MemoryError):
        return LearnerError(f"{head}{memory_message()}{during}")
    return LearnerError(f"{head}raised {type(e).__name__}{during}: {first_line(e)}{hint}")


def first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def where_in(e, path):
    """' line N' of the deepest frame of the traceback in the learner's file ('' if none)."""
    line = None
    for frame in traceback.extract_tb(e.__traceback__):
        if os.path.realpath(frame.filename) == os.path.realpath(str(path)):
            line = frame.lineno
    return f" line {line}" if line else ""


def solution(exercise):
    """The reference solution's module of ``exercise``."""
    return importlib.import_module(f"{__package__}.solutions.{exercise.module}")


def call_learner(path, fname, fn, *args, hints=None):
    """fn(*args), the learner's exceptions turned into NotDone / LearnerError; ``hints``
    ({exception type: text}) adds a hint to the message of an exception of that type."""
    try:
        return fn(*args)
    except Timeout:
        raise
    except NotImplementedError:
        raise NotDone(f"{fname} is still to be written (it raises NotImplementedError)") from None
    except (NotDone, LearnerError):
        raise
    except BaseException as e:
        hint = next((f" ({text})" for kind, text in (hints or {}).items()
                     if isinstance(e, kind)), "")
        raise learner_error(e, path, fname, hint=hint) from None


def differs(mine, given, where):
    """How ``mine`` (what the learner's forward returned: its output, its cache or a part of
    it) differs from ``given`` (the given forward's on the same inputs): a phrase, or None."""
    if isinstance(given, dict):                  # a staged exercise's cache: values by name
        if not isinstance(mine, dict) or list(mine) != list(given):
            return f"{where} is not the given forward's (a dict of {', '.join(map(str, given))})"
        return next(filter(None, (differs(mine[k], given[k], f"{where}[{k!r}]")
                                  for k in given)), None)
    if isinstance(given, (tuple, list)):
        if not isinstance(mine, (tuple, list)) or len(mine) != len(given):
            return f"{where} is not the given forward's (a {type(given).__name__} of {len(given)})"
        return next(filter(None, (differs(a, b, f"{where}[{i}]")
                                  for i, (a, b) in enumerate(zip(mine, given)))), None)
    if isinstance(given, np.random.Generator):
        return None
    if given is None or isinstance(given, (str, bool, np.dtype)):
        if type(mine) is type(given) and mine == given:
            return None
        return f"{where} is {mine!r}; the given forward's is {given!r}"
    try:
        a, b = np.asarray(mine, dtype=np.float64), np.asarray(given, dtype=np.float64)
    except (TypeError, ValueError):
        return f"{where} is a {type(mine).__name__}; the given forward's is a number or an array"
    if a.shape != b.shape:
        return f"{where} has shape {a.shape}; the given forward's has {b.shape}"
    finite = np.isfinite(b)
    same_rest = np.array_equal(a[~finite], b[~finite], equal_nan=True)   # inf, nan where given
    if same_rest and relative_error(a[finite], b[finite]) <= FORWARD_RTOL:
        return None
    if a.ndim == 0:
        return f"{where} is {a.item():.6g}; the given forward's is {b.item():.6g}"
    error = relative_error(a, b)
    return f"{where} differs from the given forward's " + (
        f"(by up to {error:.2g} of its largest entry)" if math.isfinite(error)
        else "(NaN or inf where the given forward's is finite, or the reverse)")


def forward_changed(case, reference, seen, fname):
    """None if the learner's forward, as ``seen`` on the case's inputs, returned what the given
    (reference) forward returns on them, output and cache alike; else the one line saying how
    it was changed."""
    forward = fname.replace("backward", "forward")
    out, cache = seen["forward"]
    ref_out, ref_cache = case.forward(reference, *[x.copy() for x in case.inputs])
    found = differs(out, np.asarray(ref_out, dtype=np.float64), "output") or \
        differs(cache, ref_cache, "cache")
    return None if found is None else f"your forward was changed: {forward}'s {found}"


def relative_error(a, b):
    """max |a - b| / max |b| (inf where not finite)."""
    scale = max(float(np.abs(b).max(initial=0.0)), 1e-300)
    err = float(np.abs(np.asarray(a, dtype=np.float64) - b).max(initial=0.0)) / scale
    return err if math.isfinite(err) else math.inf
