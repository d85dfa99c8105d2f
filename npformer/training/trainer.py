"""The training loop: batches, loss, backward, clipping, schedule, optimizer; plus periodic
validation, a metrics log, best/last checkpoints, early stopping and bit-exact resuming.

    trainer = Trainer(model, vocabs, train_pairs, valid_pairs, TrainConfig(epochs=10))
    summary = trainer.fit()                      # {'step': ..., 'best_exact_match': ..., ...}

``train_pairs``/``valid_pairs`` are (source text, target text) pairs, tokenised by ``tokenize``;
``vocabs`` is the model's ``Vocabularies`` (a source and a target vocabulary, or one joint one).

For real data (``npformer.training.multi30k``): ``max_tokens`` batches by a padded-token budget,
``accum_steps`` sums the gradients of several batches before one update, ``eval_every_steps``
validates inside an epoch, ``time_budget`` caps the wall time, and ``keep_last`` keeps the last N
validation checkpoints (``step_<N>``) for checkpoint averaging (``npformer.training.averaging``).
"""
import glob
import math
import os
import re
import time
import warnings
import zlib
from dataclasses import dataclass, fields

import numpy as np

from .. import runtime
from ..backend import ops
from ..data.batching import BatchSampler, iterate_batches, make_batch
from ..data.vocab import Vocabularies
from ..decoding.translator import Translator, whitespace_tokenize
from ..loss import cross_entropy
from ..optim import (Adam, AdamW, NoamSchedule, WarmupCosineSchedule, WarmupInverseSqrtSchedule,
                     clip_grad_norm, grad_norm)
from ..optim.adam import check_betas
from ..validation import check_int, check_real
from .checkpointing import (LoadedCheckpoint, check_compatible, load_model_checkpoint,
                            restore_training_state, save_model_checkpoint)
from .early_stopping import EarlyStopping
from .metrics import MetricsLog, corpus_bleu, exact_match
from .progress import progress_bar

SCHEDULES = ("inverse_sqrt", "cosine", "noam", "constant")
STOP_METRICS = ("exact_match", "bleu", "loss")


class TrainingDiverged(ValueError):
    """Training met a non-finite loss or gradient norm and stopped without applying that update."""


@dataclass
class TrainConfig:
    epochs: int = 10
    max_steps: int = None            # stop after this many optimizer steps (overrides epochs)
    batch_size: int = 64
    lr: float = 2e-3                 # peak learning rate
    warmup_steps: int = 100
    schedule: str = "inverse_sqrt"
    min_lr: float = 0.0              # cosine only
    optimizer: str = "adam"          # or "adamw"
    betas: tuple = (0.9, 0.98)
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0           # None: no clipping
    seed: int = 0                    # batch order
    eval_every: int = 1              # validate every N epochs
    stop_metric: str = "exact_match"
    patience: int = None             # early stopping after N validations without improvement
    target: float = None             # stop as soon as the validation metric reaches this value
    log_every: int = 10              # steps between "train" records of the metrics log
    out_dir: str = None              # best/last checkpoints and metrics.jsonl go here
    quiet: bool = False
    max_tokens: int = None           # batch by padded tokens (src + tgt) instead of batch_size
    accum_steps: int = 1             # batches whose gradients are summed before one update
    eval_every_steps: int = None     # also validate every N optimizer steps (inside epochs)
    time_budget: float = None        # seconds: stop training (then validate once) after this
    keep_last: int = None            # keep the last N validation checkpoints step_<N> (averaging)

    def __post_init__(self):
        for name in ("epochs", "batch_size", "eval_every", "log_every", "accum_steps"):
            setattr(self, name, check_int(name, getattr(self, name)))
        for name in ("max_steps", "max_tokens", "eval_every_steps", "keep_last"):
            setattr(self, name, check_int(name, getattr(self, name), allow_none=True))
        self.warmup_steps = check_int("warmup_steps", self.warmup_steps, minimum=0)
        self.seed = check_int("seed", self.seed, minimum=0)
        self.time_budget = check_real("time_budget", self.time_budget, minimum=0, min_open=True,
                                      allow_none=True)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {self.schedule!r}")
        self.lr = check_real("lr", self.lr, minimum=0, min_open=True)
        self.min_lr = check_real("min_lr", self.min_lr, minimum=0)
        if self.schedule == "cosine" and self.min_lr > self.lr:     # the cosine falls lr -> min_lr
            raise ValueError(f"min_lr: expected at most lr={self.lr!r} (the cosine schedule falls "
                             f"from lr to min_lr), got {self.min_lr!r}")
        self.clip_norm = check_real("clip_norm", self.clip_norm, minimum=0, min_open=True,
                                    allow_none=True)             # None: no clipping
        self.weight_decay = check_real("weight_decay", self.weight_decay, minimum=0)
        self.betas = check_betas(self.betas)
        self.target = check_real("target", self.target, allow_none=True)
        if self.optimizer not in ("adam", "adamw"):
            raise ValueError(f"optimizer: expected 'adam' or 'adamw', got {self.optimizer!r}")
        if self.stop_metric not in STOP_METRICS:
            raise ValueError(f"stop_metric: expected one of {STOP_METRICS}, got {self.stop_metric!r}")
        self.label_smoothing = check_real("label_smoothing", self.label_smoothing, minimum=0,
                                          maximum=1, max_open=True)

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


