"""``npformer exercises check DIR --train``: the toy translator of ``npformer toy`` trained with
the learner's own backward passes, and, where it fails, the layer to look at."""
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import backend
from ..training.toy import run_toy, toy_trainer
from .catalogue import EXERCISES, find
from .checker import check_folder, load_learner, solution, TIMEOUT
from .namespace import Shadow, build, module_paths, pairs_of, trained_exercises

BACKEND_NAME = "exercises"
TARGET = 0.99             # the toy reaches 1.000 train exact match in its 14 epochs


@dataclass
class FinaleResult:
    checks: list                     # the ExerciseResult of every exercise
    findings: list = field(default_factory=list)    # namespace.Finding, in the backward's order
    toy: object = None               # training.toy.ToyResult (None if training raised)
    error: str = ""                  # why training stopped, if the learner's code raised

    @property
    def ok(self):
        return (self.toy is not None and not self.findings and not self.error
                and self.toy.summary["stop_reason"] != "non_finite")


def modules_of(folder):
    """The learner's modules of the exercises the finale trains with. The attention file
    imports npformer's softmax and dropout (so that it is checked alone); here its names are
    pointed at the learner's own, so that training runs the learner's softmax too."""
    modules = {e.name: load_learner(Path(folder) / e.file) for e in trained_exercises()}
    attention = modules["attention"]
    for exercise in ("softmax", "dropout"):
        for name in find(exercise).provides:
            if hasattr(attention, name):
                setattr(attention, name, getattr(modules[exercise], name))
    return modules


def reference_modules():
    return {e.name: solution(e) for e in trained_exercises()}


def refuse_unfinished(checks):
    """ValueError (one line) unless every exercise the finale trains with can run, with the
    given forward passes (the finale trains the toy model, not another)."""
    blocked = [r for r in checks if (r.status in ("not done", "error", "timed out")
                                     or r.note == "forward")
               and any(e.name == r.name and e.trained for e in EXERCISES)]
    if blocked:
        raise ValueError("the finale trains with your " + ", ".join(e.name for e in trained_exercises())
                         + ": finish " + ", ".join(
                             f"{r.name} ({'its forward was changed' if r.note == 'forward' else r.status})"
                             for r in blocked) + " first")


def preflight(learner, seed, model_kwargs, train_kwargs):
    """One training batch of a fresh toy model through :class:`namespace.Shadow`: the findings,
    or the error the learner's code raised."""
    trainer, _ = toy_trainer(seed, model_kwargs, {**(train_kwargs or {}), "out_dir": None,
                                                  "quiet": True})
    shadow = Shadow(pairs_of(learner), pairs_of(reference_modules()), module_paths(trainer.model))
    batch = next(iter(trainer.task.batches(0)))
    trainer.model.train()
    with backend.using(build(shadow.pairs()), BACKEND_NAME):
        trainer.task.loss_and_backward(trainer.model, batch, 1.0)
    return list(shadow.findings.values())


def describe(error, folder):
    """One line for an exception the learner's code raised during training."""
    import traceback
    where = ""
    for frame in traceback.extract_tb(error.__traceback__):
        if Path(frame.filename).parent.resolve() == Path(folder).resolve():
            where = f" ({Path(frame.filename).name} line {frame.lineno}, in {frame.name})"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}{where}"


def run_finale(folder, seed=0, epochs=None, out_dir=None, quiet=True, on_eval=None,
               timeout=TIMEOUT, checks=None, n_examples=3):
    """Check every exercise (or take ``checks``), then train the toy translator with the
    learner's pairs: a :class:`FinaleResult`. ValueError if an exercise it trains with is not
    done or does not run."""
    checks = check_folder(folder, timeout=timeout) if checks is None else checks
    refuse_unfinished(checks)
    learner = modules_of(folder)
    train_kwargs = {} if epochs is None else {"epochs": epochs}
    result = FinaleResult(checks)
    try:
        result.findings = preflight(learner, seed, None, train_kwargs)
        with tempfile.TemporaryDirectory(prefix="npformer-finale-") as tmp, \
                backend.using(build(pairs_of(learner)), BACKEND_NAME):
            result.toy = run_toy(seed=seed, train_kwargs=train_kwargs,
                                 out_dir=out_dir or tmp, quiet=quiet, on_eval=on_eval,
                                 n_examples=n_examples)
    except Exception as e:              # the learner's code, inside the model
        result.error = describe(e, folder)
    return result
