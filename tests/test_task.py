"""The training loop knows no task: a task with no vocabulary at all trains, checkpoints and
resumes through it; the collective hooks carry a simulated second process; translation runs
give the very bits of the loop before the task protocol (tests/data/loop_reference.json)."""
import dataclasses
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import npformer as nf
from npformer.optim.clip import grad_norm
from npformer import registry, runtime
from npformer.configs import ModelConfig
from npformer.nn.linear import Linear
from npformer.nn.module import Module
from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.collective import SingleProcess
from npformer.training.metrics_log import read_metrics_log
from npformer.training.task import Task
from npformer.training.toy import toy_data
from npformer.training.trainer import TrainConfig, Trainer, TrainingDiverged
from npformer.training.translation import translation_trainer

DATA = Path(__file__).parent / "data"




# ---- a model and a task with no vocabulary: regression of random vectors ---------------------

@dataclasses.dataclass(frozen=True)
class RegressionConfig(ModelConfig):
    arch: ClassVar[str] = "test-regression"
    d_in: int = 6
    d_hidden: int = 16
    d_out: int = 3
    dtype: str = "float64"
    seed: int = 0

    def parameter_shapes(self):
        return {"hidden.weight": (self.d_hidden, self.d_in), "hidden.bias": (self.d_hidden,),
                "out.weight": (self.d_out, self.d_hidden), "out.bias": (self.d_out,)}

    def layer_count(self):
        return 2

    def vocab_sizes(self):
        return {}


class Regression(Module):
    """y = W2 tanh(W1 x + b1) + b2. Shape: (B, d_in) -> (B, d_out)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.rng = rng = np.random.default_rng(config.seed)
        dtype = np.dtype(config.dtype)
        self.hidden = Linear(config.d_in, config.d_hidden, rng=rng, dtype=dtype)
        self.out = Linear(config.d_hidden, config.d_out, rng=rng, dtype=dtype)
        self.flatten_parameters()

    @classmethod
    def from_config(cls, config):
        return cls(config)

    def forward(self, x):
        self._h = np.tanh(self.hidden.forward(x))
        return self.out.forward(self._h)

    def backward(self, dy):
        dh = self.out.backward(dy)
        return self.hidden.backward(dh * (1.0 - self._h ** 2))


@pytest.fixture(autouse=True)
def regression_architecture():
    """Known to the registry for this module's tests only (checkpoints build through it)."""
    registry.register_architecture(RegressionConfig, Regression)
    yield
    del registry.ARCHITECTURES[RegressionConfig.arch]


@dataclasses.dataclass
class Rows:
    x: np.ndarray      # (B, d_in)
    y: np.ndarray      # (B, d_out)


class RegressionTask(Task):
    """Mean over rows of 0.5 ||f(x) - y||^2, on a fixed random linear target."""

    name = "regression"
    metrics = ("loss",)
    minimize = ("loss",)
    batch_type = Rows

    def __init__(self, n_train=96, n_valid=32, batch_size=16, seed=0, bad=None):
        rng = np.random.default_rng(1234)
        w = rng.standard_normal((6, 3))
        x = rng.standard_normal((n_train + n_valid, 6))
        y = x @ w + 0.01 * rng.standard_normal((n_train + n_valid, 3))
        self.train = (x[:n_train], y[:n_train])
        self.valid = (x[n_train:], y[n_train:])
        self.has_validation = n_valid > 0
        self.batch_size, self.seed, self.bad = batch_size, seed, bad
        self.epoch, self.done = 0, 0

    def batches_per_epoch(self):
        return math.ceil(len(self.train[0]) / self.batch_size)

    def batches(self, epoch):
        if epoch != self.epoch:
            self.epoch, self.done = epoch, 0
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.train[0]))
        while self.done < self.batches_per_epoch():
            rows = order[self.done * self.batch_size:(self.done + 1) * self.batch_size]
            self.done += 1
            yield ("not rows" if self.bad == "type" else
                   Rows(self.train[0][rows], self.train[1][rows]))

    def state_dict(self):
        return {"epoch": self.epoch, "batches_done": self.done}

    def load_state_dict(self, state):
        self.epoch, self.done = state["epoch"], state["batches_done"]

    def tokens(self, batch):
        return 0 if self.bad == "empty" else len(batch.x)

    def loss_and_backward(self, model, batch, weight):
        diff = model.forward(batch.x) - batch.y                     # (B, d_out)
        model.backward(weight * diff / len(batch.x))                 # weight x d(mean)/d(pred)
        loss = 0.5 * float((diff ** 2).sum())
        return math.nan if self.bad == "nan" else loss

    def evaluate(self, model):
        diff = model.forward(self.valid[0]) - self.valid[1]
        return {"loss": 0.5 * float((diff ** 2).sum()) / len(diff)}

    def fingerprint(self):
        return int(hashlib.sha256(self.train[0].tobytes()).hexdigest()[:8], 16)


