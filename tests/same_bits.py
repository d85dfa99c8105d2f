"""Runs of the real recipes whose bits must not change (issue 68), for tests/test_same_bits.py.

Each run is an ``npformer`` command line (the toy run, ``npformer lm --max-steps 200``, the first
updates of the base and Tiny Multi30k recipes). What a run leaves is summed up as every logged
loss (the training losses and the validations' from ``metrics.jsonl``) and the sha256 of its
checkpoints' weights (each parameter's shape, dtype and bytes, in ``named_parameters()`` order:
the names are left out, so a renamed parameter with the same bits hashes the same).

tests/data/same_bits.json holds what the code before issue 68 (commit 4b70321, its kernels
included) gave, on the machine named there. It was written by this script, run from the
repository root against a worktree of that commit::

    git worktree add /tmp/orig 4b70321
    python tests/same_bits.py write --tree /tmp/orig              # every run: about half an hour

``check`` runs the current tree and compares::

    python tests/same_bits.py check                # the quick runs (what pytest runs)
    python tests/same_bits.py check --all          # and the full ones (minutes each)
    python tests/same_bits.py check toy lm-200     # the runs named
    python tests/same_bits.py check --tree /tmp/orig   # does this machine reproduce them at all?

The bits depend on the machine (see tests/test_same_bits.py): where this one computes otherwise,
``check`` says so and compares nothing. ``run_on_threads`` needs no reference: it runs
``THREAD_RUNS`` on 1 and on 2 threads, each count in a fresh process, for the test that holds
the machine's own bits.
"""
import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
MULTI30K = SHARED / "multi30k"
TEXT = SHARED / "tinyshakespeare" / "input.txt"
REFERENCE = Path(__file__).resolve().parent / "data" / "same_bits.json"

# The reference's float32 bits are those of OpenBLAS's "Haswell" (AVX2 + FMA) kernels; the child
# process that runs the recipes asks for them (OPENBLAS_CORETYPE works only before OpenBLAS loads).
BLAS_KERNEL = "Haswell"

_MULTI30K_ARGS = ["train", "--dataset", "multi30k", "--data-dir", "{multi30k}", "--quiet"]
_BASE = _MULTI30K_ARGS + ["--preset", "base", "--src", "de", "--tgt", "en"]
_TINY = _MULTI30K_ARGS + ["--preset", "tiny", "--src", "en", "--tgt", "de"]
# A quick run's validations score 8 sentences instead of 1,014: validation changes no training
# bit (runs of 20 updates logged the very loss of the full runs' update 20; ``write`` checks that
# a quick run's training losses are the full run's first ones).
_FEW_VALID = ["--valid-subset", "8"]

# name -> (command line, data it needs, quick: run by pytest, prefix_of: the full run whose
# first updates it repeats). "{out}", "{multi30k}" and "{text}" are filled in when it runs.
RUNS = {
    # the README's `npformer toy`: 14 epochs, 658 updates, a validation per epoch
    "toy": dict(argv=["toy", "--quiet"], data=None, quick=False),
    # the same recipe over 2 epochs (its cosine spans those 94 updates)
    "toy-2-epochs": dict(argv=["toy", "--quiet", "--epochs", "2"], data=None, quick=True),
    # the README's `npformer lm`, 200 updates (the cosine ends there), one validation at the end
    "lm-200": dict(argv=["lm", "--data", "{text}", "--max-steps", "200", "--quiet"],
                   data="text", quick=False),
    # the same command on a model of 1 block of width 32: all 200 updates and 2 validations
    "lm-small-200": dict(argv=["lm", "--data", "{text}", "--max-steps", "200", "--quiet",
                               "--layers", "1", "--d-model", "32", "--n-heads", "2",
                               "--context", "32", "--batch-size", "8", "--eval-every", "100",
                               "--sample-tokens", "16"], data="text", quick=True),
    # the first 200 updates of the base recipe (README's de->en), validation at update 150 and 200
    "base-200": dict(argv=_BASE + ["--max-steps", "200"], data="multi30k", quick=False),
    # its first 10 updates (a training loss is logged every 20: the validation's loss is logged)
    "base-10": dict(argv=_BASE + ["--max-steps", "10"] + _FEW_VALID, data="multi30k", quick=True,
                    prefix_of="base-200"),
    # the first 200 updates of Transformer-Tiny (README's en->de), epoch checkpoint at 122
    "tiny-200": dict(argv=_TINY + ["--max-steps", "200"], data="multi30k", quick=False),
    "tiny-10": dict(argv=_TINY + ["--max-steps", "10"] + _FEW_VALID, data="multi30k", quick=True,
                    prefix_of="tiny-200"),
}

