"""Where the cores wait during a training step: the wall time of an encoder-decoder step split
into parallel regions and serial stretches, and the idle time inside the parallel regions.

    python benchmarks/bench_idle.py [--config tiny|base|big] [--batch B] [--steps 30] [--top 12]
    taskset -c 0-3 python benchmarks/bench_idle.py ...        # on 4 of the machine's cores

The step is ``bench_train_step.py``'s (Numba backend). During the timed steps, the main thread's
calls are counted by what they are:

- **run_parts regions** (``npformer.runtime.run_parts``): a product's cells or attention's heads,
  shared by the runtime's workers. Each part's own time is measured on the thread that ran it,
  so a region's idle worker time is (region wall x workers) - (the parts' time): cells that do
  not divide evenly, and the handoffs, i.e. how long after the region starts a helper begins its
  first part and how long after the last part ends the region returns.
- **parallel kernels** (a Numba ``prange`` kernel large enough to run on every core).
- **serial**: the rest, where one thread computes and the other cores wait. A sampler thread looks
  at the main thread every ``--sample-ms`` milliseconds and names the innermost npformer line
  that is running there; the shares are of the whole wall time.

The instruments cost time themselves (a few microseconds a region, and the sampler takes
Python's lock to look), so the step runs slower than in ``bench_train_step.py``: read the
shares, not the milliseconds. The whole measurement is one process on this process's cores;
nothing is compared against PyTorch here.
"""
import argparse
import collections
import os
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_train_step import config, transformer_train_step  # noqa: E402


