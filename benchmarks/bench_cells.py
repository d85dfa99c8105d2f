"""How large the cells of a large product should be: one training step of a config, timed
under several values of ``npformer.kernels.matmul.PART_MACS`` in one process; or, with
``--products``, the step's linear products alone against NumPy's matmul on the same shapes.

    python benchmarks/bench_cells.py [--config tiny|base|big|...] [--batch B]
                                     [--part-macs 24,23,22] [--rounds 40]
    python benchmarks/bench_cells.py --products --config llama-char [--rounds 7]
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

``--products``: each linear product of the step (``bench_train_step.step_products``: M rows
through a (K, N) weight) in its three forms, forward ``x @ w.T``, input gradient ``dY @ w`` and
weight gradient ``dY.T @ x``, on the operands' layouts in the step. npformer's ``matmul`` (the
variant its deterministic rules choose, as in a run, on npformer's worker threads) and NumPy's
``np.matmul`` (its BLAS on its own threads, the same cores) run on the same operands,
``--rounds`` times each: npformer's rounds first, then NumPy's, each after a pause of
``BLAS_SETTLE`` (after a call OpenBLAS's threads keep spinning on the cores for a while, and timed
in turn they would take the core npformer's second worker needs). Prints per product the medians in ms and GFLOP/s and npformer's share of
NumPy's rate, then the step's products together (each weighed by its count in the step: their
FLOPs over their summed times) and the BLAS's kernel family (threadpoolctl): NumPy's rate is
that of the machine's sgemm as this process loads it. Attention's per-head products are left out
(``bench_train_step.step_products`` leaves them out too); ``bench_train_step.py`` prints the
whole step's share of the sgemm rate.
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

from bench_train_step import (CONFIGS, DECODERS, gpt_train_step, step_products,  # noqa: E402
                              transformer_train_step)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=tuple(CONFIGS), default="tiny")
    parser.add_argument("--products", action="store_true",
                        help="time the step's linear products alone against NumPy's matmul "
                             "instead of whole steps under several PART_MACS")
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
    if args.rounds < (3 if args.products else 5):
        parser.error(f"--rounds: expected at least {3 if args.products else 5}, got "
                     f"{args.rounds}")
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch: expected a positive number of rows, got {args.batch}")

    import numpy as np

    import npformer as nf
    nf.set_backend("numba")          # the cells are the Numba backend's; loads npformer.kernels
    matmul = importlib.import_module("npformer.kernels.matmul")     # the module, not the function

    c = dict(CONFIGS[args.config])
    if args.batch:
        c["batch"] = args.batch
    if args.products:
        return time_products(c, args.config, args.rounds, nf, np)
    step = (gpt_train_step if c.get("model") in DECODERS else transformer_train_step)(c)

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
    lengths = c["seq_len"] if c.get("model") in DECODERS else f"{c['src_len']}/{c['tgt_len']}"
    print(f"config {args.config}, batch {c['batch']} x {lengths} tokens, "
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


def product_operands(m, k, n, np):
    """A linear product's three forms in a training step, as (label, a, b): forward x @ w.T,
    input gradient dY @ w, weight gradient dY.T @ x (x (M, K), w (N, K), dY (M, N), float32)."""
    rng = np.random.default_rng(0)
    x, w, dy = (rng.standard_normal(shape, dtype=np.float32) for shape in ((m, k), (n, k), (m, n)))
    return [(f"x @ w.T  ({m}x{k} @ {k}x{n})", x, w.T), (f"dY @ w   ({m}x{n} @ {n}x{k})", dy, w),
            (f"dY.T @ x ({n}x{m} @ {m}x{k})", dy.T, x)]


BLAS_SETTLE = 0.5     # seconds: OpenBLAS's threads spin on their cores for a while after a call


def time_products(c, name, rounds, nf, np):
    """``--products``: the step's linear products by npformer and by NumPy (see the module
    docstring), each product's rounds by npformer and then by NumPy; prints the table and the
    FLOP-weighted totals."""
    import threadpoolctl

    from npformer import runtime
    matmul = importlib.import_module("npformer.kernels.matmul")
    rows, work, spent = [], {"npformer": 0.0, "numpy": 0.0}, {"npformer": 0.0, "numpy": 0.0}
    for (m, k, n), count in step_products(c).items():
        for label, a, b in product_operands(m, k, n, np):
            out = np.empty((a.shape[0], b.shape[1]), np.float32)
            runs = {"npformer": lambda: matmul.matmul(a, b, out=out),
                    "numpy": lambda: np.matmul(a, b, out=out)}
            times = {key: [] for key in runs}
            for run in runs.values():                       # warm-up: compiles, allocates
                run()
            for key, run in runs.items():                   # npformer's rounds, then NumPy's
                time.sleep(BLAS_SETTLE)                     # NumPy's BLAS threads go to sleep
                for r in range(rounds):
                    t0 = time.perf_counter()
                    run()
                    times[key].append(time.perf_counter() - t0)
            flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
            med = {key: float(np.median(t)) for key, t in times.items()}
            for key in runs:
                work[key] += count * flops
                spent[key] += count * med[key]
            rows.append((label, count, matmul.choice(a, b, out), med, flops))
    blas = [i.get("architecture") for i in threadpoolctl.threadpool_info()
            if i.get("user_api") == "blas"]
    rt = runtime.describe()
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"config {name}: its step's linear products alone, {rounds} rounds each, npformer's then NumPy's; "
          f"{rt['cores']} cores, {rt['workers']} npformer workers; NumPy's BLAS kernels: "
          f"{', '.join(map(str, blas))}; load average at the end {load}")
    print(f"{'product':34s} {'count':>5s} {'variant':>14s} {'npformer ms':>12s} {'GFLOP/s':>8s} "
          f"{'numpy ms':>9s} {'GFLOP/s':>8s} {'share':>6s}")
    for label, count, variant, med, flops in rows:
        rate = {key: flops / t / 1e9 for key, t in med.items()}
        print(f"{label:34s} {count:5d} {variant:>14s} {1e3 * med['npformer']:12.3f} "
              f"{rate['npformer']:8.1f} {1e3 * med['numpy']:9.3f} {rate['numpy']:8.1f} "
              f"{100 * rate['npformer'] / rate['numpy']:5.0f}%")
    total = {key: work[key] / spent[key] / 1e9 for key in work}
    label = "the step's products, weighed"
    print(f"{label:34s} {'':5s} {'':>14s} {1e3 * spent['npformer']:12.1f} "
          f"{total['npformer']:8.1f} {1e3 * spent['numpy']:9.1f} {total['numpy']:8.1f} "
          f"{100 * total['npformer'] / total['numpy']:5.0f}%")


if __name__ == "__main__":
    main()