# The runs that tests/test_same_bits.py repeats on 1 and on 2 threads, each in a fresh process,
# and requires to agree to the bit on whatever machine it is (no reference needed): the toy
# recipe's quick run above (encoder and decoder, dropout, label smoothing, greedy decoding), and
# `npformer lm` with Llama's block (RMSNorm, SwiGLU, rotary positions, grouped heads), its
# batches (B, T, D) = (32, 64, 64) large enough for the kernels' parallel twins and attention's
# parts to run on both threads (the small lm run above runs serially but for the products).
THREAD_RUNS = {
    "toy-2-epochs": RUNS["toy-2-epochs"],
    "lm-llama-30": dict(argv=["lm", "--data", "{text}", "--max-steps", "30", "--quiet",
                              "--arch", "llama", "--layers", "1", "--d-model", "64",
                              "--n-heads", "4", "--n-kv-heads", "2", "--context", "64",
                              "--batch-size", "32", "--eval-every", "15", "--sample-tokens", "16"],
                        data="text", quick=True),
}

# The CPU's vector instruction sets that decide the kernels' bits: LLVM vectorises (and, under
# fastmath, reassociates) their sums as wide as the vectors go and fuses multiply-adds where FMA
# exists, and the matrix-product dispatch rules choose other variants on AVX-512. (On the Zen 4
# without AVX-512 that wrote the reference, "znver4", the kernels compiled for "haswell" gave
# its bits too; for plain x86-64, SSE2 only, other bits.)
def _decides_bits(feature):
    return feature in ("avx", "avx2", "fma") or feature.startswith("avx512")


def spec(name):
    """Run ``name``'s entry in RUNS or THREAD_RUNS."""
    return RUNS[name] if name in RUNS else THREAD_RUNS[name]


def missing_data(name):
    """Why run ``name`` cannot run here (its data is absent), or None."""
    need = spec(name)["data"]
    if need == "multi30k" and not (MULTI30K / "train.de.gz").is_file():
        return f"Multi30k data not found at {MULTI30K} (see shared/data/multi30k/README.md)"
    if need == "text" and not TEXT.is_file():
        return f"Tiny Shakespeare not found at {TEXT} (see shared/data/tinyshakespeare/README)"
    return None


def command_line(name, out):
    fill = {"out": str(out), "multi30k": str(MULTI30K), "text": str(TEXT)}
    return [a.format(**fill) for a in spec(name)["argv"]] + ["--out", str(out)] + _pinned(name)


def _pinned(name):
    """Options that keep a run the program it was, where the code running it has them: since
    issue 69, ``npformer lm`` builds Llama's block by default, and ``--arch gpt`` the GPT-2
    block the reference's runs trained (the code before issue 68 has no --arch, and needs
    none). A run that names its --arch keeps it."""
    argv = spec(name)["argv"]
    if argv[0] != "lm" or "--arch" in argv:
        return []
    from npformer.training import language_model
    return ["--arch", "gpt"] if hasattr(language_model, "LM_ARCH") else []


