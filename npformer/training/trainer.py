"""The training loop, for any task: updates (gradient accumulation, clipping, the learning-rate
schedule, the optimizer), periodic validation, a metrics log and a progress bar, best/last/
step checkpoints with bit-exact resuming, early stopping and a time budget.

    trainer = Trainer(model, task, TrainConfig(epochs=10))
    summary = trainer.fit()                      # {'step': ..., 'best_loss': ..., ...}

The task (``npformer.training.task``) brings the data, the loss and the metrics; this module
imports nothing of any task (``npformer.training.translation`` is translation's).
``accum_steps`` sums the gradients of several batches before one update, ``eval_every_steps``
validates inside an epoch, ``save_every_steps`` checkpoints without validating, ``time_budget``
caps the wall time, and ``keep_last`` keeps the last N ``step_<N>`` checkpoints for averaging
(``npformer.training.averaging``). The collective operations (``npformer.training.collective``)
are where a data-parallel run plugs in. The run's configuration (``TrainConfig``, the schedules)
is ``npformer.training.train_config``'s, the checks of a checkpointed training state and the
``step_<N>`` files ``npformer.training.training_state``'s; both are importable from here.
"""
import dataclasses
import math
import os
import time
import warnings

import numpy as np

from .. import runtime
from ..backend import ops
from ..optim import Adam, AdamW, clip_grad_norm
from ..optim.schedules import WarpedSchedule
from .checkpointing import (LoadedCheckpoint, check_compatible, load_model_checkpoint,
                            restore_training_state, save_model_checkpoint)
from .collective import EveryRankError, SingleProcess, weights_check
from .early_stopping import EarlyStopping
from .grad_norms import layer_grad_norms
from .metrics_log import MetricsLog
from .progress import progress_bar
from .task import Task
from .train_config import (  # noqa: F401  (all importable from here, as before)
    DECAY, SCHEDULES, SPANNING, SPANNING_SCHEDULES, TrainConfig, make_schedule)
from .training_state import check_training_state, step_checkpoints


class TrainingDiverged(ValueError):
    """Training met a non-finite loss or gradient norm and stopped without applying that update."""


