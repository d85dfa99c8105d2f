"""Data-parallel training throughput: R ranks x T threads for every split of the machine's cores,
against the best single process (and PyTorch eager on all the cores) in the same run.

    python benchmarks/bench_data_parallel.py [--config base] [--batch B] [--split]
                                             [--repeats 7] [--cores N] [--reduce ordered|mpi]
                                             [--splits 1x16 8x2 ...] [--no-torch]

For each split R x T of C cores (R * T = C; every divisor R of C unless ``--splits`` names
some), the script starts R ranks with ``mpiexec -n R python -m mpi4py`` (a single process
without mpiexec), all pinned with ``taskset`` to the first C CPUs of this process's affinity;
npformer gives each rank its own T of them (``npformer.distributed.share_cores``). Every rank
trains bench_train_step.py's ``--config`` batch each step (forward, loss, backward, the gradient
exchange, clipping, Adam), so R ranks train R batches a step (``--batch B`` replaces the config's
rows). With ``--split`` the ranks share one batch instead: each trains B / R of its rows, so
every split trains the same update, the question a recipe with a fixed batch asks (e.g.
``--config tiny --batch 128 --split`` for the Tiny preset's half batches: one process of 2
threads at ``--max-tokens 3700`` against 2 ranks of 1 thread at ``--max-tokens 1850`` each).
Printed per split: tokens/s of all ranks together (source + target tokens, median step after two
warm-up steps), the step time, the gradient exchange's share of the step, and the speed against
the single process of C threads. Then, on the split with the most ranks, the exchange alone on
the model's gradient buffer: the ordered sum (``--reduce ordered``, the default) and one MPI
Allreduce, with their algorithm bandwidth (buffer bytes / seconds).

PyTorch eager on C threads (bench_train_step.py's worker, on the whole batch) is printed for
reference where torch is installed (``--no-torch`` skips it). Needs mpiexec and mpi4py
(``pip install 'npformer[mpi]'``).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_train_step import (CONFIGS, affinity, config, cpu_list, make_batch,  # noqa: E402
                              step_tokens, transformer_and_adam)


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def worker(args):
    """One rank (or the single process): time ``repeats`` training steps; rank 0 prints JSON."""
    import numpy as np

    import npformer as nf
    from npformer import distributed
    from npformer.optim.clip import clip_grad_norm
    from npformer.training.collective import MPICollective, SingleProcess

    world = distributed.connect()
    if world is None:
        nf.configure_runtime(threads=args.threads)
        collective = SingleProcess()
    else:
        distributed.share_cores(world)
        collective = MPICollective(world, reduce=args.reduce)
    c = shape(args, collective.size)
    model, opt = transformer_and_adam(c)
    src, tgt_in, tgt_out = make_batch(c, np)
    n_tokens = int((tgt_out != 0).sum())
    exchange = []

    def train_step():
        n_total = collective.total_tokens(n_tokens)
        model.zero_grad()
        logits = model.forward(src, tgt_in)
        _, dlogits = nf.cross_entropy(logits, tgt_out, ignore_index=0, label_smoothing=0.1)
        dlogits *= n_tokens / n_total
        model.backward(dlogits)
        t0 = time.perf_counter()
        _, norm = collective.reduce(model, 0.0)
        exchange.append(time.perf_counter() - t0)
        clip_grad_norm(model, 1.0, norm=norm)
        opt.step()

    for _ in range(2):
        train_step()
    exchange.clear()
    steps = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        train_step()
        steps.append(time.perf_counter() - t0)
    result = {"ranks": collective.size, "threads": nf.runtime.policy().cores,
              "step_s": median(steps), "exchange_s": median(exchange),
              "tokens_per_step": step_tokens(c) * collective.size,
              "buffer_mb": model.flat_grads.nbytes / 1e6}
    if world is not None and args.bandwidth:

        for mode in ("ordered", "mpi"):
            col, times = MPICollective(world, reduce=mode), []
            for _ in range(args.repeats + 1):
                world.comm.Barrier()
                t0 = time.perf_counter()
                col.reduce(model, 0.0)
                times.append(time.perf_counter() - t0)
            result[f"{mode}_s"] = median(times[1:])
    if collective.is_root:
        print(json.dumps(result))


def shape(args, ranks=1):
    """One rank's benchmarked shape: bench_train_step's (the config, its rows replaced by
    ``--batch``), the rows divided among the ``ranks`` with ``--split``."""
    c = config(args)
    if args.split:
        c["batch"] //= ranks
    return c


def run_split(args, ranks, threads, cpus):
    cmd = [sys.executable, __file__, "--worker", "--config", args.config, "--repeats",
           str(args.repeats), "--reduce", args.reduce, "--threads", str(threads)]
    if args.batch is not None:
        cmd += ["--batch", str(args.batch)]
    if args.split:
        cmd.append("--split")
    if ranks > 1:
        if args.bandwidth_at == ranks:
            cmd.append("--bandwidth")
        cmd = [shutil.which("mpiexec"), "-n", str(ranks), sys.executable, "-m", "mpi4py"] + cmd[1:]
    cmd = ["taskset", "-c", cpu_list(cpus)] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{ranks}x{threads} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_torch(args, cpus):
    cmd = ["taskset", "-c", cpu_list(cpus), sys.executable, str(HERE / "bench_train_step.py"),
           "--worker", "torch-eager", "--config", args.config, "--repeats", str(args.repeats)]
    if args.batch is not None:
        cmd += ["--batch", str(args.batch)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"PyTorch eager: skipped ({(out.stderr.strip().splitlines() or ['failed'])[-1]})")
        return None
    return median(json.loads(out.stdout.strip().splitlines()[-1])["times"])


def splits_of(cores, named):
    if named:
        out = []
        for s in named:
            r, _, t = s.partition("x")
            if not (r.isdigit() and t.isdigit()) or int(r) * int(t) != cores:
                raise SystemExit(f"--splits {s}: expected RxT with R*T = {cores} cores")
            out.append((int(r), int(t)))
        return out
    return [(r, cores // r) for r in range(1, cores + 1) if cores % r == 0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--config", choices=sorted(k for k, c in CONFIGS.items()
                                               if "model" not in c), default="base")
    ap.add_argument("--batch", type=int, metavar="B", help="rows of a rank's batch (of the "
                    "update's with --split) instead of the config's")
    ap.add_argument("--split", action="store_true",
                    help="the ranks share one batch of B rows (B / R each) instead of one each")
    ap.add_argument("--repeats", type=int, default=7, help="timed steps per split")
    ap.add_argument("--cores", type=int, metavar="N", help="use the first N CPUs (default: all)")
    ap.add_argument("--reduce", choices=["ordered", "mpi"], default="ordered")
    ap.add_argument("--splits", nargs="+", metavar="RxT", help="only these splits (e.g. 8x2)")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch eager")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--bandwidth", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if shutil.which("mpiexec") is None:
        raise SystemExit("mpiexec not found: pip install 'npformer[mpi]' (mpi4py and the MPICH wheel)")
    cpus = affinity()
    cores = args.cores or len(cpus)
    if not 1 <= cores <= len(cpus):
        raise SystemExit(f"--cores {args.cores}: this process may use {len(cpus)} CPUs")
    cpus = cpus[:cores]
    splits = splits_of(cores, args.splits)
    if args.batch is not None and args.batch < 1:
        raise SystemExit(f"--batch {args.batch}: expected a positive number of rows")
    rows = shape(args)["batch"]
    for r, _ in splits:
        if args.split and rows % r:
            raise SystemExit(f"--split: a batch of {rows} rows does not divide among {r} ranks; "
                             f"choose --batch or --splits so that it does")
    args.bandwidth_at = max(r for r, _ in splits)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    how = (f"one batch of {rows} rows split among the ranks" if args.split
           else f"{rows} rows per rank")
    print(f"bench_data_parallel --config {args.config}, {how}: {cores} cores "
          f"(CPUs {cpu_list(cpus)}), --reduce {args.reduce}, median of {args.repeats} steps, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load {load:.2f}")
    results = [run_split(args, r, t, cpus) for r, t in splits]
    single = run_split(args, 1, cores, cpus) if (1, cores) not in splits else None
    base = next(res for res in results + [single] if res and res["ranks"] == 1)
    base_tps = base["tokens_per_step"] / base["step_s"]
    print(f"{'ranks x threads':>16} {'tokens/s':>10} {'step ms':>8} {'exchange':>9} "
          f"{'vs 1x' + str(cores):>8}")
    for res in results:
        tps = res["tokens_per_step"] / res["step_s"]
        share = res["exchange_s"] / res["step_s"] if res["ranks"] > 1 else 0.0
        print(f"{res['ranks']:>9} x {res['threads']:<4} {tps:10.0f} {res['step_s'] * 1e3:8.1f} "
              f"{share:8.1%} {tps / base_tps:7.2f}x")
    if not args.no_torch:
        t = run_torch(args, cpus)
        if t is not None:
            tps = step_tokens(shape(args)) / t
            print(f"{'PyTorch eager 1':>11} x {cores:<4} {tps:10.0f} {t * 1e3:8.1f} {'':>9} "
                  f"{tps / base_tps:7.2f}x")
    top = next((res for res in results if res["ranks"] == args.bandwidth_at), {})
    if "ordered_s" in top:
        mb = top["buffer_mb"]
        print(f"exchange of the {mb:.1f} MB gradient buffer on {top['ranks']} ranks: ordered sum "
              f"{top['ordered_s'] * 1e3:.1f} ms ({mb / 1e3 / top['ordered_s']:.2f} GB/s), MPI "
              f"Allreduce {top['mpi_s'] * 1e3:.1f} ms ({mb / 1e3 / top['mpi_s']:.2f} GB/s)")


if __name__ == "__main__":
    main()
