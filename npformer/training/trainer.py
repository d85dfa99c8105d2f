"""The training loop: batches, loss, backward, clipping, schedule, optimizer; plus periodic
validation, a metrics log, best/last checkpoints, early stopping and bit-exact resuming.

    trainer = Trainer(model, src_vocab, tgt_vocab, train_pairs, valid_pairs, TrainConfig(epochs=10))
    summary = trainer.fit()                      # {'step': ..., 'best_exact_match': ..., ...}

``train_pairs``/``valid_pairs`` are (source text, target text) pairs, tokenised by ``tokenize``.
"""
import math
import os
import time
from dataclasses import dataclass, fields

from ..data.batching import BatchSampler, iterate_batches, make_batch
from ..decoding.translator import Translator, whitespace_tokenize
from ..loss import cross_entropy
from ..optim import (Adam, AdamW, NoamSchedule, WarmupCosineSchedule, WarmupInverseSqrtSchedule,
                     clip_grad_norm)
from .checkpointing import (check_compatible, load_model_checkpoint, restore_training_state,
                            save_model_checkpoint)
from .early_stopping import EarlyStopping
from .metrics import MetricsLog, corpus_bleu, exact_match
from .progress import progress_bar

SCHEDULES = ("inverse_sqrt", "cosine", "noam", "constant")
STOP_METRICS = ("exact_match", "bleu", "loss")


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

    def __post_init__(self):
        for name in ("epochs", "batch_size", "warmup_steps", "eval_every", "log_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "warmup_steps" else 1):
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 1):
            raise ValueError(f"max_steps: expected a positive integer or None, got {self.max_steps!r}")
        if not self.lr > 0:
            raise ValueError(f"lr: expected a positive number, got {self.lr!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {self.schedule!r}")
        if self.optimizer not in ("adam", "adamw"):
            raise ValueError(f"optimizer: expected 'adam' or 'adamw', got {self.optimizer!r}")
        if self.stop_metric not in STOP_METRICS:
            raise ValueError(f"stop_metric: expected one of {STOP_METRICS}, got {self.stop_metric!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing: expected a number in [0, 1), got {self.label_smoothing!r}")
        self.betas = tuple(self.betas)

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

    def __init__(self, model, src_vocab, tgt_vocab, train_pairs, valid_pairs=None, config=None,
                 tokenize=whitespace_tokenize, detokenize=" ".join):
        self.model, self.src_vocab, self.tgt_vocab = model, src_vocab, tgt_vocab
        self.config = config = config or TrainConfig()
        self.tokenize, self.detokenize = tokenize, detokenize
        self.train_pairs, self.valid_pairs = list(train_pairs), list(valid_pairs or [])
        if not self.train_pairs:
            raise ValueError("train_pairs: expected at least one (source, target) pair, got none")
        self.train_ids = self.encode_pairs(self.train_pairs, "train_pairs")
        self.valid_ids = self.encode_pairs(self.valid_pairs, "valid_pairs") if self.valid_pairs else []
        self.pad, self.bos, self.eos = tgt_vocab.pad_id, tgt_vocab.bos_id, tgt_vocab.eos_id
        self.sampler = BatchSampler.from_pairs(self.train_ids, batch_size=config.batch_size,
                                               seed=config.seed)
        opt_cls = AdamW if config.optimizer == "adamw" else Adam
        self.optimizer = opt_cls(model, lr=config.lr, betas=config.betas, eps=1e-9,
                                 weight_decay=config.weight_decay)
        total = config.max_steps or config.epochs * len(self.sampler)
        self.total_steps = total
        self.schedule = make_schedule(config, total)
        self.stopper = EarlyStopping(config.patience, "min" if config.stop_metric == "loss" else "max")
        self.step, self.epoch = 0, 0
        self.history = []                       # validation records
        self.log = None

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
            out.append((self.src_vocab.encode(src), self.tgt_vocab.encode(tgt)))
        return out

    # -- one step --------------------------------------------------------------------------------
    def train_step(self, batch):
        """Forward, loss, backward, clip, schedule, update. Returns the (smoothed) loss."""
        model, cfg = self.model, self.config
        logits = model.forward(batch.src, batch.tgt_in)                  # (B, T, V)
        loss, dlogits = cross_entropy(logits, batch.tgt_out, ignore_index=self.pad,
                                      label_smoothing=cfg.label_smoothing)
        model.zero_grad()
        model.backward(dlogits)
        if cfg.clip_norm is not None:
            clip_grad_norm(model, cfg.clip_norm)
        self.step += 1
        self.optimizer.lr = self.schedule(self.step)
        self.optimizer.step()
        return float(loss)

    # -- validation ------------------------------------------------------------------------------
    def translator(self):
        return Translator(self.model, self.src_vocab, self.tgt_vocab, self.tokenize, self.detokenize)

    def evaluate(self, pairs, ids=None, batch_size=256):
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
            hyps = [t.text for t in self.translator().translate([s for s, _ in pairs])]
        finally:
            self.model.train(was_training)
        refs = [self.detokenize(self.tokenize(t)) for _, t in pairs]
        return {"loss": total / count, "exact_match": exact_match(hyps, refs),
                "bleu": corpus_bleu(hyps, refs), "hypotheses": hyps}

    # -- checkpoints -----------------------------------------------------------------------------
    def training_state(self):
        return {"step": self.step, "epoch": self.epoch, "sampler": self.sampler.state_dict(),
                "early_stopping": self.stopper.state_dict(), "config": self.config.to_dict()}

    def save(self, path):
        return save_model_checkpoint(path, self.model, self.src_vocab, self.tgt_vocab,
                                     self.optimizer, self.training_state())

    def resume(self, path):
        """Continue from a checkpoint saved by ``save``: weights, optimizer, RNG, counters, data position."""
        loaded = load_model_checkpoint(path)
        check_compatible(loaded, self.model.config, self.src_vocab, self.tgt_vocab)
        training = restore_training_state(loaded, self.model, self.optimizer)
        try:
            self.step, self.epoch = int(training["step"]), int(training["epoch"])
            self.sampler.load_state_dict(training["sampler"])
            self.stopper.load_state_dict(training.get("early_stopping", {}))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"checkpoint {loaded.path}: training state does not fit this run ({e})") from None
        self.optimizer.lr = self.schedule(max(self.step, 1))
        self.model.train()
        return self

    # -- the loop --------------------------------------------------------------------------------
    def _validate(self):
        result = self.evaluate(self.valid_pairs, self.valid_ids)
        record = {k: v for k, v in result.items() if k != "hypotheses"}
        record.update(step=self.step, epoch=self.epoch)
        self.history.append(record)
        if self.log:
            self.log.log("eval", **record)
        improved = self.stopper.step(result[self.config.stop_metric])
        if self.config.out_dir:
            self.save(os.path.join(self.config.out_dir, "last"))
            if improved:
                self.save(os.path.join(self.config.out_dir, "best"))
        return record

    def _reached_target(self, record):
        target = self.config.target
        if target is None:
            return False
        value = record[self.config.stop_metric]
        return value <= target if self.config.stop_metric == "loss" else value >= target

    def fit(self, on_eval=None):
        """Train until epochs/max_steps, early stopping or the target; returns a summary dict.

        ``on_eval(record)`` is called after each validation (the CLI prints it).
        """
        cfg, model = self.config, self.model
        if cfg.out_dir:
            os.makedirs(cfg.out_dir, exist_ok=True)
            self.log = MetricsLog(os.path.join(cfg.out_dir, "metrics.jsonl"), append=self.step > 0)
        model.train()
        start = time.perf_counter()
        stop_reason = "epochs"
        try:
            while self.epoch < cfg.epochs:
                self.sampler.set_epoch(self.epoch)
                n_batches = len(self.sampler)
                bar = progress_bar(total=n_batches, desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
                                   quiet=cfg.quiet, initial=self.sampler.state_dict()["batches_done"])
                run_loss, run_tokens, t_last, n_last = 0.0, 0, time.perf_counter(), 0
                hit_max = False
                for batch in iterate_batches(self.train_ids, self.sampler, self.pad, self.bos, self.eos):
                    loss = self.train_step(batch)
                    run_loss += loss
                    run_tokens += batch.n_tgt_tokens
                    n_last += 1
                    bar.update(1)
                    if self.step % cfg.log_every == 0:
                        now = time.perf_counter()
                        tok_s = run_tokens / max(now - t_last, 1e-9)
                        values = dict(loss=run_loss / n_last, lr=self.optimizer.lr,
                                      tokens_per_s=tok_s)
                        bar.set_postfix(loss=f"{values['loss']:.3f}", tok_s=f"{tok_s:.0f}",
                                        lr=f"{self.optimizer.lr:.2e}")
                        if self.log:
                            self.log.log("train", step=self.step, epoch=self.epoch, **values)
                        run_loss, run_tokens, t_last, n_last = 0.0, 0, now, 0
                    if cfg.max_steps is not None and self.step >= cfg.max_steps:
                        hit_max = True
                        break
                bar.close()
                if hit_max:
                    stop_reason = "max_steps"
                    break
                self.epoch += 1
                if self.valid_pairs and self.epoch % cfg.eval_every == 0:
                    record = self._validate()
                    if on_eval:
                        on_eval(record)
                    if self._reached_target(record):
                        stop_reason = "target"
                        break
                    if self.stopper.should_stop:
                        stop_reason = "early_stopping"
                        break
            if cfg.out_dir:
                self.save(os.path.join(cfg.out_dir, "last"))
        finally:
            if self.log:
                self.log.log("end", step=self.step, epoch=self.epoch,
                             seconds=time.perf_counter() - start)
                self.log.close()
                self.log = None
        model.eval()
        best = self.stopper.best
        return {"step": self.step, "epoch": self.epoch, "stop_reason": stop_reason,
                "seconds": time.perf_counter() - start,
                f"best_{cfg.stop_metric}": best if math.isfinite(best) else None,
                "history": self.history}
