"""``npformer exercises check DIR --train [toy|gpt]``: the toy translator of ``npformer toy``
(or, through :mod:`.gpt_finale`, a character model) trained with the learner's own passes.
Before training, :func:`verify` runs every learner function on a real training step beside the
reference's: which ran, how often, and the first that disagreed, the function to look at.

The training runs in a child process (:mod:`.child`, :func:`train_child`) under a wall-clock
limit: a slow or looping backward, a crash or an exit of the learner's code ends the finale
with one line, never npformer itself."""
import contextlib
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import backend
from ..training.toy import run_toy, toy_trainer
from ..validation import check_int
from .catalogue import find
from .checker import check_folder, load_learner
from .child import GRACE, MEMORY, TIMEOUT, TRAIN_TIMEOUT, check_limits, memory_message, run
from .learner import LearnerError
from .namespace import (FINALES, Finding, Usage, build, module_paths, pairs_of,
                        trained_exercises, verify)

BACKEND_NAME = "exercises"
TARGET = 0.99             # the toy reaches 1.000 train exact match in its 14 epochs


@dataclass
class ToySummary:
    """What the finale reports of the toy's run (training.toy.ToyResult's figures)."""

    train_exact_match: float
    heldout_exact_match: float
    n_train: int
    n_heldout: int
    train_seconds: float
    steps: int
    stop_reason: str
    examples: list                   # (source, reference, hypothesis)


@dataclass
class FinaleResult:
    checks: list                     # the ExerciseResult of every exercise
    findings: list = field(default_factory=list)    # namespace.Finding, in the backward's order
    usage: list = field(default_factory=list)       # namespace.Usage of every function trained with
    toy: object = None               # ToySummary (None if training stopped)
    gpt: dict = None                 # the GPT's figures and samples (gpt_finale.run_gpt)
    error: str = ""                  # why training stopped (one line), if it did

    @property
    def ok(self):
        trained = (self.gpt is not None if self.toy is None else
                   self.toy.stop_reason != "non_finite")
        return (trained and not self.findings and not self.error
                and all(u.status in ("agreed", "not used") for u in self.usage))


def modules_of(folder, finale="toy"):
    """The learner's modules of the exercises finale ``finale`` trains with. A file that
    imports npformer's function of another of them (the attention file's softmax and dropout,
    so that it is checked alone) has that name pointed at the learner's own here, so that
    training runs the learner's softmax too."""
    modules = {e.name: load_learner(Path(folder) / e.file) for e in trained_exercises(finale)}
    for name, module in modules.items():
        for other, theirs in modules.items():
            for function in find(other).provides if other != name else ():
                if hasattr(module, function):
                    setattr(module, function, getattr(theirs, function))
    return modules


def refuse_unfinished(checks, finale="toy"):
    """ValueError (one line) unless every exercise finale ``finale`` trains with can run, with
    the given forward passes (the finale trains its model, not another)."""
    names = [e.name for e in trained_exercises(finale)]
    blocked = [r for r in checks if (r.status in ("not done", "error", "timed out")
                                     or r.note == "forward") and r.name in names]
    if blocked:
        why = [f"{r.name} ({'its forward was changed' if r.note == 'forward' else r.status})"
               for r in blocked]
        raise ValueError(f"the finale (--train {finale}) trains with your " + ", ".join(names)
                         + ": finish " + ", ".join(why) + " first")


def preflight(learner, seed, model_kwargs, train_kwargs):
    """One training step of a fresh toy model, its batch the first of training, through
    :func:`verify`: the findings and the usage, or the error the learner's code raised."""
    trainer, _ = toy_trainer(seed, model_kwargs, {**(train_kwargs or {}), "out_dir": None,
                                                  "quiet": True})
    batch = next(iter(trainer.task.batches(0)))
    trainer.model.train()

    def run_batch(pairs):
        with backend.using(build(pairs), BACKEND_NAME):
            trainer.train_step(batch)
    return verify(learner, "toy", module_paths(trainer.model), run_batch)


def describe(error, folder):
    """One line for an exception the learner's code raised during training."""
    import traceback
    where = ""
    for frame in traceback.extract_tb(error.__traceback__):
        if Path(frame.filename).parent.resolve() == Path(folder).resolve():
            where = f" ({Path(frame.filename).name} line {frame.lineno}, in {frame.name})"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}{where}"


