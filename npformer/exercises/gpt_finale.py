"""The GPT finale's work in the child (``check DIR --train gpt``): the learner's functions
verified on a real training step of the character model (:func:`namespace.verify`), then the model
trained twice from the same start, with the learner's passes and with the reference's, each
ending with its validation loss and a sample (:mod:`.gpt`)."""
import time
from dataclasses import asdict

import numpy as np

from . import gpt
from .namespace import pairs_of, reference_modules, verify

PROGRESS_EVERY = 50       # steps between the progress lines of each run


def preflight(learner, text, cfg, seed):
    """The first training step of a fresh model of ``seed`` through :func:`namespace.verify`: the
    findings and the usage of the learner's functions."""
    model = gpt.CharGPT(len(text.chars), cfg, seed)
    ids, targets = text.batch(np.random.default_rng(seed + 1), "train", cfg["batch_size"],
                              cfg["context"])

    def run_batch(pairs):
        gpt.train_step(pairs, model, gpt.AdamState(model), ids, targets, cfg["lr"])
    return verify(learner, "gpt", model.paths(), run_batch)


def run_gpt(learner, data, seed, steps, verdict, emit):
    """Fill ``verdict`` (the child's dict): the findings and the usage of the learner's
    functions on a real step, then ``"gpt"``: the validation loss and a sample before training
    and after each run. ``emit(record)`` gets each run's progress ({run, step, loss})."""
    text = gpt.Text.read(data)
    cfg = dict(gpt.CONFIG, **({} if steps is None else {"steps": steps}))
    findings, usage = preflight(learner, text, cfg, seed)
    verdict["findings"] = [asdict(f) for f in findings]
    verdict["usage"] = [asdict(u) for u in usage]
    runs = {"yours": pairs_of(learner, "gpt"),
            "reference": pairs_of(reference_modules("gpt"), "gpt")}
    start = gpt.CharGPT(len(text.chars), cfg, seed)
    figures = {"before": {"valid_loss": gpt.validation_loss(runs["reference"], start, text, cfg),
                          "sample": gpt.sample(runs["reference"], start, text, cfg, seed)},
               "steps": cfg["steps"], "n_chars": int(len(text.train) + len(text.valid))}
    for name, fns in runs.items():
        began = time.monotonic()

        def on_step(step, loss, name=name):
            if step % PROGRESS_EVERY == 0 or step == cfg["steps"]:
                emit({"run": name, "step": step, "loss": loss})
        trained, losses = gpt.train(fns, text, cfg, seed, on_step)
        figures[name] = {"valid_loss": gpt.validation_loss(fns, trained, text, cfg),
                         "train_loss": float(np.mean(losses[-10:])),
                         "seconds": time.monotonic() - began,
                         "sample": gpt.sample(fns, trained, text, cfg, seed)}
    verdict["gpt"] = figures
