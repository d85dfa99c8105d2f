"""Issue 68's "what must not change": the real recipes give the very bits of the code before it.

tests/data/same_bits.json holds what commit 4b70321 (the code before issue 68, its kernels
included) gave for each run of tests/same_bits.py: every logged loss, training and validation,
and the sha256 of the final weights. The quick runs (the toy recipe over 2 epochs, all 200
updates of ``npformer lm`` on a small model, the first 10 updates of the base and Tiny Multi30k
recipes) run here; the full ones (the toy run, ``npformer lm --max-steps 200``, the first 200
updates of base and Tiny) run on demand::

    NPFORMER_SAME_BITS=full python -m pytest -q tests/test_same_bits.py

The bits are those of one machine, and the test skips, saying why, where another computes
otherwise:

- NumPy's BLAS: OpenBLAS's Haswell (AVX2 + FMA) kernels, which the recipes' child process asks
  for with OPENBLAS_CORETYPE (another kernel family sums a product's terms in another order);
- the vector instruction sets Numba compiles the kernels for (AVX, AVX2, FMA, AVX-512): the
  kernels are compiled with fastmath's reassociation and contraction, so the vector width orders
  their sums and FMA rounds their products once; and the matrix-product dispatch rules choose
  other variants on an AVX-512 CPU. The reference was written on a Zen 4 that exposed AVX2 and
  FMA but not AVX-512 (Numba's CPU "znver4"; compiled for "haswell" instead, the kernels gave
  the same bits; for plain x86-64, SSE2 only, other bits). On a CPU with AVX-512, such as a
  Zen 5 ("znver5"), the reference runs skip.

Where it fails on another machine, ``python tests/same_bits.py check --tree <worktree of
4b70321>`` tells whether the code before issue 68 gives the reference's bits there at all.

Where they skip, the machine still holds its own bits: the thread test runs
``same_bits.THREAD_RUNS`` (the toy run over 2 epochs, and ``npformer lm`` with Llama's block
on batches large enough for the kernels' parallel twins) in two fresh processes, on 1 and on 2
threads, with the machine's own BLAS kernels, and requires every logged loss and the final
weights' sha256 to agree, and the run on 2 threads to have run kernels and parts on both. It
needs no reference, so it runs on every machine with 2 cores. That a resumed run equals an
uninterrupted one on the machine is tests/test_runtime.py's (the toy model saved on 2 threads
and resumed on 1, in fresh processes) and tests/test_language_model.py's and
tests/test_training.py's. docs/reliability.md has the table of which test skips where.

A run whose data (../shared/data/multi30k, ../shared/data/tinyshakespeare) is absent skips.
"""
import os

import pytest

import same_bits
from npformer import runtime

REFERENCE = same_bits.load_reference()
QUICK = [name for name, spec in same_bits.RUNS.items() if spec["quick"]]
FULL = [name for name, spec in same_bits.RUNS.items() if not spec["quick"]]
FULL_SWITCH = "NPFORMER_SAME_BITS"               # "full": run the full recipes too
THREADS = list(same_bits.THREAD_RUNS)


def _other_machine():
    """Why the reference's bits cannot be expected here, before anything runs, or None."""
    api, _, kernel = (runtime.blas_info() or [(None, None, None)])[0]
    if api != "openblas" or not runtime.machine_features()["avx2"]:
        return (f"the reference bits are OpenBLAS's {same_bits.BLAS_KERNEL} (AVX2) kernels; "
                f"NumPy's BLAS here is {api} {kernel} on a CPU "
                f"{'with' if runtime.machine_features()['avx2'] else 'without'} AVX2")
    return same_bits.other_cpu(same_bits.machine_facts(), REFERENCE)


def _compare(groups):
    """Run each group of runs in a child process and compare each run with the reference
    (skipping where this machine computes otherwise)."""
    why = _other_machine()
    if why:
        pytest.skip(why)
    facts, runs = same_bits.run_in_children(groups, timeout=3600)
    why = same_bits.other_blas(facts)
    if why:
        pytest.skip(why)
    return facts, runs


@pytest.fixture(scope="module")
def quick_runs():
    """The quick runs whose data is here, in two child processes side by side (Tiny's
    preparation, the papers' tokenizer and a SentencePiece model, overlaps the others):
    (facts, {name: summary})."""
    here = [name for name in QUICK if not same_bits.missing_data(name)]
    return _compare([group for group in ([n for n in here if n != "tiny-10"],
                                         [n for n in here if n == "tiny-10"]) if group])