class Recorder:
    """Counts, for the main thread, the wall time of run_parts regions and parallel kernels and
    the idle worker time inside the regions; samples the main thread's serial stretches."""

    def __init__(self, runtime, jit, sample_s):
        self.runtime, self.jit, self.sample_s = runtime, jit, sample_s
        self.main = threading.get_ident()
        self.on, self.depth = False, 0
        self.wall = collections.Counter()           # region kind -> seconds
        self.count = collections.Counter()          # region kind -> regions
        self.worker_s = self.parts_s = 0.0          # run_parts: wall x workers, parts' own time
        self.start_gap = self.end_gap = 0.0         # first helper part after entry; exit after last part
        self.shared = 0                             # regions whose parts ran on 2+ threads
        self.samples, self.serial = 0, collections.Counter()
        self.lock = threading.Lock()
        self._run_parts = runtime.run_parts
        self._kernel_call = jit.ParallelKernel.__call__

    # -- the instruments -----------------------------------------------------------------------
    def install(self):
        rec = self
        run_parts, kernel_call = self._run_parts, self._kernel_call

        def timed_run_parts(fn, parts, max_workers=None):
            if threading.get_ident() != rec.main or rec.depth:
                return run_parts(fn, parts, max_workers)
            spans = []

            def part(p):
                t = time.perf_counter()
                try:
                    fn(p)
                finally:
                    with rec.lock:
                        spans.append((threading.get_ident(), t, time.perf_counter()))
            parts = list(parts)
            rec.depth += 1
            t0 = time.perf_counter()
            try:
                return run_parts(part, parts, max_workers)
            finally:
                t1 = time.perf_counter()
                rec.depth -= 1
                if rec.on:
                    rec._region(fn, parts, max_workers, spans, t0, t1)

        def timed_kernel(kernel, *args):
            if (threading.get_ident() != rec.main or rec.depth
                    or kernel.work(*args) < rec.jit.SERIAL_BELOW):
                return kernel_call(kernel, *args)
            rec.depth += 1
            t0 = time.perf_counter()
            try:
                return kernel_call(kernel, *args)
            finally:
                rec.depth -= 1
                if rec.on:
                    rec.wall["parallel kernels"] += time.perf_counter() - t0
                    rec.count["parallel kernels"] += 1

        self.runtime.run_parts = timed_run_parts
        self.jit.ParallelKernel.__call__ = timed_kernel

    def uninstall(self):
        self.runtime.run_parts = self._run_parts
        self.jit.ParallelKernel.__call__ = self._kernel_call

    def _region(self, fn, parts, max_workers, spans, t0, t1):
        name = getattr(fn, "__qualname__", "")
        kind = "run_parts: product cells" if name == "_run_part" else \
            "run_parts: " + name.split(".<locals>")[0]
        workers = min(len(parts), self.runtime.workers(), max_workers or len(parts))
        self.wall[kind] += t1 - t0
        self.count[kind] += 1
        self.worker_s += (t1 - t0) * workers
        self.parts_s += sum(e - s for _, s, e in spans)
        helpers = [s for tid, s, _ in spans if tid != self.main]
        if helpers:
            self.shared += 1
            self.start_gap += min(helpers) - t0
            self.end_gap += t1 - max(e for _, _, e in spans)

    # -- the sampler ---------------------------------------------------------------------------
    def _where(self, frame):
        """(file, line, function, caller) of the innermost frame inside npformer (or its kernels)."""
        f = frame
        while f is not None:
            path = f.f_code.co_filename
            if os.sep + "npformer" + os.sep in path or os.sep + "kernels" + os.sep in path:
                caller = f.f_back.f_code.co_name if f.f_back is not None else ""
                return (os.path.basename(path), f.f_lineno, f.f_code.co_name, caller)
            f = f.f_back
        return ("(outside npformer)", 0, frame.f_code.co_name, "")

    def sample(self, stop):
        while not stop.is_set():
            time.sleep(self.sample_s)
            if not self.on:
                continue
            frame = sys._current_frames().get(self.main)
            self.samples += 1
            if not self.depth and frame is not None:
                self.serial[self._where(frame)] += 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=("tiny", "base", "big"), default="tiny")
    parser.add_argument("--batch", type=int, metavar="B",
                        help="rows of the batch, replacing the config's (its lengths stay)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps (>= 3)")
    parser.add_argument("--top", type=int, default=12, help="serial lines to list")
    parser.add_argument("--sample-ms", type=float, default=2.0,
                        help="milliseconds between two looks at the main thread (> 0)")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps: expected at least 3, got {args.steps}")
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch: expected a positive number of rows, got {args.batch}")
    if not args.sample_ms > 0:
        parser.error(f"--sample-ms: expected a positive number of milliseconds, got "
                     f"{args.sample_ms}")

    import npformer as nf
    nf.set_backend("numba")
    from npformer import runtime
    from npformer.kernels import _jit

    c = config(args)
    step = transformer_train_step(c)
    for _ in range(3):                                       # warm-up: compiles, allocates
        step()

    rec = Recorder(runtime, _jit, args.sample_ms / 1e3)
    stop = threading.Event()
    sampler = threading.Thread(target=rec.sample, args=(stop,), daemon=True)
    rec.install()
    sampler.start()
    try:
        rec.on = True
        c0, t0 = os.times(), time.perf_counter()
        for _ in range(args.steps):
            step()
        t1, c1 = time.perf_counter(), os.times()
        rec.on = False
    finally:
        stop.set()
        sampler.join()
        rec.uninstall()

    wall = t1 - t0
    cpu = c1.user + c1.system - c0.user - c0.system
    rt = nf.runtime.describe()
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    workers = rt["workers"]
    print(f"config {args.config}, batch {c['batch']} x {c['src_len']}/{c['tgt_len']} tokens, "
          f"{args.steps} steps of {1e3 * wall / args.steps:.1f} ms (instrumented); {rt['cores']} "
          f"cores, {workers} workers; cores busy {cpu / wall:.2f}; load average at the end {load}")
    regions = sum(rec.wall.values())
    print(f"\n{'share of the wall time':40s} {'share':>7} {'per step':>9} {'ms each':>8}")
    for kind, seconds in rec.wall.most_common():
        n = rec.count[kind]
        print(f"{kind:40s} {seconds / wall:>7.1%} {n / args.steps:>9.1f} "
              f"{1e3 * seconds / n:>8.3f}")
    print(f"{'serial (one thread computes)':40s} {1 - regions / wall:>7.1%}")
    idle = rec.worker_s - rec.parts_s
    if rec.worker_s:
        print(f"\nrun_parts regions: {idle:.2f} s of {rec.worker_s:.2f} worker-seconds idle "
              f"({idle / rec.worker_s:.1%}; {idle / (wall * workers):.1%} of all the workers' "
              f"wall time)")
    else:
        print("\nrun_parts regions: none in the timed steps")
    if rec.shared:
        print(f"per region shared by 2+ threads ({rec.shared / args.steps:.1f} a step): the first "
              f"helper part starts {1e3 * rec.start_gap / rec.shared:.3f} ms after entry; the "
              f"region returns {1e3 * rec.end_gap / rec.shared:.3f} ms after its last part ends")
    total = sum(rec.serial.values())
    print(f"\nserial lines: {total} of {rec.samples} looks at the main thread "
          f"({total / max(1, rec.samples):.1%}); the {args.top} most seen (share of all looks):")
    for (path, line, func, caller), n in rec.serial.most_common(args.top):
        print(f"  {n / rec.samples:6.2%}  {path}:{line} {func} <- {caller}")


if __name__ == "__main__":
    main()