def make_schedule(config, total_steps):
    if config.schedule == "inverse_sqrt":
        return WarmupInverseSqrtSchedule(config.lr, max(1, config.warmup_steps))
    if config.schedule == "cosine":
        return WarmupCosineSchedule(config.lr, min(config.warmup_steps, total_steps), total_steps,
                                    config.min_lr)
    if config.schedule == "noam":        # the paper's shape, scaled so that the peak (at warm-up) is lr
        warmup = max(1, config.warmup_steps)
        return NoamSchedule(1.0, warmup, config.lr * math.sqrt(warmup))
    return lambda step: config.lr


class Trainer:
    """Trains ``model`` on text pairs. See ``TrainConfig`` for every knob."""

    def __init__(self, model, vocabs, train_pairs, valid_pairs=None, config=None,
                 tokenize=whitespace_tokenize, detokenize=" ".join, bleu=None, extra=None):
        """``bleu(hypotheses, target_texts) -> float`` scores validation translations (default:
        sacrebleu on the re-tokenised targets); ``extra`` is saved in every checkpoint's metadata
        (e.g. the languages and tokenizer of the run)."""
        Vocabularies.check_fits(vocabs, model.config.vocab_sizes())
        self.model, self.vocabs = model, vocabs
        self.config = config = config or TrainConfig()
        self.tokenize, self.detokenize = tokenize, detokenize
        self.bleu, self.extra = bleu, extra
        self.train_pairs, self.valid_pairs = list(train_pairs), list(valid_pairs or [])
        if not self.train_pairs:
            raise ValueError("train_pairs: expected at least one (source, target) pair, got none")
        self.train_ids = self.encode_pairs(self.train_pairs, "train_pairs")
        self.valid_ids = self.encode_pairs(self.valid_pairs, "valid_pairs") if self.valid_pairs else []
        self.pad, self.bos, self.eos = vocabs.tgt.pad_id, vocabs.tgt.bos_id, vocabs.tgt.eos_id
        if config.max_tokens is not None:
            self.sampler = BatchSampler.from_pairs(self.train_ids, max_tokens=config.max_tokens,
                                                   seed=config.seed)
        else:
            self.sampler = BatchSampler.from_pairs(self.train_ids, batch_size=config.batch_size,
                                                   seed=config.seed)
        opt_cls = AdamW if config.optimizer == "adamw" else Adam
        self.optimizer = opt_cls(model, lr=config.lr, betas=config.betas, eps=1e-9,
                                 weight_decay=config.weight_decay)
        total = config.max_steps or config.epochs * math.ceil(len(self.sampler) / config.accum_steps)
        self.total_steps = total
        self.schedule = make_schedule(config, total)
        self.stopper = EarlyStopping(config.patience, "min" if config.stop_metric == "loss" else "max")
        self.best_value = self.stopper.best      # metric of the weights in ``best`` (any validation)
        self.step, self.epoch = 0, 0
        self.grad_norm = None                    # of the latest train_step, before clipping
        self.saved_step = None                   # step of the latest checkpoint written (or resumed)
        self.seconds_before = 0.0               # wall time of earlier sessions (resumed runs)
        self.history = []                       # validation records
        self.log = None
        self._data_crc32 = None                 # data_fingerprint(), once asked for
        self.bit_exact_resume = True            # False once resumed with other kernel variants

    # -- data ----------------------------------------------------------------------------------
    def encode_pairs(self, pairs, name):
        out = []
        max_len = self.model.max_len
        for n, pair in enumerate(pairs):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise ValueError(f"{name}[{n}]: expected a (source, target) pair of strings, got {pair!r:.60}")
            src, tgt = (self.tokenize(pair[0]), self.tokenize(pair[1]))
            if not src or not tgt:
                raise ValueError(f"{name}[{n}]: expected non-empty source and target, got {pair!r:.60}")
            if len(src) > max_len or len(tgt) + 1 > max_len:
                raise ValueError(f"{name}[{n}]: {len(src)} source / {len(tgt)} target tokens exceed "
                                 f"max_len={max_len} (target counts <eos>)")
            out.append((self.vocabs.src.encode(src), self.vocabs.tgt.encode(tgt)))
        return out

    # -- one step --------------------------------------------------------------------------------
    def train_step(self, batch):
        """Forward, loss, backward, clip, schedule, update. Returns the (smoothed) loss and
        leaves the gradient norm (before clipping) in ``self.grad_norm``.

        If the loss or the gradient norm is not finite, the update is NOT applied (the weights,
        the optimizer and ``self.step`` stay as they were) and ``fit`` stops on it.

        ``batch`` may be a list of batches (gradient accumulation): their gradients are summed,
        each weighted by its share of the target tokens, so the update equals one step on the
        concatenated batch (up to dropout masks and float rounding).
        """
        model, cfg = self.model, self.config
        batches = batch if isinstance(batch, (list, tuple)) else [batch]
        n_total = sum(b.n_tgt_tokens for b in batches)
        model.zero_grad()
        loss = 0.0
        for b in batches:
            logits = model.forward(b.src, b.tgt_in)                      # (B, T, V)
            part, dlogits = cross_entropy(logits, b.tgt_out, ignore_index=self.pad,
                                          label_smoothing=cfg.label_smoothing)
            weight = b.n_tgt_tokens / n_total    # the loss is a mean over the batch's tokens
            if len(batches) > 1:
                dlogits *= weight
            model.backward(dlogits)              # adds into every .grad
            loss += float(part) * weight
        if cfg.clip_norm is not None:
            self.grad_norm = clip_grad_norm(model, cfg.clip_norm)    # the norm before clipping
        else:
            self.grad_norm = grad_norm(model)
        if not (math.isfinite(loss) and math.isfinite(self.grad_norm)):
            return float(loss)                   # no update from non-finite values
        self.step += 1
        self.optimizer.lr = self.schedule(self.step)
        self.optimizer.step()
        return float(loss)

    # -- validation ------------------------------------------------------------------------------
    def translator(self):
        return Translator(self.model, self.vocabs, self.tokenize, self.detokenize)

    def evaluate(self, pairs, ids=None, batch_size=64):
        """{'loss', 'exact_match', 'bleu'} on (source, target) text pairs, greedy decoding."""
        ids = ids if ids is not None else self.encode_pairs(pairs, "pairs")
        was_training = self.model.training
        self.model.eval()
        try:
            total, count = 0.0, 0
            for start in range(0, len(ids), batch_size):
                chunk = ids[start:start + batch_size]
                b = make_batch([s for s, _ in chunk], [t for _, t in chunk], self.pad, self.bos, self.eos)
                logits = self.model.forward(b.src, b.tgt_in)
                loss, _ = cross_entropy(logits, b.tgt_out, ignore_index=self.pad)
                total += float(loss) * b.n_tgt_tokens
                count += b.n_tgt_tokens
            with warnings.catch_warnings():      # real data: many sentences hold unknown words
                warnings.filterwarnings("ignore", message=".*unknown words mapped to <unk>")
                hyps = [t.text for t in self.translator().translate([s for s, _ in pairs])]
        finally:
            self.model.train(was_training)
        refs = [self.detokenize(self.tokenize(t)) for _, t in pairs]
        bleu = self.bleu(hyps, [t for _, t in pairs]) if self.bleu else corpus_bleu(hyps, refs)
        return {"loss": total / count, "exact_match": exact_match(hyps, refs),
                "bleu": bleu, "hypotheses": hyps}

    # -- checkpoints -----------------------------------------------------------------------------
    def training_state(self):
        return {"step": self.step, "epoch": self.epoch, "sampler": self.sampler.state_dict(),
                "early_stopping": self.stopper.state_dict(), "config": self.config.to_dict(),
                "seconds": self.elapsed(), "data_crc32": self.data_fingerprint(),
                "best_value": self.best_value if math.isfinite(self.best_value) else None}

    def data_fingerprint(self):
        """CRC-32 of the token ids of every training and validation pair, in order. A resume
        compares it with the checkpoint's, so the same options over other text (same line
        lengths or not) cannot continue a run. Computed once: the pairs are fixed at __init__."""
        if self._data_crc32 is None:
            self._data_crc32 = self._crc32_of_pairs()
        return self._data_crc32

    def _crc32_of_pairs(self):
        crc = 0
        for pairs in (self.train_ids, self.valid_ids):
            for src, tgt in pairs:
                crc = zlib.crc32(np.asarray(tgt, dtype=np.int64).tobytes(),
                                 zlib.crc32(np.asarray(src, dtype=np.int64).tobytes(), crc))
            crc = zlib.crc32(b"|", crc)          # the split between training and validation
        return crc

    def elapsed(self):
        """Wall time of this run so far, earlier sessions of a resumed run included."""
        start = getattr(self, "_start", None)
        return self.seconds_before + (time.perf_counter() - start if start is not None else 0.0)

    def save(self, path):
        if not np.isfinite(self.model.flat_params).all():
            raise TrainingDiverged(f"step {self.step}: the weights hold non-finite values; "
                                   f"refusing to write them to {path}")
        self.saved_step = self.step
        return save_model_checkpoint(path, self.model, self.vocabs, self.optimizer, self.training_state(), extra=self.extra)

    def resume(self, checkpoint):
        """Continue from a checkpoint saved by ``save`` (a path, or the ``LoadedCheckpoint`` a
        caller already loaded): weights, optimizer, RNG, counters, data position, and the
        matrix-product variants the run computed with (``bit_exact_resume`` is False, after a
        warning, where some of them are no longer available)."""
        loaded = (checkpoint if isinstance(checkpoint, LoadedCheckpoint)
                  else load_model_checkpoint(checkpoint))
        check_compatible(loaded, self.model.config, self.vocabs)
        recorded = (loaded.meta.get("training") or {}).get("data_crc32")   # older: absent
        if recorded is not None and recorded != self.data_fingerprint():
            raise ValueError(f"checkpoint {loaded.path}: the training or validation pairs differ "
                             f"from its run's (their token ids do not match its data_crc32); a "
                             f"resume continues the same data, so start a new run for other data")
        training = restore_training_state(loaded, self.model, self.optimizer)
        ops()                                    # the active backend's kernels, loaded
        self.bit_exact_resume = runtime.adopt(loaded.meta.get("runtime"), loaded.path)
        try:
            self.step, self.epoch = int(training["step"]), int(training["epoch"])
            self.sampler.load_state_dict(training["sampler"])
            self.stopper.load_state_dict(training.get("early_stopping", {}))
            best_value = training.get("best_value", self.stopper.state_dict()["best"])
            self.best_value = self.stopper.best if best_value is None else float(best_value)
            self.seconds_before = float(training.get("seconds", 0.0))
            self.saved_step = self.step
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"checkpoint {loaded.path}: training state does not fit this run ({e})") from None
        self.optimizer.lr = self.schedule(max(self.step, 1))
        self.model.train()
        return self

    # -- the loop --------------------------------------------------------------------------------
    def _validate(self, scheduled=True):
        """Validate, log, and save ``last`` (and ``best`` when the metric is the best seen so far).

        Only ``scheduled`` validations (every ``eval_every`` epochs or ``eval_every_steps``
        updates) advance early stopping. The extra one of the final weights, when a run stops
        between them, does not: a run stopped by ``--max-steps`` and resumed then takes the
        same early-stopping decisions as the run that went straight through. It still saves
        ``best`` if its weights are the best seen.
        """
        seconds = self.elapsed()                 # wall time at which the model had these weights
        t0 = time.perf_counter()
        result = self.evaluate(self.valid_pairs, self.valid_ids)
        record = {k: v for k, v in result.items() if k != "hypotheses"}
        record.update(step=self.step, epoch=self.epoch, seconds=round(seconds, 2),
                      eval_seconds=round(time.perf_counter() - t0, 2))
        self.history.append(record)
        if self.log:
            self.log.log("eval", **record)
        value = result[self.config.stop_metric]
        if scheduled:
            self.stopper.step(value)
        improved = self.stopper.better(value, self.best_value)
        if improved:
            self.best_value = value
        if self.config.out_dir:
            self.save(os.path.join(self.config.out_dir, "last"))
            if improved:
                self.save(os.path.join(self.config.out_dir, "best"))
            if self.config.keep_last:
                self.save(os.path.join(self.config.out_dir, f"step_{self.step}"))
                self._prune_step_checkpoints()
        return record

    def step_checkpoints(self):
        """Paths (without suffix) of the kept ``step_<N>`` checkpoints, oldest first."""
        return step_checkpoints(self.config.out_dir)

    def _prune_step_checkpoints(self):
        for path in self.step_checkpoints()[:-self.config.keep_last]:
            for suffix in (".npz", ".json"):
                if os.path.exists(path + suffix):
                    os.remove(path + suffix)

    def _reached_target(self, record):
        target = self.config.target
        if target is None:
            return False
        value = record[self.config.stop_metric]
        return value <= target if self.config.stop_metric == "loss" else value >= target

    def _accumulated(self, batches):
        """Group the batch stream into lists of ``accum_steps`` (the last of an epoch may be shorter)."""
        group = []
        for batch in batches:
            group.append(batch)
            if len(group) == self.config.accum_steps:
                yield group
                group = []
        if group:
            yield group

    def _validate_and_report(self, on_eval):
        """Validate; returns a stop reason ("target", "early_stopping") or None."""
        record = self._validate()
        if on_eval:
            on_eval(record)
        if self._reached_target(record):
            return "target"
        if self.stopper.should_stop:
            return "early_stopping"
        return None

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
        if cfg.target is not None and math.isfinite(best) and (
                best <= cfg.target if cfg.stop_metric == "loss" else best >= cfg.target):
            return (f"target {cfg.target} (--target): {where}, and its best {cfg.stop_metric} "
                    f"{best:g} already reached it")
        return None

    def _stop_after_update(self, loss):
        """The one place the loop decides, after each update, whether to stop: a non-finite
        loss or gradient norm (the update was not applied), max_steps or the time budget."""
        cfg = self.config
        if not (math.isfinite(loss) and math.isfinite(self.grad_norm)):
            return "non_finite"
        if cfg.max_steps is not None and self.step >= cfg.max_steps:
            return "max_steps"
        if cfg.time_budget is not None and self.elapsed() >= cfg.time_budget:
            return "time_budget"
        return None

    def _non_finite_message(self, loss):
        saved = ("no checkpoint was written" if self.saved_step is None else
                 f"the latest checkpoint (step {self.saved_step}) is untouched")
        where = f" in {self.config.out_dir}" if self.config.out_dir else ""
        return (f"step {self.step + 1}: the training loss is {loss} and the gradient norm "
                f"{self.grad_norm}: training stopped without applying this update; {saved}{where}. "
                f"Start a new run (another --out, or --overwrite) with a lower --lr or a --clip-norm")

    def fit(self, on_eval=None):
        """Train until epochs/max_steps, the time budget, early stopping or the target; returns
        a summary dict. When training stops by epochs, max_steps or the time budget and the
        final weights have not been validated, they are validated once (so ``best`` exists).

        A non-finite loss or gradient norm stops training without applying that update, saving
        nothing from it, and raises ``TrainingDiverged`` naming the step. A run that has nothing
        left to train (a resumed checkpoint already at max_steps, ...) is a ValueError before
        anything is written.

        ``on_eval(record)`` is called after each validation (the CLI prints it). The metrics log
        gets "train" records every ``log_every`` steps with the loss, the learning rate and the
        throughput on the real padded batches: ``tokens_per_s`` counts the target tokens the loss
        sees, ``padded_tokens_per_s`` every cell of the padded source and target arrays.
        """
        cfg, model = self.config, self.model
        self.check_work_left()
        if cfg.out_dir:
            os.makedirs(cfg.out_dir, exist_ok=True)
            self.log = MetricsLog(os.path.join(cfg.out_dir, "metrics.jsonl"), append=self.step > 0)
            if self.step == 0:                   # says who started the run (npformer.cli.runs)
                self.log.log("start", made_by=(self.extra or {}).get("made_by"))
        model.train()
        self._start = start = time.perf_counter()
        stop_reason = "epochs"
        validated_at = None                      # step of the latest validation
        failure = None
        try:
            while self.epoch < cfg.epochs:
                self.sampler.set_epoch(self.epoch)
                n_batches = len(self.sampler)
                bar = progress_bar(total=n_batches, desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
                                   quiet=cfg.quiet, initial=self.sampler.state_dict()["batches_done"])
                run_loss, run_tokens, run_padded, n_last = 0.0, 0, 0, 0
                t_last = time.perf_counter()
                stop = None
                batches = iterate_batches(self.train_ids, self.sampler, self.pad, self.bos, self.eos)
                for group in self._accumulated(batches):
                    loss = self.train_step(group)
                    stop = self._stop_after_update(loss)
                    if stop == "non_finite":
                        failure = self._non_finite_message(loss)
                        break
                    run_loss += loss
                    run_tokens += sum(b.n_tgt_tokens for b in group)
                    run_padded += sum(b.src.size + b.tgt_out.size for b in group)
                    n_last += 1
                    bar.update(len(group))
                    if self.step % cfg.log_every == 0:
                        now = time.perf_counter()
                        dt = max(now - t_last, 1e-9)
                        values = dict(loss=run_loss / n_last, lr=self.optimizer.lr,
                                      tokens_per_s=run_tokens / dt, padded_tokens_per_s=run_padded / dt,
                                      seconds=self.elapsed())
                        bar.set_postfix(loss=f"{values['loss']:.3f}", tok_s=f"{run_tokens / dt:.0f}",
                                        lr=f"{self.optimizer.lr:.2e}")
                        if self.log:
                            self.log.log("train", step=self.step, epoch=self.epoch, **values)
                        run_loss, run_tokens, run_padded, n_last = 0.0, 0, 0, 0
                        t_last = now
                    if (stop is None and cfg.eval_every_steps and self.valid_pairs
                            and self.step % cfg.eval_every_steps == 0):
                        stop = self._validate_and_report(on_eval)
                        validated_at = self.step
                        t_last = time.perf_counter()      # throughput excludes validation
                    if stop:
                        break
                bar.close()
                if stop:
                    stop_reason = stop
                    break
                self.epoch += 1
                if (self.valid_pairs and not cfg.eval_every_steps
                        and self.epoch % cfg.eval_every == 0):
                    validated_at = self.step
                    stop = self._validate_and_report(on_eval)
                    if stop:
                        stop_reason = stop
                        break
            if failure is None:
                if (stop_reason in ("max_steps", "time_budget", "epochs") and self.valid_pairs
                        and validated_at != self.step):
                    record = self._validate(scheduled=False)   # the final weights get a score too
                    if on_eval:
                        on_eval(record)
                if cfg.out_dir:
                    self.save(os.path.join(cfg.out_dir, "last"))
        except TrainingDiverged:                 # a save refused non-finite weights
            stop_reason = "non_finite"
            raise
        finally:
            if self.log:
                self.log.log("end", step=self.step, epoch=self.epoch,
                             seconds=time.perf_counter() - start, total_seconds=self.elapsed(),
                             stop_reason=stop_reason)
                self.log.close()
                self.log = None
        model.eval()
        if failure is not None:
            raise TrainingDiverged(failure)
        best = self.best_value
        return {"step": self.step, "epoch": self.epoch, "stop_reason": stop_reason,
                "seconds": time.perf_counter() - start,
                f"best_{cfg.stop_metric}": best if math.isfinite(best) else None,
                "history": self.history}


def step_checkpoints(out_dir):
    """The ``step_<N>`` checkpoints (paths without suffix) in ``out_dir``, by step."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(os.fspath(out_dir)), "step_*.npz")):
        m = re.fullmatch(r"step_(\d+)\.npz", os.path.basename(path))
        if m:
            found.append((int(m.group(1)), path[:-4]))
    return [p for _, p in sorted(found)]