def regression_trainer(out_dir=None, task=None, collective=None, **config):
    config = TrainConfig(**{"lr": 3e-2, "warmup_steps": 2, "schedule": "constant", "quiet": True,
                            "log_every": 1, "clip_norm": None, "epochs": 20,
                            "out_dir": None if out_dir is None else str(out_dir), **config})
    model = nf.build_model(RegressionConfig())
    return Trainer(model, task or RegressionTask(), config, collective=collective)


def test_a_task_without_vocabulary_trains_checkpoints_and_resumes(tmp_path):
    trainer = regression_trainer(tmp_path / "run", max_steps=60)
    trainer.model.eval()
    before = trainer.evaluate()["loss"]
    summary = trainer.fit()
    after = summary["best_loss"]
    assert summary["stop_reason"] == "max_steps" and after < 0.2 * before
    assert trainer.config.stop_metric == "loss"            # the task's first metric by default
    best = load_model_checkpoint(tmp_path / "run" / "best")
    assert isinstance(best.model, Regression) and best.vocabs is None
    assert "vocabularies" not in best.meta
    # stopped half way and resumed: the very bits of the straight run
    straight = regression_trainer(max_steps=10)
    straight.fit()
    half = regression_trainer(tmp_path / "half", max_steps=5)
    half.fit()
    resumed = regression_trainer(max_steps=10).resume(tmp_path / "half" / "last")
    assert resumed.step == 5
    resumed.fit()
    np.testing.assert_array_equal(resumed.model.flat_params, straight.model.flat_params)


def test_checkpoints_every_k_updates_without_validation(tmp_path):
    task = RegressionTask(n_valid=0)
    trainer = regression_trainer(tmp_path, task=task, max_steps=9, save_every_steps=2,
                                 keep_last=3)
    trainer.fit()
    assert [os.path.basename(p) for p in trainer.step_checkpoints()] == ["step_4", "step_6",
                                                                         "step_8"]
    events = [r["event"] for r in read_metrics_log(tmp_path / "metrics.jsonl")]
    assert "eval" not in events and (tmp_path / "last.npz").exists()
    assert load_model_checkpoint(tmp_path / "step_8").meta["training"]["step"] == 8


class TwoRanks(SingleProcess):
    """A simulated second process that trains ``batch`` on its own copy of the model: its
    tokens join the count before the backward, its gradient and loss join the reduction."""

    def __init__(self, task, model, batch):
        self.task, self.model, self.batch = task, model, batch

    def total_tokens(self, n_tokens):
        self.n_total = n_tokens + self.task.tokens(self.batch)
        return self.n_total

    def reduce(self, model, loss):
        other = self.model
        other.flat_params[...] = model.flat_params
        other.zero_grad()
        n = self.task.tokens(self.batch)
        loss_sum = self.task.loss_and_backward(other, self.batch, n / self.n_total)
        model.flat_grads += other.flat_grads                     # in rank order: 0, then 1
        return loss + (loss_sum / n) * (n / self.n_total), grad_norm(model)


def test_a_reduction_over_two_simulated_ranks_equals_one_process_seeing_both(numpy_backend):
    task = RegressionTask()
    b0, b1 = list(task.batches(0))[:2]
    b1 = Rows(b1.x[:11], b1.y[:11])                             # ranks with unequal shares
    one = regression_trainer(clip_norm=1.0)
    loss_one = one.train_step([b0, b1])
    partner = nf.build_model(RegressionConfig())
    rank0 = regression_trainer(clip_norm=1.0, collective=TwoRanks(task, partner, b1))
    loss_two = rank0.train_step(b0)
    assert loss_two == loss_one and rank0.grad_norm == one.grad_norm
    np.testing.assert_array_equal(rank0.model.flat_params, one.model.flat_params)


def test_every_stop_goes_through_the_collective():
    class OtherRankStops(SingleProcess):
        def agree(self, reason, check=None):        # another process ran out of time at step 3
            return reason or ("time_budget" if self.trainer.step >= 3 else None)

    collective = OtherRankStops()
    trainer = regression_trainer(collective=collective, max_steps=50)
    collective.trainer = trainer
    summary = trainer.fit()
    assert summary["step"] == 3 and summary["stop_reason"] == "time_budget"


@pytest.mark.parametrize("bad,error,match", [
    ("nan", TrainingDiverged, r"^task 'regression', step 1: the training loss is nan"),
    ("empty", ValueError, r"^task 'regression', step 1: its batches hold no tokens"),
    ("type", ValueError, r"^task 'regression', step 1: batches\(\) gave a str, expected a Rows"),
])
def test_a_bad_task_is_named_with_the_step(bad, error, match):
    with pytest.raises(error, match=match):
        regression_trainer(task=RegressionTask(bad=bad), max_steps=3).fit()


def test_the_trainer_refuses_what_is_not_a_task_or_metric():
    model = nf.build_model(RegressionConfig())
    with pytest.raises(ValueError, match="task: expected a npformer.training.task.Task"):
        Trainer(model, "pairs")
    with pytest.raises(ValueError, match=r"stop_metric: expected one of the regression task's "
                                         r"metrics \('loss',\), got 'bleu'"):
        Trainer(model, RegressionTask(), TrainConfig(stop_metric="bleu"))