def _assert_same_bits(name, facts, got):
    expected = REFERENCE["runs"][name]
    changed = same_bits.differences(name, got, expected)
    versions = REFERENCE["machine"]["versions"]
    assert not changed, "\n".join(changed + [
        f"(the reference was written with {versions}; this machine has {facts['versions']}: "
        f"where they differ, write it again from the code before issue 68, as "
        f"tests/same_bits.py says, rather than from this tree)"])
    assert got["train_losses"] or got["evals"], f"{name}: no loss was logged"
    assert "last" in got["weights_sha256"], f"{name}: no last checkpoint"


@pytest.mark.parametrize("name", QUICK)
def test_a_quick_run_keeps_the_bits_of_the_code_before_issue_68(name, quick_runs):
    if same_bits.missing_data(name):
        pytest.skip(same_bits.missing_data(name))
    facts, runs = quick_runs
    _assert_same_bits(name, facts, runs[name])


@pytest.mark.parametrize("name", FULL)
def test_a_full_run_keeps_the_bits_of_the_code_before_issue_68(name):
    if os.environ.get(FULL_SWITCH) != "full":
        pytest.skip(f"a full run takes minutes: {FULL_SWITCH}=full python -m pytest -q "
                    f"tests/test_same_bits.py")
    if same_bits.missing_data(name):
        pytest.skip(same_bits.missing_data(name))
    facts, runs = _compare([[name]])
    _assert_same_bits(name, facts, runs[name])


@pytest.fixture(scope="module")
def thread_runs():
    """The thread runs whose data is here, on 1 and on 2 threads, each count in a fresh child
    process on the machine's own BLAS kernels: {count: what its child wrote}."""
    # the cores of the affinity mask and cgroup quota (the children run without the thread caps)
    cores = runtime.available_cores(quota=runtime.cgroup_cpu_limit(), environ={})[0]
    if cores < 2:
        pytest.skip(f"comparing 1 and 2 threads needs 2 cores; the affinity and cgroup quota "
                    f"give {cores}")
    here = [name for name in THREADS if not same_bits.missing_data(name)]
    if not here:
        pytest.skip("no thread run has its data here")
    return same_bits.run_on_threads(here, (1, 2), timeout=1800)


@pytest.mark.parametrize("name", THREADS)
def test_a_run_gives_the_same_bits_on_1_and_2_threads_in_fresh_processes(name, thread_runs):
    """On any machine, whether or not it can check the reference's bits: a real recipe run in
    two fresh processes, on 1 and on 2 threads, logs the same losses and leaves the same
    weights, to the bit; and the run on 2 threads did run kernels and parts on both."""
    if same_bits.missing_data(name):
        pytest.skip(same_bits.missing_data(name))
    one, two = thread_runs[1], thread_runs[2]
    assert (one["threads"]["kernel_threads"], one["threads"]["workers"]) == (1, 1)
    assert (two["threads"]["kernel_threads"], two["threads"]["workers"]) == (2, 2)
    work = two["threads"]["threaded_work"][name]
    assert work["parallel_kernels"] > 0 and work["shared_parts"] > 0, (
        f"{name} ran nothing on two threads ({work}): it cannot show a thread-count dependence")
    assert one["threads"]["threaded_work"][name] == {"parallel_kernels": 0, "shared_parts": 0}
    got, expected = two["runs"][name], one["runs"][name]
    changed = same_bits.differences(name, got, expected)
    assert not changed, "\n".join(["on 2 threads (got) and on 1 (expected):"] + changed)
    assert got["train_losses"] or got["evals"], f"{name}: no loss was logged"
    assert "last" in got["weights_sha256"], f"{name}: no last checkpoint"


def test_the_reference_holds_every_run_as_its_command_line_is_today():
    """A run's command line cannot change without its reference being written again, and a
    quick run repeats the first updates of the full run it stands for."""
    assert sorted(REFERENCE["runs"]) == sorted(same_bits.RUNS)
    for name, spec in same_bits.RUNS.items():
        expected = REFERENCE["runs"][name]
        assert expected["argv"] == spec["argv"], name
        assert expected["train_losses"] or expected["evals"], name
        assert "last" in expected["weights_sha256"], name
        full = spec.get("prefix_of")
        if full:
            n = len(expected["train_losses"])
            assert expected["train_losses"] == REFERENCE["runs"][full]["train_losses"][:n], name
    assert REFERENCE["machine"]["blas"][2] == same_bits.BLAS_KERNEL
