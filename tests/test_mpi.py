"""Data-parallel training on MPI (issue: "Data-parallel training on MPI"). The tests launch
``mpiexec`` themselves, with a timeout, and skip where it or mpi4py is absent (the ``mpi`` extra:
``pip install 'npformer[mpi]'``)."""
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from npformer.checkpoint import load_checkpoint
from npformer.distributed import launcher_size, plan_shares, suggest_split

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MPIEXEC = shutil.which("mpiexec")


needs_mpi = pytest.mark.skipif(
    MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpiexec and mpi4py: pip install 'npformer[mpi]' (mpi4py and the MPICH wheel)")


def _env(**extra):
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    env.update(extra)
    return env


def mpirun(*ranks, timeout=120, env=None):
    """Run ``mpiexec`` with one ``-n N argv...`` block per element of ``ranks`` (MPMD: ranks
    may run different commands; ``(n, argv, folder)`` also runs them in another working
    folder); returns the CompletedProcess."""
    cmd = [MPIEXEC]
    for i, (n, argv, *folder) in enumerate(ranks):
        cmd += ([":"] if i else []) + ["-n", str(n)] + \
            (["-wdir", str(folder[0])] if folder else []) + [str(a) for a in argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env or _env())


NPFORMER = [sys.executable, "-m", "mpi4py", "-m", "npformer"]     # the documented launch
PLAIN = [sys.executable, "-m", "npformer"]                        # mpiexec -n N npformer ...
TOY = ["train", "--dataset", "toy", "--quiet"]


def _records(run_dir, event):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


# -- without MPI: nothing changes ------------------------------------------------------------------
def test_launcher_size_reads_the_launchers_environment():
    assert launcher_size({}) is None
    assert launcher_size({"PMI_SIZE": "4", "PMI_RANK": "1"}) == ("PMI_SIZE", 4)
    assert launcher_size({"OMPI_COMM_WORLD_SIZE": "2"}) == ("OMPI_COMM_WORLD_SIZE", 2)
    assert launcher_size({"PMIX_RANK": "0"}) == ("PMIX_RANK", None)
    with pytest.raises(ValueError, match=r"\$PMI_SIZE='x'"):
        launcher_size({"PMI_SIZE": "x"})


def test_every_rank_gets_its_own_share_of_the_cores():
    cpus = list(range(16))
    shares, threads, note = plan_shares([cpus] * 8, 16)
    assert shares == [cpus[i:i + 2] for i in range(0, 16, 2)] and threads == [2] * 8
    assert note is None
    shares, threads, _ = plan_shares([cpus] * 3, 16)                # 16 // 3: one core idle
    assert [len(s) for s in shares] == [5, 5, 5] and threads == [5] * 3
    assert len({c for s in shares for c in s}) == 15                # disjoint
    shares, threads, _ = plan_shares([cpus] * 2, 4)                 # a quota of 4 cores
    assert threads == [2, 2]
    shares, threads, note = plan_shares([[0, 1]] * 3, 2)
    assert threads == [1] * 3 and "3 ranks on 2 CPU(s)" in note
    shares, threads, note = plan_shares([cpus] * 8, 4)              # 8 ranks, a quota of 4
    assert threads == [1] * 8 and "8 ranks on a quota of 4 core(s)" in note


def test_ranks_bound_by_the_launcher_keep_their_cpus_or_split_a_shared_set():
    # bound one per core (srun --cpu-bind, Open MPI's default for 2 ranks): kept
    assert plan_shares([[0, 1], [2, 3]], 4) == ([[0, 1], [2, 3]], [2, 2], None)
    # a rank bound to CPUs that an unbound one also runs on: said
    assert "bound some ranks to CPUs that others also run on" in plan_shares(
        [[0, 1, 2, 3], [0, 1]], 4)[2]
    # Open MPI's default for more ranks: bound per socket; the ranks of a socket split it
    sockets = [list(range(8))] * 2 + [list(range(8, 16))] * 2
    shares, threads, note = plan_shares(sockets, 16)
    assert shares == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert threads == [4] * 4 and note is None
    # a rank alone on its socket keeps it, while the other socket's two ranks split theirs
    shares, threads, _ = plan_shares([list(range(8))] * 2 + [list(range(8, 16))], 16)
    assert shares == [[0, 1, 2, 3], [4, 5, 6, 7], list(range(8, 16))] and threads == [4, 4, 8]


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_a_resume_on_another_number_of_ranks_stretches_the_rest_of_the_schedule(tmp_path, schedule):
    """An epoch of a 2-rank run holds half the updates of one process's: a decay over the run
    keeps its rate at the resume (no jump) and its rest is stretched over the updates left on
    the new number of ranks, so it still reaches min_lr at the last one; a second resume keeps
    that stretch."""
    from mpi_reference import small_toy_trainer

    from npformer.training.collective import SingleProcess

    class TwoRanks(SingleProcess):               # only its size matters here
        size = 2

    def trainer(collective, **changes):
        t = small_toy_trainer(0.0, None)
        t.config = dataclasses.replace(t.config, **{"schedule": schedule, "epochs": 4,
                                                    "min_lr": 1e-5, **changes})
        t.set_collective(collective)
        return t

    one = trainer(SingleProcess())
    per_epoch = one.task.batches_per_epoch()
    one.step, one.epoch = per_epoch, 1           # the end of epoch 1 of 4, on one process
    one.save(tmp_path / "ckpt")
    two = trainer(TwoRanks())
    with pytest.warns(UserWarning, match="trained on 1 process"):
        two.resume(tmp_path / "ckpt")
    left = 3 * math.ceil(per_epoch / 2)          # the updates of 3 epochs on 2 ranks
    assert two.schedule(per_epoch) == one.schedule(per_epoch)          # no jump
    assert two.schedule(per_epoch + left) == pytest.approx(1e-5)       # the end at the end
    assert two.schedule(per_epoch + left // 2) == pytest.approx(one.schedule(
        per_epoch + 3 * per_epoch // 2), rel=0.05)                      # halfway is halfway
    # a second resume, on 2 ranks again, keeps the stretch
    two.step, two.epoch = per_epoch + math.ceil(per_epoch / 2), 2
    two.save(tmp_path / "ckpt2")
    again = trainer(TwoRanks())
    again.resume(tmp_path / "ckpt2")
    assert [again.schedule(s) for s in (two.step, per_epoch + left)] == \
        [two.schedule(s) for s in (two.step, per_epoch + left)]
    # asking for a longer run (--epochs) gives a new schedule over it
    longer = trainer(TwoRanks(), epochs=6)
    with pytest.warns(UserWarning):
        longer.resume(tmp_path / "ckpt")
    assert longer.total_steps == 6 * math.ceil(per_epoch / 2)


def test_the_weights_check_looks_at_every_weight():
    from npformer.training.collective import weights_check
    flat = np.arange(10_000, dtype=np.float32)
    stride = 10_000 // 4096
    base = [weights_check(flat, step) for step in range(stride)]
    for i in (0, 1, 4097, 9_999):                # any one weight changed is seen within stride
        moved = flat.copy()
        moved[i] += 1
        assert any(weights_check(moved, step) != base[step] for step in range(stride)), i


def test_rank_0_validates_on_every_cpu_of_the_machine_then_returns_to_its_share():
    """``whole_machine`` (validation on rank 0) moves every thread of the process, the runtime's
    workers included, onto the machine's CPUs and back (a fake world of 2 local ranks)."""
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs Linux affinity and at least 2 CPUs")
    code = """
import os, types
import numpy as np
from npformer import distributed, runtime
from npformer.kernels.layernorm import layernorm_forward
cpus = sorted(os.sched_getaffinity(0))
distributed.pin(cpus[:1])
runtime.configure_runtime(threads=1)
x = np.ones((512, 128), np.float32); g = np.ones(128, np.float32)
layernorm_forward(x, g, 0 * g)                  # (start the workers on the share)
world = types.SimpleNamespace(local_size=2, machine_cpus=cpus, share=(cpus[:1], 1, None))
def every_thread():
    return {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")}
with distributed.whole_machine(world):
    layernorm_forward(x, g, 0 * g)
    assert every_thread() == {tuple(cpus)}, every_thread()
    assert runtime.policy().cores == len(cpus)
assert every_thread() == {tuple(cpus[:1])}, every_thread()
assert runtime.policy().cores == 1
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]


def test_suggested_split():
    assert suggest_split(1) == (1, 1)
    assert suggest_split(2) == (2, 1)
    assert suggest_split(16) == (16, 1)
    with pytest.raises(ValueError, match="cores"):
        suggest_split(0)


def test_without_a_launcher_train_never_imports_mpi(tmp_path):
    code = ("import sys; from npformer.cli.main import main; "
            f"rc = main(['train', '--dataset', 'toy', '--out', {str(tmp_path / 'run')!r}, "
            "'--epochs', '1', '--quiet']); assert 'mpi4py' not in sys.modules, 'imported'; "
            "sys.exit(rc)")
    env = {k: v for k, v in _env().items() if k not in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE",
                                                       "PMIX_RANK", "SLURM_STEP_NUM_TASKS")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "last.npz").exists()


def test_a_launcher_without_mpi4py_is_a_clear_error_on_every_rank(tmp_path):
    code = ("import sys; sys.modules['mpi4py'] = None; from npformer.cli.main import main; "
            f"sys.exit(main(['train', '--dataset', 'toy', '--out', {str(tmp_path / 'run')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=ROOT, env=_env(PMI_SIZE="2", PMI_RANK="1"))
    assert r.returncode == 1
    assert "npformer train: error:" in r.stderr and "pip install 'npformer[mpi]'" in r.stderr
    assert "$PMI_SIZE=2" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()                  # no independent copy of the run


def test_commands_that_run_in_one_process_refuse_a_launcher(tmp_path):
    r = subprocess.run(PLAIN + ["translate", "--checkpoint", str(tmp_path / "x"), "hello"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env=_env(OMPI_COMM_WORLD_SIZE="4"))
    assert r.returncode == 1
    assert "npformer translate runs in one process" in r.stderr and "4 of them" in r.stderr


# -- two ranks ---------------------------------------------------------------------------------
@needs_mpi
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("reduce", ["ordered", "mpi"])
def test_two_ranks_take_the_update_of_one_process(tmp_path, reduce, dropout):
    """3 Adam updates on 2 ranks against the same updates computed in one process (each rank's
    batch into its own zeroed buffer with its dropout stream, summed in rank order): the same
    bits with the ordered reduction, float round-off with MPI's."""
    from mpi_reference import reference_params
    out = tmp_path / "params.npy"
    r = mpirun((2, [sys.executable, "-m", "mpi4py", HERE / "mpi_steps.py", out, reduce,
                    dropout, 3]))
    assert r.returncode == 0, r.stderr[-2000:]
    got, want = np.load(out), reference_params(dropout, 3)
    if reduce == "ordered":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    from mpi_reference import small_toy_trainer
    assert not np.array_equal(got, small_toy_trainer(dropout, 3).model.flat_params)   # it moved


@needs_mpi
def test_two_rank_training_learns_writes_one_run_and_resumes(tmp_path):
    """(A schedule that does not depend on the number of epochs, so that a run of 3 epochs
    continued to 6 is the run of 6.)"""
    straight, split = tmp_path / "straight", tmp_path / "split"
    toy = TOY + ["--schedule", "inverse_sqrt"]
    r = mpirun((2, NPFORMER + toy + ["--out", straight, "--epochs", "6"]))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("done:") == 1                      # rank 0 speaks for the run
    evals = _records(straight, "eval")
    assert evals[-1]["loss"] < evals[0]["loss"] - 1.0
    assert evals[-1]["exact_match"] > evals[0]["exact_match"] + 0.2
    assert sorted(p.name for p in straight.iterdir()) == [
        "best.json", "best.npz", "last.json", "last.npz", "metrics.jsonl"]
    assert len(_records(straight, "start")) == 1 and len(_records(straight, "end")) == 1
    assert _records(straight, "eval")[0]["step"] == 24      # 47 batches: 24 updates on 2 ranks
    # the same run in two sessions on 2 ranks: the same bits
    r = mpirun((2, PLAIN + toy + ["--out", split, "--epochs", "3"]))
    assert r.returncode == 0, r.stderr[-2000:]
    r = mpirun((2, NPFORMER + toy + ["--out", split, "--epochs", "6",
                                     "--resume", split / "last"]))
    assert r.returncode == 0, r.stderr[-2000:]
    (a, a_meta), (b, b_meta) = load_checkpoint(straight / "last"), load_checkpoint(split / "last")
    assert a_meta["training"]["step"] == b_meta["training"]["step"] == 6 * 24
    assert a.keys() == b.keys()
    for name in a:                               # weights, Adam's moments, the dropout rng
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    # on 1 rank: it continues, and says it is not bit-exact
    r = subprocess.run(PLAIN + toy + ["--out", split, "--epochs", "7", "--resume", split / "last"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert "trained on 2 process(es), this one on 1" in r.stderr and "not bit-exact" in r.stderr
    training = load_checkpoint(split / "last")[1]["training"]
    assert training["epoch"] == 7 and training["step"] == 6 * 24 + 47   # 47 batches, 1 each


@needs_mpi
def test_two_ranks_learn_a_multi30k_subset(tmp_path, multi30k_dir):
    run = tmp_path / "m30k"
    r = mpirun((2, NPFORMER + ["train", "--dataset", "multi30k", "--data-dir", multi30k_dir,
                               "--subset", "3000", "--valid-subset", "100", "--d-model", "64",
                               "--d-ff", "128", "--n-heads", "4", "--layers", "2",
                               "--max-tokens", "1500", "--max-steps", "60", "--eval-every", "30",
                               "--lr", "3e-3", "--warmup-steps", "10", "--schedule", "cosine",
                               "--quiet", "--out", run]), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    evals = _records(run, "eval")
    assert [e["step"] for e in evals] == [30, 60]
    train = _records(run, "train")
    assert train[-1]["loss"] < train[0]["loss"] - 1.0


@needs_mpi
@pytest.mark.parametrize("launch", ["mpi4py", "plain"])
def test_an_error_on_one_rank_ends_the_job(tmp_path, launch):
    """Both ranks run the same command line, so they pass the start-up agreement; rank 1 then
    fails on its own (its working folder lacks the data files) while rank 0 goes on to the first
    exchange: the job ends within seconds, non-zero, with rank 1's message."""
    cmd = NPFORMER if launch == "mpi4py" else PLAIN
    here, there = tmp_path / "with_data", tmp_path / "without"
    here.mkdir(), there.mkdir()
    (here / "pairs.src").write_text("a b c\nb c\nc a\n" * 4, encoding="utf-8")
    (here / "pairs.tgt").write_text("x y\ny z x\nz\n" * 4, encoding="utf-8")
    argv = cmd + ["train", "--src-file", "pairs.src", "--tgt-file", "pairs.tgt", "--layers", "1",
                  "--d-model", "8", "--d-ff", "8", "--epochs", "1", "--quiet",
                  "--out", tmp_path / "run"]
    t0 = time.monotonic()
    r = mpirun((1, argv, here), (1, argv, there), timeout=90)
    assert r.returncode != 0
    assert "(rank 1 of 2): error:" in r.stderr and "pairs.src" in r.stderr, r.stderr[-2000:]
    assert "other option" not in r.stderr and "another command" not in r.stderr
    assert time.monotonic() - t0 < 60


@needs_mpi
@pytest.mark.parametrize("fault,says", [
    ("save", ["npformer (rank 0 of 2): OSError", "No space left on device"]),
    ("evaluate", ["RuntimeError: validation failed (a test's fault)",          # its traceback
                  "EveryRankError: rank 0 of the data-parallel run failed in validation"]),
    ("drift", ["data-parallel ranks diverged: the weights of rank 1 differ from rank 0's"])])
def test_a_trainer_failing_on_one_rank_ends_every_rank(tmp_path, fault, says):
    """The Trainer used as a library: an exception on one rank alone (rank 0's save or
    validation), or weights that drift apart, end the job within seconds instead of leaving the
    other rank waiting in its next exchange."""
    t0 = time.monotonic()
    r = mpirun((2, [sys.executable, "-m", "mpi4py", HERE / "mpi_steps.py",
                    tmp_path / "params.npy", "ordered", 0.0, 3, fault]), timeout=90)
    assert r.returncode != 0
    for text in says:
        assert text in r.stderr, r.stderr[-3000:]
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "params.npy").exists()


@needs_mpi
@pytest.mark.parametrize("other,named", [(["--lr", "0.002"], "option lr"),
                                          (["--reduce", "mpi"], "option reduce")])
def test_ranks_started_differently_are_refused(tmp_path, other, named):
    r = mpirun((1, NPFORMER + TOY + ["--out", tmp_path / "run"]),
               (1, NPFORMER + TOY + ["--out", tmp_path / "run"] + other), timeout=90)
    assert r.returncode != 0
    assert f"rank 1 of the data-parallel run was started with other {named} than rank 0" in r.stderr
    assert not (tmp_path / "run" / "last.npz").exists()


@needs_mpi
def test_a_killed_rank_ends_the_job_and_the_run_resumes(tmp_path):
    run, mark = tmp_path / "run", uuid.uuid4().hex
    cmd = [MPIEXEC, "-n", "2"] + NPFORMER + TOY + ["--out", str(run), "--epochs", "40"]
    job = subprocess.Popen(cmd, cwd=ROOT, env=_env(NPFORMER_TEST_MARK=mark),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (run / "last.npz").exists():               # a first checkpoint (epoch 1)
            assert job.poll() is None and time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.2)
        os.kill(_rank_pid(mark, 1), signal.SIGKILL)
        t0 = time.monotonic()
        job.wait(timeout=60)
        assert job.returncode != 0 and time.monotonic() - t0 < 30
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    step = load_checkpoint(run / "last")[1]["training"]["step"]
    r = mpirun((2, NPFORMER + TOY + ["--out", run, "--resume", run / "last",
                                     "--max-steps", step + 5]))
    assert r.returncode == 0, r.stderr[-2000:]
    assert load_checkpoint(run / "last")[1]["training"]["step"] == step + 5


def _rank_pid(mark, rank):
    """The pid of the process of rank ``rank`` whose environment holds NPFORMER_TEST_MARK=mark."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"NPFORMER_TEST_MARK={mark}".encode() in env and \
                any(e in env for e in (f"PMI_RANK={rank}".encode(),
                                       f"OMPI_COMM_WORLD_RANK={rank}".encode())):
            if b"python" in (entry / "cmdline").read_bytes():
                return int(entry.name)
    raise AssertionError(f"no process of rank {rank} found")
