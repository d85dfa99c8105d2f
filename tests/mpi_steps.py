"""Run by tests/test_mpi.py under ``mpiexec -n 2``: a few updates of a small toy Transformer,
data-parallel, then rank 0 saves the flat parameters to OUT (a .npy file).

    mpiexec -n 2 python -m mpi4py tests/mpi_steps.py OUT REDUCE DROPOUT STEPS [FAULT]

FAULT (the Trainer used as a library, failing on one rank): ``save`` (rank 0's checkpoint
write fails), ``evaluate`` (rank 0's validation fails), ``drift`` (rank 1's weights move away
from rank 0's after its first update).
"""
import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_reference import small_toy_trainer  # noqa: E402

from npformer import distributed  # noqa: E402
from npformer.training.collective import MPICollective  # noqa: E402


def main(out, reduce, dropout, steps, fault="none"):
    world = distributed.connect()
    assert world is not None and world.size == 2, "run me under mpiexec -n 2"
    trainer = small_toy_trainer(float(dropout), int(steps))
    trainer.set_collective(MPICollective(world, reduce=reduce))
    if fault == "save":
        trainer.config = dataclasses.replace(trainer.config,
                                             out_dir=os.path.join(os.path.dirname(out), "run"))
        if world.is_root:
            trainer.save = fail_with(OSError("No space left on device (a test's fault)"))
    elif fault == "evaluate" and world.is_root:
        trainer.task.evaluate = fail_with(RuntimeError("validation failed (a test's fault)"))
    elif fault == "drift" and world.rank == 1:
        step = trainer.optimizer.step

        def drifting_step():
            step()
            trainer.model.flat_params *= 1 + 1e-6
        trainer.optimizer.step = drifting_step
    trainer.fit()
    if world.is_root:
        np.save(out, trainer.model.flat_params)


def fail_with(error):
    def fail(*args, **kwargs):
        raise error
    return fail


if __name__ == "__main__":
    main(*sys.argv[1:])
