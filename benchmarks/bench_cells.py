"""How large the cells of a large product should be: one training step of an encoder-decoder
config, timed under several values of ``npformer.kernels.matmul.PART_MACS`` in one process.

    python benchmarks/bench_cells.py [--config tiny|base|big] [--batch B] [--part-macs 24,23,22]
                                     [--rounds 40]
    taskset -c 0-3 python benchmarks/bench_cells.py ...      # on 4 of the machine's cores

A 2-D product of at least twice ``PART_MACS`` multiply-adds is cut into cells of at least
``PART_MACS`` (``matmul.product_grid``), which the runtime's workers share. Smaller cells let
more of a product run in parallel (a product of one cell runs on one core while the others
wait; three cells on two workers run as two and one) but pack the operands more often. The cells
depend on the shape alone, so every value gives reproducible bits, not the same bits as another
value.

The values (``--part-macs``, as powers of two) take turns step by step, the order rotated by one
every round, so that a machine whose speed drifts (a shared VM) slows all of them alike and none
is always first or last. Prints, per value, the median and fastest step, the CPU time per wall
second (how many cores the step kept busy) and the first value's median over this one's (above
1: faster than the first). The Numba backend, as ``bench_train_step.py``'s npformer-numba. Cores:
those of this process's affinity (use ``taskset``); the runtime's policy reads them as in any run.
"""
import argparse
import importlib
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_train_step import CONFIGS, transformer_train_step  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=("tiny", "base", "big"), default="tiny")
    parser.add_argument("--batch", type=int, metavar="B",
                        help="rows of the batch, replacing the config's (its lengths stay)")
    parser.add_argument("--part-macs", default="24,23,22", metavar="E,E,...",
                        help="exponents: PART_MACS = 2**E for each value compared (first: the "
                             "reference of the ratios)")
    parser.add_argument("--rounds", type=int, default=40, help="timed steps per value (>= 5)")
    args = parser.parse_args(argv)
    try:
        exponents = [int(e) for e in args.part_macs.split(",")]
    except ValueError:
        parser.error(f"--part-macs: expected comma-separated integers, got {args.part_macs!r}")
    if len(set(exponents)) != len(exponents) or not all(10 <= e <= 40 for e in exponents):
        parser.error(f"--part-macs: expected distinct exponents in [10, 40], got "
                     f"{args.part_macs!r}")
    if args.rounds < 5:
        parser.error(f"--rounds: expected at least 5, got {args.rounds}")
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch: expected a positive number of rows, got {args.batch}")

    import numpy as np

    import npformer as nf
    nf.set_backend("numba")          # the cells are the Numba backend's; loads npformer.kernels
    matmul = importlib.import_module("npformer.kernels.matmul")     # the module, not the function

    c = dict(CONFIGS[args.config])
    if args.batch:
        c["batch"] = args.batch
    step = transformer_train_step(c)

    default = matmul.PART_MACS
    wall = {e: [] for e in exponents}
    busy = {e: [] for e in exponents}
    try:
        for e in exponents:                                 # warm-up: compiles, allocates
            matmul.PART_MACS = 1 << e
            step()
            step()
        for r in range(args.rounds):
            k = r % len(exponents)
            for e in exponents[k:] + exponents[:k]:
                matmul.PART_MACS = 1 << e
                c0, t0 = os.times(), time.perf_counter()
                step()
                t1, c1 = time.perf_counter(), os.times()
                wall[e].append(t1 - t0)
                busy[e].append((c1.user + c1.system - c0.user - c0.system) / (t1 - t0))
    finally:
        matmul.PART_MACS = default

    rt = nf.runtime.describe()
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"config {args.config}, batch {c['batch']} x {c['src_len']}/{c['tgt_len']} tokens, "
          f"{args.rounds} steps per value, the values taking turns; {rt['cores']} cores, "
          f"{rt['workers']} workers; load average at the end {load}")
    print(f"{'PART_MACS':>10} {'median ms':>10} {'fastest ms':>11} {'cores busy':>11} "
          f"{'vs first':>9}")
    ref = float(np.median(wall[exponents[0]]))
    for e in exponents:
        med = float(np.median(wall[e]))
        mark = " (default)" if 1 << e == default else ""
        print(f"{'2^' + str(e):>10} {1e3 * med:>10.1f} {1e3 * min(wall[e]):>11.1f} "
              f"{np.median(busy[e]):>11.2f} {ref / med:>8.3f}x{mark}")


if __name__ == "__main__":
    main()