# ---- translation: the bits of the loop before the task protocol ------------------------------

REFERENCE = json.loads((DATA / "loop_reference.json").read_text())


def _reference_run(data, options, out_dir, resume=None, **over):
    model = nf.Transformer(len(data.vocabs.src), len(data.vocabs.tgt), **REFERENCE["model"])
    config = TrainConfig(**{**REFERENCE["common"], **options, **over, "out_dir": str(out_dir)})
    trainer = translation_trainer(model, data.vocabs, data.train, data.valid, config)
    if resume:
        trainer.resume(resume)
    summary = trainer.fit()
    rows = read_metrics_log(out_dir / "metrics.jsonl")
    return {"train_losses": [[r["step"], r["loss"]] for r in rows if r["event"] == "train"],
            "evals": [{k: r[k] for k in ("step", "loss", "exact_match", "bleu")}
                      for r in rows if r["event"] == "eval"],
            "weights_sha256": hashlib.sha256(trainer.model.flat_params.tobytes()).hexdigest(),
            "step": summary["step"], "stop_reason": summary["stop_reason"]}


# The reference's float32 bits are those of OpenBLAS's "Haswell" kernels (AVX2 + FMA): another
# kernel of the same library (OpenBLAS picks "SkylakeX" on an AVX-512 CPU) sums the products in
# another order and moves the last bit. OPENBLAS_CORETYPE pins the kernel, but only before
# OpenBLAS loads, so where another kernel is loaded the test runs itself again in a child process.
REFERENCE_KERNEL = "Haswell"


def _can_pin_the_reference_kernel(api):
    """Whether a child process can load OpenBLAS's reference kernel: OpenBLAS on a CPU with AVX2
    (the dispatch rules' view of it), and not already asked to (a child whose BLAS ignored the
    request must not start another)."""
    return (api == "openblas" and runtime.machine_features()["avx2"]
            and os.environ.get("OPENBLAS_CORETYPE") != REFERENCE_KERNEL)


@pytest.mark.parametrize("scenario", sorted(REFERENCE["scenarios"]))
def test_translation_runs_keep_the_bits_of_the_loop_before_the_task_protocol(
        scenario, tmp_path, numpy_backend, request):
    """tests/data/loop_reference.json was written by the loop of commit 51e1cdb (numpy backend),
    and again when the dropout masks changed: every logged loss, every validation and the final
    weights, straight and resumed, with OpenBLAS's Haswell kernels."""
    api, _, kernel = (runtime.blas_info() or [(None, None, None)])[0]
    if kernel != REFERENCE_KERNEL:
        if not _can_pin_the_reference_kernel(api):
            pytest.skip(f"the reference bits are OpenBLAS's {REFERENCE_KERNEL} (AVX2"
                        f" kernels); NumPy's BLAS here is {api} {kernel} on {platform.machine()}")
        child = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
            env={**os.environ, "OPENBLAS_CORETYPE": REFERENCE_KERNEL}, capture_output=True,
            text=True, cwd=request.config.rootpath)
        if child.returncode == 0 and "1 skipped" in child.stdout:   # the pin was ignored
            pytest.skip(f"OPENBLAS_CORETYPE={REFERENCE_KERNEL} did not load that kernel here "
                        f"(NumPy's BLAS is {api} {kernel})")
        assert child.returncode == 0 and "1 passed" in child.stdout, (child.stdout[-4000:]
                                                                        + child.stderr[-2000:])
        return
    data = toy_data(seed=1, n_train=120, n_heldout=4, n_valid=16)
    expected = REFERENCE["scenarios"][scenario]
    options = expected["options"]
    assert _reference_run(data, options, tmp_path / "straight") == expected["straight"]
    _reference_run(data, options, tmp_path / "half", max_steps=expected["resumed_at"])
    resumed = _reference_run(data, options, tmp_path / "half",
                             resume=tmp_path / "half" / "last")
    assert resumed == expected["resumed"]


def test_the_loop_imports_nothing_of_translation():
    import ast
    import npformer.training.trainer as trainer_module
    tree = ast.parse(Path(trainer_module.__file__).read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    for translation in ("decoding", "decoding.translator", "translation", "metrics", "loss",
                        "data.batching", "data.tokenize", "multi30k", "toy"):
        assert translation not in {m.lstrip(".") for m in imported if m}, translation


@pytest.mark.parametrize("n_valid", [0, 32])
def test_checkpoints_at_the_end_of_every_epoch_without_validation(tmp_path, n_valid):
    """The kept step_<N> are the epoch ends alone: validations (every 4 updates here) write
    best and last but no step checkpoint of their own when a save schedule is given."""
    task = RegressionTask(n_valid=n_valid)              # 6 batches an epoch
    trainer = regression_trainer(tmp_path, task=task, epochs=4, save_every_epochs=1,
                                 keep_last=3, eval_every_steps=4 if n_valid else None)
    trainer.fit()
    assert [os.path.basename(p) for p in trainer.step_checkpoints()] == ["step_12", "step_18",
                                                                         "step_24"]
    assert (tmp_path / "last.npz").exists()