# -- inside the process that runs the recipes ------------------------------------------------
def use_tree(tree):
    """Import npformer, its kernels included, from the source tree ``tree`` (a worktree of
    another commit, or this one)."""
    tree = Path(tree).resolve()
    sys.path.insert(0, str(tree))
    import npformer
    if not Path(npformer.__file__).resolve().is_relative_to(tree):
        raise SystemExit(f"npformer was imported from {npformer.__file__}, not from {tree}")
    init = tree / "kernels" / "__init__.py"           # setup.cfg maps kernels/ to npformer.kernels
    spec = importlib.util.spec_from_file_location("npformer.kernels", init,
                                                  submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["npformer.kernels"] = module
    spec.loader.exec_module(module)


def machine_facts():
    """What the bits depend on: NumPy's BLAS and its kernel family, the CPU and vector instruction
    sets LLVM compiles the kernels for, the dispatch rules' view of the machine; and the versions
    (a change of which may change bits too)."""
    import llvmlite
    import numba
    import numpy as np
    from numba.core.registry import cpu_target
    from npformer import runtime
    _, cpu, features = cpu_target.target_context.codegen().magic_tuple()
    blas = runtime.blas_info()
    return {"blas": list(blas[0]) if blas else None,
            "numba_cpu": cpu,
            "vector_isa": sorted(f[1:] for f in features.split(",")
                                 if f.startswith("+") and _decides_bits(f[1:])),
            "dispatch_features": runtime.machine_features(),
            "versions": {"numpy": np.__version__, "numba": numba.__version__,
                         "llvmlite": llvmlite.__version__}}


def weights_sha256(path):
    """sha256 of a checkpoint's weights: each parameter's shape, dtype and bytes, in
    ``named_parameters()`` order."""
    import numpy as np
    from npformer.training.checkpointing import load_model_checkpoint
    digest = hashlib.sha256()
    for _, p in load_model_checkpoint(path).model.named_parameters():
        data = np.ascontiguousarray(p.data)
        digest.update(f"{data.shape}{data.dtype.str}".encode())
        digest.update(data.tobytes())
    return digest.hexdigest()


def summarise(out):
    """Every logged loss of the run in ``out`` and the sha256 of its checkpoints' weights."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [{k: r[k] for k in ("step", "loss", "val_loss", "exact_match", "bleu") if k in r}
             for r in rows if r["event"] == "eval"]
    ends = [r for r in rows if r["event"] == "end"]
    return {"train_losses": [[r["step"], r["loss"]] for r in rows if r["event"] == "train"],
            "evals": evals,
            "stop_reason": ends[-1].get("stop_reason") if ends else None,
            "weights_sha256": {c: weights_sha256(out / c) for c in ("last", "best", "averaged")
                               if (out / f"{c}.npz").is_file()}}


def run(name, out):
    """Run ``name`` into the empty folder ``out`` in this process; its summary and seconds."""
    from npformer import backend, runtime
    from npformer.cli.main import main
    backend.set_backend("numba")
    runtime.use_table(None)                           # the rules, never a calibrated table
    start = time.perf_counter()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(command_line(name, out))
    if code != 0:
        raise RuntimeError(f"{name}: exit {code}\n{printed.getvalue()[-3000:]}")
    return {**summarise(out), "seconds": round(time.perf_counter() - start, 1)}


def count_threaded_work():
    """Count, from now on in this process, the work that ran on more than one thread: the
    parallel twins of the Numba kernels (work of at least ``SERIAL_BELOW`` elements, the rule of
    kernels/_jit.py) and ``runtime.run_parts`` calls shared between several threads (a
    product's cells or row parts, attention's parts). Returns the dict of counts it fills in.
    A thread test whose runs never ran anything on two threads proves nothing; these say."""
    from npformer import runtime
    from npformer.kernels import _jit
    counts = {"parallel_kernels": 0, "shared_parts": 0}
    kernel_call, run_parts = _jit.ParallelKernel.__call__, runtime.run_parts

    def counted_kernel(self, *args):
        if runtime.kernel_threads() != 1 and self.work(*args) >= _jit.SERIAL_BELOW:
            counts["parallel_kernels"] += 1
        return kernel_call(self, *args)

    def counted_parts(fn, parts, max_workers=None):
        parts = list(parts)
        if min(len(parts), runtime.workers(), max_workers or len(parts)) > 1:
            counts["shared_parts"] += 1
        return run_parts(fn, parts, max_workers)
    _jit.ParallelKernel.__call__, runtime.run_parts = counted_kernel, counted_parts
    return counts


def child_main(argv):
    """``python tests/same_bits.py --child [--tree DIR] RESULT NAME...``: the runs, in order, in
    this process; their summaries, the machine's facts and the threads they ran on (the
    runtime's policy, and the work that ran on more than one thread) written to RESULT as JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("--tree", default=str(ROOT))
    p.add_argument("result")
    p.add_argument("names", nargs="+")
    args = p.parse_args(argv)
    use_tree(args.tree)
    from npformer import runtime
    counts = count_threaded_work()
    results, threaded = {}, {}
    with tempfile.TemporaryDirectory(prefix="same-bits-") as tmp:
        for name in args.names:
            counts.update(dict.fromkeys(counts, 0))
            results[name] = run(name, Path(tmp) / name)
            threaded[name] = dict(counts)
    facts = machine_facts()                           # after the runs: the BLAS is loaded
    policy = runtime.describe()
    threads = {"kernel_threads": policy["kernel_threads"], "workers": policy["workers"],
               "threaded_work": threaded}
    Path(args.result).write_text(json.dumps({"machine": facts, "threads": threads,
                                             "runs": results}))


# -- the parent: child processes with the reference's BLAS kernel, or on a given thread count --
def child_env(tmp, threads=None):
    """The environment of the process that runs the recipes: no calibrated dispatch table (a
    file that does not exist), the default backend and runtime; and OpenBLAS's reference kernels,
    or, given ``threads``, the machine's own BLAS kernels and the runtime on that many threads
    (``NPFORMER_NUM_THREADS``, the other thread caps left out)."""
    from npformer.cores import THREAD_CAPS
    drop = {"NPFORMER_BACKEND", "NPFORMER_RUNTIME", "NPFORMER_DISPATCH_TABLE"}
    if threads is not None:
        drop |= {"OPENBLAS_CORETYPE", *THREAD_CAPS}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if threads is None:
        env["OPENBLAS_CORETYPE"] = BLAS_KERNEL
    else:
        env["NPFORMER_NUM_THREADS"] = str(threads)
    env["NPFORMER_DISPATCH_TABLE"] = str(Path(tmp) / "no-dispatch-table.json")
    return env


def run_in_child(names, tree=ROOT, timeout=None):
    """Run ``names`` in one child process; (machine facts, {name: summary})."""
    return run_in_children([names], tree, timeout)


def run_in_children(groups, tree=ROOT, timeout=None):
    """Run each group of runs in a child process of its own, the children side by side (a
    recipe's data preparation is one thread's work, so two overlap on two cores; the bits do not
    depend on the threads); (machine facts, {name: summary})."""
    children = _run_children([(names, None) for names in groups], tree, timeout)
    runs = {}
    for child in children:
        runs.update(child["runs"])
    return children[0]["machine"], runs


def run_on_threads(names, counts=(1, 2), timeout=None):
    """Run ``names`` once per thread count in ``counts``, each count in a fresh child process
    of its own (side by side) on the machine's own BLAS kernels; {count: what its child wrote:
    "machine", "threads" (the policy it ran on, and each run's work that ran on several
    threads: count_threaded_work's counts) and "runs", {name: summary}}."""
    children = _run_children([(names, n) for n in counts], ROOT, timeout)
    return dict(zip(counts, children))


def _run_children(specs, tree, timeout):
    """Run each (names, threads) of ``specs`` in a child process (child_env's), side by side;
    what each wrote, in order. Raises if one fails or they saw different machines."""
    with tempfile.TemporaryDirectory(prefix="same-bits-") as tmp:
        children = []
        for i, (names, threads) in enumerate(specs):
            result = Path(tmp) / f"result{i}.json"
            log = open(Path(tmp) / f"log{i}.txt", "w+")
            proc = subprocess.Popen([sys.executable, __file__, "--child", "--tree", str(tree),
                                     str(result), *names], env=child_env(tmp, threads),
                                    stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
            children.append((names, result, log, proc))
        written, failed = [], []
        for names, result, log, proc in children:
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            log.seek(0)
            output = log.read()
            log.close()
            if code != 0:
                failed.append(f"the runs {names} failed (exit {code}):\n{output[-6000:]}")
                continue
            written.append(json.loads(result.read_text()))
    if failed:
        raise RuntimeError("\n".join(failed))
    facts = [child["machine"] for child in written]
    if any(f != facts[0] for f in facts):
        raise RuntimeError(f"the child processes saw different machines: {facts}")
    return written


def other_blas(facts):
    """Why the child's BLAS does not compute as the reference's (not OpenBLAS's reference
    kernels), or None."""
    if facts["blas"] is None or facts["blas"][0] != "openblas" or facts["blas"][2] != BLAS_KERNEL:
        return (f"the reference bits are OpenBLAS's {BLAS_KERNEL} kernels; NumPy's BLAS here is "
                f"{facts['blas']} even with OPENBLAS_CORETYPE={BLAS_KERNEL}")
    return None


def other_cpu(facts, reference):
    """Why Numba's kernels do not compile here as for the reference (another CPU or vector
    instruction sets), or None."""
    want = reference["machine"]["vector_isa"]
    if facts["vector_isa"] != want:
        return (f"the reference bits are those of Numba's kernels compiled for "
                f"{'+'.join(want) or 'no AVX'}; this machine compiles them for "
                f"{'+'.join(facts['vector_isa']) or 'no AVX'} (CPU {facts['numba_cpu']!r})")
    return None


def differences(name, got, expected):
    """What run ``name`` gave that the reference does not: a list of lines (empty: the same)."""
    lines = []
    for key in ("train_losses", "evals", "stop_reason", "weights_sha256"):
        if got[key] != expected[key]:
            if key == "train_losses":
                first = next((i for i, (a, b) in enumerate(zip(got[key], expected[key])) if a != b),
                             min(len(got[key]), len(expected[key])))
                lines.append(f"{name}: training losses differ from entry {first} on: got "
                             f"{got[key][first:first + 3]}, expected {expected[key][first:first + 3]}")
            else:
                lines.append(f"{name}: {key}: got {got[key]}, expected {expected[key]}")
    return lines


def load_reference():
    return json.loads(REFERENCE.read_text())


def write(tree, names):
    """Run ``names`` with the code of ``tree`` (each in a process of its own) into the reference;
    a quick run's training losses must be the first ones of the full run it repeats."""
    reference = load_reference() if REFERENCE.is_file() else {"runs": {}}
    facts = None
    for name in names:
        print(f"{name}: {' '.join(command_line(name, 'OUT'))}", flush=True)
        facts_now, runs = run_in_child([name], tree)
        if other_blas(facts_now):
            raise SystemExit(other_blas(facts_now))
        if facts is not None and facts_now != facts:
            raise SystemExit(f"the machine's facts changed between runs: {facts} / {facts_now}")
        facts = facts_now
        reference["runs"][name] = {"argv": RUNS[name]["argv"], **runs[name]}
        print(f"  {runs[name]['seconds']} s, {len(runs[name]['train_losses'])} training losses",
              flush=True)
    if "machine" in reference and reference["machine"] != facts:
        raise SystemExit(f"the reference was written on another machine: {reference['machine']}")
    reference["machine"] = facts
    for name, spec in RUNS.items():
        full = spec.get("prefix_of")
        if name in reference["runs"] and full in reference["runs"]:
            quick, long = reference["runs"][name], reference["runs"][full]
            n = len(quick["train_losses"])
            if quick["train_losses"] != long["train_losses"][:n]:
                raise SystemExit(f"{name}'s training losses are not the first {n} of {full}'s")
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    reference["written_by"] = (f"tests/same_bits.py write --tree <worktree of commit {head}>: "
                               f"the code before issue 68, its kernels included")
    reference["runs"] = dict(sorted(reference["runs"].items()))
    REFERENCE.write_text(json.dumps(reference, indent=1) + "\n")


def check(names, tree=ROOT):
    """Run ``names`` with the code of ``tree`` (all in one process) and compare each with the
    reference; the exit status: 1 if any differs."""
    reference = load_reference()
    for name in names:
        if missing_data(name):
            print(f"{name}: not run: {missing_data(name)}")
    names = [n for n in names if not missing_data(n)]
    why = other_cpu(machine_facts(), reference)
    if why:
        print(f"not compared: {why}")
        return 0
    facts, runs = run_in_child(names, tree)
    why = other_blas(facts)
    if why:
        print(f"not compared: {why}")
        return 0
    failed = False
    for name in names:
        changed = differences(name, runs[name], reference["runs"][name])
        print(f"{name}: {runs[name]['seconds']} s, {'DIFFERS' if changed else 'the same bits'}")
        for line in changed:
            print(f"  {line}")
        failed = failed or bool(changed)
    return 1 if failed else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write the reference from the code of --tree")
    w.add_argument("--tree", required=True, help="a worktree of the reference commit")
    w.add_argument("names", nargs="*", default=[])
    c = sub.add_parser("check", help="run the current tree and compare with the reference")
    c.add_argument("--all", action="store_true", help="the full runs too (minutes each)")
    c.add_argument("--tree", default=str(ROOT),
                   help="the code to run (default this tree; the reference commit's worktree "
                        "tells whether this machine reproduces the reference at all)")
    c.add_argument("names", nargs="*", default=[])
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in RUNS]
    if unknown:
        p.error(f"unknown runs {unknown}; the runs are {list(RUNS)}")
    if args.command == "write":
        return write(args.tree, args.names or list(RUNS))
    names = args.names or [n for n, s in RUNS.items() if s["quick"] or args.all]
    return check(names, args.tree)


if __name__ == "__main__":
    sys.exit(main())
