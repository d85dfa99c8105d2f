"""Run by tests/test_mpi.py under ``mpiexec -n 2``: a few updates of a small toy Transformer,
data-parallel, then rank 0 saves the flat parameters to OUT (a .npy file).

    mpiexec -n 2 python -m mpi4py tests/mpi_steps.py OUT REDUCE DROPOUT STEPS
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_reference import small_toy_trainer  # noqa: E402

from npformer import distributed  # noqa: E402
from npformer.training.collective import MPICollective  # noqa: E402


def main(out, reduce, dropout, steps):
    world = distributed.connect()
    assert world is not None and world.size == 2, "run me under mpiexec -n 2"
    trainer = small_toy_trainer(float(dropout), int(steps))
    trainer.set_collective(MPICollective(world, reduce=reduce))
    trainer.fit()
    if world.is_root:
        np.save(out, trainer.model.flat_params)


if __name__ == "__main__":
    main(*sys.argv[1:])