def run_finale(folder, seed=0, epochs=None, on_eval=None, timeout=TIMEOUT,
               train_timeout=TRAIN_TIMEOUT, memory=MEMORY, checks=None, finale="toy", data=None,
               steps=None):
    """Check every exercise (or take ``checks``), then train finale ``finale``'s model with the
    learner's pairs in a child process, under ``train_timeout`` seconds and ``memory`` MiB:
    a :class:`FinaleResult`. ``on_eval(record)`` gets each evaluation (the toy: epoch, step,
    loss and exact_match; the GPT, trained from the text file ``data`` for ``steps`` steps:
    run, step and loss) as they come. ValueError if an exercise it trains with is not done or
    does not run, or a limit is out of range."""
    train_timeout, memory = check_limits(train_timeout, memory, "train_timeout")
    seed, epochs = check_int("seed", seed, 0), check_int("epochs", epochs, 1, allow_none=True)
    steps = check_int("steps", steps, 1, allow_none=True)
    if finale not in FINALES:
        raise ValueError(f"finale: expected one of {', '.join(FINALES)}, got {finale!r}")
    checks = check_folder(folder, timeout=timeout, memory=memory) if checks is None else checks
    refuse_unfinished(checks, finale)
    verdict = {}

    def on_record(record):
        if "started" in record:
            return train_timeout
        if "eval" in record and on_eval is not None:
            on_eval(record["eval"])
        if "finale" in record:
            verdict.update(record["finale"])
            return GRACE
        return None
    # the toy's run goes into a folder made and removed here: the child may be killed at its
    # limit, or exit without cleaning up, and leave nothing behind
    scratch = tempfile.mkdtemp(prefix="npformer-finale-")
    try:
        code = run(["train", "--memory", str(memory), "--seed", str(seed), "--finale", finale,
                    "--scratch", scratch, *([] if epochs is None else ["--epochs", str(epochs)]),
                    *([] if steps is None else ["--steps", str(steps)]),
                    *([] if data is None else ["--data", str(data)]), "--", str(folder)],
                   on_record)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = FinaleResult(checks)
    if not verdict:
        result.error = (f"still running after {train_timeout:g} s (the limit, --train-timeout; "
                        f"the training with the reference passes takes a small part of it: is "
                        f"a backward pass slow or looping?)" if code is None else
                        f"your code ended the training process (exit status {code}) before it "
                        f"finished")
        return result
    result.error = verdict["error"]
    result.findings = [Finding(**f) for f in verdict["findings"]]
    result.usage = [Usage(**u) for u in verdict["usage"]]
    result.toy = None if verdict["toy"] is None else ToySummary(**verdict["toy"])
    result.gpt = verdict["gpt"]
    return result


def train_child(folder, seed, epochs, out, finale="toy", data=None, steps=None, scratch=None):
    """The finale's training, in the child: a JSON line when it starts, one per evaluation
    ({"eval": ...}), then the verdict ({"finale": ...}: the error, the findings, the usage,
    the toy's figures or the GPT's). The toy's run is written into ``scratch`` (a folder the
    parent removes; a temporary one here where none is given)."""
    def emit(record):
        out.write(json.dumps(record) + "\n")
        out.flush()

    def on_eval(rec):
        emit({"eval": {"epoch": int(rec["epoch"]), "step": int(rec["step"]),
                       "loss": float(rec["loss"]), "exact_match": float(rec["exact_match"])}})
    emit({"started": "training"})
    verdict = {"error": "", "findings": [], "usage": [], "toy": None, "gpt": None}
    train_kwargs = {} if epochs is None else {"epochs": epochs}
    try:
        learner = modules_of(folder, finale)
        if finale == "gpt":
            from .gpt_finale import run_gpt
            run_gpt(learner, data, seed, steps, verdict, lambda rec: emit({"eval": rec}))
        else:
            findings, usage = preflight(learner, seed, None, train_kwargs)
            verdict["findings"] = [asdict(f) for f in findings]
            verdict["usage"] = [asdict(u) for u in usage]
            with _scratch(scratch) as tmp, backend.using(build(pairs_of(learner)), BACKEND_NAME):
                toy = run_toy(seed=seed, train_kwargs=train_kwargs, out_dir=tmp, quiet=True,
                              on_eval=on_eval, n_examples=3)
            verdict["toy"] = asdict(ToySummary(
                float(toy.train_exact_match), float(toy.heldout_exact_match),
                len(toy.data.train), len(toy.data.heldout), float(toy.train_seconds),
                int(toy.summary["step"]), str(toy.summary["stop_reason"]),
                [list(e) for e in toy.examples]))
    except LearnerError as e:             # a file that cannot be loaded
        verdict["error"] = str(e)
    except MemoryError:
        verdict["error"] = f"the training (the model and your code) {memory_message()}"
    except BaseException as e:            # the learner's code, inside the model (an exit too)
        verdict["error"] = f"your code raised {describe(e, folder)}"
    emit({"finale": verdict})


def _scratch(folder):
    """A context giving ``folder`` (the parent's, which it removes) or, where none is given, a
    temporary folder removed on exit."""
    if folder is None:
        return tempfile.TemporaryDirectory(prefix="npformer-finale-")
    return contextlib.nullcontext(folder)