class Trainer:
    """Trains ``model`` on ``task`` (a ``npformer.training.task.Task``). See ``TrainConfig``."""

    def __init__(self, model, task, config=None, extra=None, collective=None):
        """``extra`` is saved in every checkpoint's metadata (e.g. the languages and tokenizer of
        the run); ``collective`` is a data-parallel run's exchange (default: one process)."""
        if not isinstance(task, Task):
            raise ValueError(f"task: expected a npformer.training.task.Task (e.g. a "
                             f"TranslationTask), got {type(task).__name__}")
        self.model, self.task = model, task
        config = config or TrainConfig()
        if config.stop_metric is None:       # the task's first metric, in a copy: the caller's
            config = dataclasses.replace(config, stop_metric=task.metrics[0])   # stays as given
        self.config = config
        self.extra = extra
        task.check_model(model)
        if config.stop_metric not in task.metrics:
            raise ValueError(f"stop_metric: expected one of the {task.name} task's metrics "
                             f"{task.metrics}, got {config.stop_metric!r}")
        opt_cls = AdamW if config.optimizer == "adamw" else Adam
        self.optimizer = opt_cls(model, lr=config.lr, betas=config.betas, eps=1e-9,
                                 weight_decay=config.weight_decay, decay=DECAY[config.decay])
        self.set_collective(collective or SingleProcess())
        if config.schedule == "plateau" and not (task.has_validation and "loss" in task.metrics):
            raise ValueError(f"schedule: 'plateau' watches the validation loss, and the "
                             f"{task.name} task has {'no validation data' if not task.has_validation else 'no loss metric'}")
        minimize = config.stop_metric in task.minimize
        self.stopper = EarlyStopping(config.patience, "min" if minimize else "max")
        self.best_value = self.stopper.best      # metric of the weights in ``best`` (any validation)
        self.step, self.epoch = 0, 0
        self.grad_norm = None                    # of the latest train_step, before clipping
        self.layer_grad_norms = None             # {layer: norm} of an update to log, before clipping
        self._failure = None                     # why fit stopped without an update (non-finite)
        self.saved_step = None                   # step of the latest checkpoint written (or resumed)
        self.seconds_before = 0.0               # wall time of earlier sessions (resumed runs)
        self.history = []                       # validation records
        self.log = None
        self._fingerprint = None                # task.fingerprint(), once asked for
        self._validated_at = None               # step of the latest validation
        self.bit_exact_resume = True            # False once resumed with other kernel variants

    def set_collective(self, collective):
        """Train as one process of a data-parallel run (``npformer.training.collective``); call it
        before ``resume`` and ``fit``. An update then consumes ``accum_steps`` batches on every
        process, so an epoch holds that many times fewer updates (the schedule follows)."""
        self.collective = collective
        per_epoch = math.ceil(self.task.batches_per_epoch()
                              / (self.config.accum_steps * collective.size))
        self._set_total_steps(self.config.max_steps or self.config.epochs * per_epoch)

    def _set_total_steps(self, total_steps, warps=()):
        """The number of updates the schedule spans (a cosine or linear decay falls over them),
        and the stretches of its rest that resumes on another number of processes made
        (``warps``)."""
        self.total_steps, self.schedule_warps = total_steps, [list(w) for w in warps]
        schedule = make_schedule(self.config, total_steps)
        self.schedule = WarpedSchedule(schedule, self.schedule_warps) if warps else schedule

    def _resume_schedule(self, total_steps, warps, ranks):
        """A resumed run keeps the schedule it began with (no jump in the rate). On another
        number of processes an epoch holds another number of updates: a schedule that spans the
        run (cosine or linear, over epochs) then has its rest stretched over the updates left, so
        that it still ends at min_lr with the last one."""
        cfg, size = self.config, self.collective.size
        warps = [list(w) for w in warps]
        if ranks != size and cfg.schedule in SPANNING and cfg.max_steps is None:
            per_update = cfg.accum_steps * size
            per_epoch = self.task.batches_per_epoch()
            left_now = (math.ceil((per_epoch - self.task.batches_done()) / per_update)
                        + (cfg.epochs - self.epoch - 1) * math.ceil(per_epoch / per_update))
            left_then = WarpedSchedule.unwarp(total_steps, warps) - self.step
            if left_now > 0 and left_then > 0:
                warps.append([self.step, left_then / left_now])
        self._set_total_steps(total_steps, warps)

    @property
    def out_dir(self):
        """Where this process writes checkpoints and the metrics log: the config's ``out_dir`` on
        the first process of a run, nowhere on the others."""
        return self.config.out_dir if self.collective.is_root else None

    # -- one update ------------------------------------------------------------------------------
    def _logs(self, step):
        """Whether update ``step`` is logged (a "train" record, with its per-layer norms)."""
        return step % self.config.log_every == 0

    def train_step(self, batch):
        """One update from ``batch`` (or a list of batches, accumulated): every batch's loss and
        backward, weighted by its share of the update's tokens; the collective reduction; then
        clipping, the schedule and the optimizer. Returns the update's loss (the token-weighted
        mean) and leaves the gradient norm before clipping in ``self.grad_norm``.

        If the loss or the gradient norm is not finite, the update is NOT applied (the weights,
        the optimizer and ``self.step`` stay as they were) and ``fit`` stops on it.
        """
        model, cfg = self.model, self.config
        batches = list(batch) if isinstance(batch, (list, tuple)) else [batch]
        counts = [self._tokens(b) for b in batches]
        n_total = self.collective.total_tokens(sum(counts))
        if n_total == 0:                         # (every process sees the same n_total)
            raise EveryRankError(f"task {self.task.name!r}, step {self.step + 1}: its batches hold no "
                        f"tokens at all (tokens() gave 0 for every one); nothing to learn from")
        model.zero_grad()
        if self.collective.size > 1:             # this process's masks: from (seed, rank, step)
            seed = self.collective.dropout_seed(cfg.seed, self.step + 1)
            model.rng.bit_generator.state = type(model.rng.bit_generator)(seed).state
        loss = 0.0
        for b, n in zip(batches, counts):
            weight = n / n_total                 # this batch's share of the update's tokens
            loss_sum = self.task.loss_and_backward(model, b, weight)
            loss += (loss_sum / n) * weight if n else 0.0
        loss, self.grad_norm = self.collective.reduce(model, loss)    # the norm before clipping
        if self.collective.is_root and self._logs(self.step + 1):
            self.layer_grad_norms = layer_grad_norms(model)    # the reduced gradient's, for the log
        if cfg.clip_norm is not None:
            clip_grad_norm(model, cfg.clip_norm, norm=self.grad_norm)
        if not (math.isfinite(loss) and math.isfinite(self.grad_norm)):
            return float(loss)                   # no update from non-finite values
        self.step += 1
        self.optimizer.lr = self.schedule(self.step)
        self.optimizer.step()
        return float(loss)

    def _tokens(self, batch):
        """The task's token count of ``batch``, after checking the batch is of its type."""
        task, step = self.task, self.step + 1
        if not isinstance(batch, task.batch_type):
            raise ValueError(f"task {task.name!r}, step {step}: batches() gave a "
                             f"{type(batch).__name__}, expected a {task.batch_type.__name__}")
        n = task.tokens(batch)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"task {task.name!r}, step {step}: tokens() gave {n!r}, expected "
                             f"a count >= 0")
        return int(n)

    def evaluate(self):
        """The task's metrics for the current weights (in eval mode, restored afterwards). In a
        data-parallel run every process calls it: the first evaluates, on the cores of its
        machine's processes, and the others receive its record (or its error: then every
        process raises)."""
        record = None
        if self.collective.is_root:
            try:
                with self.collective.alone(), self.model.evaluating():
                    record = self.task.evaluate(self.model)
            except Exception as e:               # the others are waiting for the record
                record = e
        return self.collective.share(record)

    # -- checkpoints -----------------------------------------------------------------------------
    def training_state(self):
        # "sampler": the task's position in its epoch (a translation task's batch sampler)
        return {"step": self.step, "epoch": self.epoch, "sampler": self.task.state_dict(),
                "early_stopping": self.stopper.state_dict(), "config": self.config.to_dict(),
                "seconds": self.elapsed(), "data_crc32": self.data_fingerprint(),
                "best_value": self.best_value if math.isfinite(self.best_value) else None,
                "world_size": self.collective.size, "total_steps": self.total_steps,
                "schedule_warps": self.schedule_warps,
                **({"schedule": self.schedule.state_dict()}
                   if hasattr(self.schedule, "state_dict") else {})}

    def data_fingerprint(self):
        """The task's data fingerprint (computed once: the data are fixed). A resume compares
        it with the checkpoint's, so other data cannot continue a run."""
        if self._fingerprint is None:
            self._fingerprint = self.task.fingerprint()
        return self._fingerprint

    def elapsed(self):
        """Wall time of this run so far, earlier sessions of a resumed run included."""
        start = getattr(self, "_start", None)
        return self.seconds_before + (time.perf_counter() - start if start is not None else 0.0)

    def save(self, path):
        if not np.isfinite(self.model.flat_params).all():
            raise TrainingDiverged(f"step {self.step}: the weights hold non-finite values; "
                                   f"refusing to write them to {path}")
        self.saved_step = self.step
        return save_model_checkpoint(path, self.model, self.task.vocabs, self.optimizer,
                                     self.training_state(), extra=self.extra)

    def _save_run(self, name):
        """Checkpoint ``name`` of the run folder: written by the first process, and counted as
        saved on every process (their messages agree on the latest checkpoint)."""
        if not self.config.out_dir:
            return
        if self.out_dir:
            self.save(os.path.join(self.out_dir, name))
        self.saved_step = self.step

    def _save_step_checkpoint(self):
        """``step_<N>``, keeping the last ``keep_last`` of them (all if keep_last is None)."""
        self._save_run(f"step_{self.step}")
        if not self.out_dir:
            return
        if self.config.keep_last:
            for path in step_checkpoints(self.out_dir)[:-self.config.keep_last]:
                for suffix in (".npz", ".json"):
                    if os.path.exists(path + suffix):
                        os.remove(path + suffix)

    def step_checkpoints(self):
        """Paths (without suffix) of the kept ``step_<N>`` checkpoints, oldest first."""
        return step_checkpoints(self.config.out_dir)

    def resume(self, checkpoint):
        """Continue from a checkpoint saved by ``save`` (a path, or the ``LoadedCheckpoint`` a
        caller already loaded): weights, optimizer, RNG, counters, data position, and the
        matrix-product variants the run computed with (``bit_exact_resume`` is False, after a
        warning, where some of them are no longer available)."""
        loaded = (checkpoint if isinstance(checkpoint, LoadedCheckpoint)
                  else load_model_checkpoint(checkpoint))
        check_training_state(loaded.meta.get("training"), loaded.path)
        check_compatible(loaded, self.model.config, self.task.vocabs)
        crc = (loaded.meta.get("training") or {}).get("data_crc32")   # older: absent
        if crc is not None and crc != self.data_fingerprint():
            raise ValueError(f"checkpoint {loaded.path}: the {self.task.name} task's training or "
                             f"validation data differ from its run's (their token ids do not match its data_crc32); a "
                             f"resume continues the same data, so start a new run for other data")
        training = restore_training_state(loaded, self.model, self.optimizer)
        ops()                                    # the active backend's kernels, loaded
        self.bit_exact_resume = runtime.adopt(loaded.meta.get("runtime"), loaded.path)
        try:
            self.step, self.epoch = int(training["step"]), int(training["epoch"])
            self.task.load_state_dict(training["sampler"])
            self.stopper.load_state_dict(training.get("early_stopping", {}))
            best_value = training.get("best_value", self.stopper.state_dict()["best"])
            self.best_value = self.stopper.best if best_value is None else float(best_value)
            self.seconds_before = float(training.get("seconds", 0.0))
            ranks = int(training.get("world_size", 1))
            run_config = training.get("config") or {}
            if "total_steps" in training and all(run_config.get(k) == getattr(self.config, k)
                                                 for k in ("epochs", "max_steps")):
                self._resume_schedule(int(training["total_steps"]),
                                      training.get("schedule_warps", []), ranks)
            if hasattr(self.schedule, "load_state_dict"):
                self.schedule.load_state_dict(training["schedule"])
            self.saved_step = self.step
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"checkpoint {loaded.path}: training state does not fit this run ({e})") from None
        if ranks != self.collective.size:
            warnings.warn(f"checkpoint {loaded.path}: its run trained on {ranks} process(es), this "
                          f"one on {self.collective.size}: it continues with the same weights, "
                          f"optimizer and data position, but the batches go to other processes "
                          f"and draw other dropout masks, so it is not bit-exact with a run that "
                          f"went straight through", stacklevel=2)
            self.bit_exact_resume = False
        self.optimizer.lr = self.schedule(max(self.step, 1))
        self.model.train()
        return self

    # -- stop decisions --------------------------------------------------------------------------
    def check_work_left(self):
        """Raise ValueError if the run cannot train a single step more (a resumed checkpoint
        already reached max_steps, epochs, the time budget, early stopping or the target).
        ``fit`` calls it before it writes anything; a caller may call it earlier."""
        done = self._nothing_left()
        if done:
            raise ValueError(f"{done} (nothing was trained or written)")

    def _nothing_left(self):
        cfg, where = self.config, f"the run is already at step {self.step}"
        if cfg.max_steps is not None and self.step >= cfg.max_steps:
            return f"max_steps {cfg.max_steps} (--max-steps): {where}; give a larger --max-steps"
        if self.epoch >= cfg.epochs:
            return (f"epochs {cfg.epochs} (--epochs): {where}, after {self.epoch} epochs; give a "
                    f"larger --epochs")
        if cfg.time_budget is not None and self.elapsed() >= cfg.time_budget:
            return (f"time_budget {cfg.time_budget / 60:g} min (--time-budget): {where} and has "
                    f"used {self.elapsed() / 60:.1f} min; give a larger --time-budget")
        if self.stopper.should_stop:
            return (f"patience {cfg.patience} (--patience): {where}, and early stopping ended it "
                    f"after {self.stopper.bad_evals} validations without improvement; give a "
                    f"larger --patience")
        best = self.stopper.best
        if cfg.target is not None and math.isfinite(best) and self._reaches_target(best):
            return (f"target {cfg.target} (--target): {where}, and its best {cfg.stop_metric} "
                    f"{best:g} already reached it")
        return None

    def _reaches_target(self, value):
        if self.config.target is None:
            return False
        minimize = self.config.stop_metric in self.task.minimize
        return value <= self.config.target if minimize else value >= self.config.target

    def decide_stop(self, loss=None, record=None):
        """The one place the loop decides to stop, after an update (``loss``) or a validation
        (``record``): a non-finite loss or gradient norm (the update was not applied),
        max_steps, the time budget, the target, early stopping; or None to go on. Every
        decision passes through ``collective.agree`` so all processes of a run stop together."""
        cfg, reason = self.config, None
        if record is not None:
            if self._reaches_target(record[cfg.stop_metric]):
                reason = "target"
            elif self.stopper.should_stop:
                reason = "early_stopping"
        elif not (math.isfinite(loss) and math.isfinite(self.grad_norm)):
            reason = "non_finite"
        elif cfg.max_steps is not None and self.step >= cfg.max_steps:
            reason = "max_steps"
        elif cfg.time_budget is not None and self.elapsed() >= cfg.time_budget:
            reason = "time_budget"
        check = None if self.collective.size == 1 else \
            weights_check(self.model.flat_params, self.step)
        return self.collective.agree(reason, check=check)

    def _non_finite_message(self, loss):
        saved = ("no checkpoint was written" if self.saved_step is None else
                 f"the latest checkpoint (step {self.saved_step}) is untouched")
        where = f" in {self.out_dir}" if self.out_dir else ""
        return (f"task {self.task.name!r}, step {self.step + 1}: the training loss is {loss} and "
                f"the gradient norm {self.grad_norm}: training stopped without applying this "
                f"update; {saved}{where}. Start a new run (another --out, or --overwrite) with a "
                f"lower --lr or a --clip-norm")

    # -- validation ------------------------------------------------------------------------------
    def validate(self, scheduled=True, on_eval=None):
        """Evaluate, log, save ``last`` (and ``best`` when the stop metric is the best seen so
        far, and ``step_<N>`` when ``keep_last`` asks); returns the record.

        Only ``scheduled`` validations (every ``eval_every`` epochs or ``eval_every_steps``
        updates) advance early stopping. The extra one of the final weights, when a run stops
        between them, does not: a run stopped by ``--max-steps`` and resumed then takes the
        same early-stopping decisions as the run that went straight through. It still saves
        ``best`` if its weights are the best seen.
        """
        cfg, seconds = self.config, self.elapsed()   # wall time at which the model had these weights
        t0 = time.perf_counter()
        record = dict(self.evaluate())
        record.update(step=self.step, epoch=self.epoch, seconds=round(seconds, 2),
                      eval_seconds=round(time.perf_counter() - t0, 2),
                      examples=self.task.examples())
        self.history.append(record)
        self._validated_at = self.step
        if self.log:
            self.log.log("eval", **record)
        value = record[cfg.stop_metric]
        if scheduled:
            self.stopper.step(value)
            if hasattr(self.schedule, "observe"):        # plateau: the rate follows the loss
                self.optimizer.lr = self.schedule.observe(record["loss"])
        improved = self.stopper.better(value, self.best_value)
        if improved:
            self.best_value = value
        self._save_run("last")
        if improved:
            self._save_run("best")
        if cfg.keep_last and not (cfg.save_every_steps or cfg.save_every_epochs):
            self._save_step_checkpoint()         # else step_<N> follow their own schedule
        if on_eval:
            on_eval(record)
        return record

    # -- the loop --------------------------------------------------------------------------------
    def fit(self, on_eval=None):
        """Train until epochs/max_steps, the time budget, early stopping or the target; returns
        a summary dict. When training stops by epochs, max_steps or the time budget and the
        final weights have not been validated, they are validated once (so ``best`` exists).

        A non-finite loss or gradient norm stops training without applying that update, saving
        nothing from it, and raises ``TrainingDiverged`` naming the task and the step. A run
        that has nothing left to train (a resumed checkpoint already at max_steps, ...) is a
        ValueError before anything is written. ``on_eval(record)`` is called after each
        validation (the CLI prints it).

        In a data-parallel run every process calls it. An exception that leaves it on one
        process (a failed save on the first, a bug) ends every process of the run
        (``collective.fail``): the others would wait for it in their next exchange.
        """
        self.check_work_left()
        try:
            summary = self._fit(on_eval)
        except BaseException as e:
            self.collective.fail(e)              # one process's error ends a data-parallel run
            raise
        if self._failure is not None:            # every process stopped at this update
            raise TrainingDiverged(self._failure)
        return summary

    def _fit(self, on_eval):
        cfg = self.config
        self.collective.start(self)              # every process: the same run, the same weights
        self._open_log()
        self.model.train()
        self._start = start = time.perf_counter()
        stop, self._failure = None, None
        try:
            while stop is None and self.epoch < cfg.epochs:
                stop = self._train_epoch(on_eval)
                if stop is None:
                    self.epoch += 1
                    if cfg.save_every_epochs and self.epoch % cfg.save_every_epochs == 0:
                        self._save_step_checkpoint()         # for averaging, no validation
                    if self.task.has_validation and not cfg.eval_every_steps \
                            and self.epoch % cfg.eval_every == 0:
                        stop = self.decide_stop(record=self.validate(on_eval=on_eval))
            stop = stop or "epochs"
            if self._failure is None:
                self._finish(stop, on_eval)
        except TrainingDiverged:                 # a save refused non-finite weights
            stop = "non_finite"
            raise
        finally:
            self._close_log(stop, start)
        self.model.eval()
        best = self.best_value
        return {"step": self.step, "epoch": self.epoch, "stop_reason": stop,
                "seconds": time.perf_counter() - start,
                f"best_{cfg.stop_metric}": best if math.isfinite(best) else None,
                "history": self.history}

    def _train_epoch(self, on_eval):
        """The updates of the current epoch (from where a resume left it); returns a stop
        reason, or None at the epoch's end."""
        cfg, task, stop = self.config, self.task, None
        bar = progress_bar(total=task.batches_per_epoch(),
                           quiet=cfg.quiet or not self.collective.is_root,
                           desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
                           initial=task.batches_done())
        meter = _Throughput()
        # every process reads the same batches; an update takes accum_steps on each of them
        for group in _groups(task.batches(self.epoch), cfg.accum_steps * self.collective.size):
            loss = self.train_step(self.collective.shard(group))
            stop = self.decide_stop(loss=loss)
            if stop == "non_finite":
                self._failure = self._non_finite_message(loss)
                break
            meter.add(loss, sum(task.tokens(b) for b in group),
                      sum(task.padded_tokens(b) for b in group))
            bar.update(len(group))
            if self._logs(self.step):
                self._log_train(meter, bar)
            if cfg.save_every_steps and self.step % cfg.save_every_steps == 0:
                self._save_step_checkpoint()
            if stop is None and cfg.eval_every_steps and task.has_validation \
                    and self.step % cfg.eval_every_steps == 0:
                stop = self.decide_stop(record=self.validate(on_eval=on_eval))
                meter.since = time.perf_counter()    # throughput excludes validation
            if stop:
                break
        bar.close()
        return stop

    def _finish(self, stop, on_eval):
        """After the last update: the final weights get a score if they have none (and a
        stop by epochs, max_steps or the time budget left them unvalidated), then ``last``."""
        if (stop in ("max_steps", "time_budget", "epochs") and self.task.has_validation
                and self._validated_at != self.step):
            self.validate(scheduled=False, on_eval=on_eval)
        self._save_run("last")

    # -- the metrics log -------------------------------------------------------------------------
    def _open_log(self):
        if self.out_dir:
            os.makedirs(self.out_dir, exist_ok=True)
            self.log = MetricsLog(os.path.join(self.out_dir, "metrics.jsonl"), append=self.step > 0)
            if self.step == 0:                   # says who started the run (npformer.cli.runs)
                self.log.log("start", made_by=(self.extra or {}).get("made_by"))

    def _log_train(self, meter, bar):
        """A "train" record: the mean loss of the updates since the last one, the learning rate,
        the throughput (``tokens_per_s``: the tokens the loss sees; ``padded_tokens_per_s``:
        every cell of the batches' arrays), and the latest update's gradient norm before
        clipping, whole (``grad_norm``) and by layer (``grad_norms``, ``grad_norms.py``)."""
        values = dict(meter.values(), lr=self.optimizer.lr, seconds=self.elapsed())
        if self.layer_grad_norms is not None:    # this update's, before clipping
            values.update(grad_norm=self.grad_norm, grad_norms=self.layer_grad_norms)
            self.layer_grad_norms = None
        bar.set_postfix(loss=f"{values['loss']:.3f}", tok_s=f"{values['tokens_per_s']:.0f}",
                        lr=f"{self.optimizer.lr:.2e}")
        if self.log:
            self.log.log("train", step=self.step, epoch=self.epoch, **values)
        meter.restart()

    def _close_log(self, stop, start):
        if self.log:
            self.log.log("end", step=self.step, epoch=self.epoch,
                         seconds=time.perf_counter() - start, total_seconds=self.elapsed(),
                         stop_reason=stop)
            self.log.close()
            self.log = None


class _Throughput:
    """Loss and tokens of the updates since the last "train" record."""

    def __init__(self):
        self.restart()

    def restart(self):
        self.loss, self.tokens, self.padded, self.updates = 0.0, 0, 0, 0
        self.since = time.perf_counter()

    def add(self, loss, tokens, padded):
        self.loss += loss
        self.tokens += tokens
        self.padded += padded
        self.updates += 1

    def values(self):
        dt = max(time.perf_counter() - self.since, 1e-9)
        return dict(loss=self.loss / self.updates, tokens_per_s=self.tokens / dt,
                    padded_tokens_per_s=self.padded / dt)


def _groups(batches, size):
    """The batch stream in lists of ``size`` (the last of an epoch may be shorter)."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group
