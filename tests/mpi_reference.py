"""The one-process reference of a data-parallel update, for tests/test_mpi.py and the worker
script it launches (tests/mpi_steps.py)."""
import math

import numpy as np

from npformer import runtime
from npformer.optim.clip import clip_grad_norm
from npformer.training.collective import dropout_seed
from npformer.training.toy import toy_trainer

SEED = 3


def small_toy_trainer(dropout, steps):
    """A toy-corpus Trainer small enough for a test: 2+2 layers of d_model 32, batches of 16."""
    return toy_trainer(seed=SEED, n_train=400,
                       model_kwargs=dict(d_model=32, n_heads=4, d_ff=64, dropout=dropout),
                       train_kwargs=dict(max_steps=steps, batch_size=16, warmup_steps=2,
                                         quiet=True), )[0]


def reference_params(dropout, steps, ranks=2):
    """The parameters after ``steps`` updates computed in one process the way ``ranks`` processes
    compute them: the update's batches dealt out rank-strided; each rank's batch back-propagated
    (with that rank's dropout stream) into a zeroed buffer, weighted by its share of the update's
    tokens; the buffers summed in rank order; then clipping, the schedule and Adam."""
    trainer = small_toy_trainer(dropout, steps)
    model, task, cfg, opt = trainer.model, trainer.task, trainer.config, trainer.optimizer
    stream = task.batches(0)
    model.train()
    for step in range(1, steps + 1):
        batches = [next(stream) for _ in range(ranks)]       # batch r goes to rank r
        n_total = sum(task.tokens(b) for b in batches)
        buffers = []
        for rank, batch in enumerate(batches):
            model.zero_grad()
            model.rng.bit_generator.state = type(model.rng.bit_generator)(
                dropout_seed(cfg.seed, rank, step)).state
            task.loss_and_backward(model, batch, task.tokens(batch) / n_total)
            buffers.append(model.flat_grads.copy())
        total = buffers[0]
        for buf in buffers[1:]:                              # rank order
            total = total + buf
        model.flat_grads[:] = total
        bounds = np.linspace(0, total.size, ranks + 1).astype(np.int64)
        squares = 0.0
        for r in range(ranks):
            part = total[bounds[r]:bounds[r + 1]]
            with runtime.blas_scope():
                squares += float(np.dot(part, part))
        clip_grad_norm(model, cfg.clip_norm, norm=math.sqrt(squares))
        opt.lr = trainer.schedule(step)
        opt.step()
    return model.flat_params.copy()
