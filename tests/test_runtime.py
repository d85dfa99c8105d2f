"""npformer.runtime: the cores, the thread policy, BLAS threads around npformer's own calls, the
dispatch table and its fallbacks, and the promise it all serves: the same bits in every process,
on any number of threads, straight through or resumed."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import npformer as nf
from npformer import backend, dispatch_table, runtime

ROOT = Path(__file__).resolve().parent.parent
K = backend.load("numba")
M = sys.modules["npformer.kernels.matmul"]


# -- cores and policy --------------------------------------------------------------------------
@pytest.mark.parametrize("cores", [1, 2, 4, 8, 16, 64])
def test_policy_uses_every_available_core_and_never_more(cores):
    n, notes = runtime.available_cores(affinity=cores, quota=None, environ={})
    assert (n, notes) == (cores, [])
    for numba_max in (1, 2, cores, 256):
        pol = runtime.thread_policy(n, numba_max=numba_max)
        assert pol.cores == cores and pol.workers == cores
        assert pol.kernel_threads == min(cores, numba_max) >= 1


@pytest.mark.parametrize("affinity,quota,expected", [(64, 2.5, 3), (64, 0.5, 1), (4, 16.0, 4),
                                                     (16, None, 16), (8, 8.0, 8)])
def test_a_cgroup_quota_limits_the_cores(affinity, quota, expected):
    assert runtime.available_cores(affinity=affinity, quota=quota, environ={}) == (expected, [])


def test_thread_caps_lower_the_count_and_contradictions_get_one_note_each():
    env = {"OMP_NUM_THREADS": "4"}
    assert runtime.available_cores(affinity=16, quota=None, environ=env) == (4, [])
    env = {"NUMBA_NUM_THREADS": "16", "OMP_NUM_THREADS": "x", "NPFORMER_NUM_THREADS": " "}
    n, notes = runtime.available_cores(affinity=2, quota=None, environ=env)
    assert n == 2 and len(notes) == 2
    assert "NUMBA_NUM_THREADS=16" in notes[1] and "using 2" in notes[1]
    assert "OMP_NUM_THREADS='x'" in notes[0]
    with pytest.raises(ValueError, match="cores: expected a positive integer"):
        runtime.thread_policy(0)


def test_cgroup_quota_files(tmp_path):
    assert runtime.cgroup_cpu_limit(tmp_path) is None                   # no cgroup files
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert runtime.cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert runtime.cgroup_cpu_limit(tmp_path) == 2.5
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert runtime.cgroup_cpu_limit(tmp_path / "v1") is None
    (v1 / "cpu.cfs_quota_us").write_text("400000\n")
    assert runtime.cgroup_cpu_limit(tmp_path / "v1") == 4.0


def test_configure_runtime_checks_its_arguments():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="threads: expected a positive integer"):
            nf.configure_runtime(threads=bad)
        with pytest.raises(ValueError, match="blas_threads"):
            nf.configure_runtime(blas_threads=bad)
    with pytest.raises(ValueError, match="set_deterministic"):
        nf.set_deterministic("yes")
    too_many = runtime.available_cores()[0] + 5
    try:
        with pytest.warns(runtime.NpformerRuntimeWarning, match=f"threads={too_many}"):
            summary = nf.configure_runtime(threads=too_many)
        assert summary["cores"] == runtime.available_cores()[0]
        # BLAS threads past the cores only wait on each other (the command line's
        # --blas-threads 1000 once left a test session's NumPy products on 64 of them)
        with pytest.warns(runtime.NpformerRuntimeWarning, match=f"blas_threads={too_many}"):
            summary = nf.configure_runtime(blas_threads=too_many)
        assert summary["blas_threads"] == runtime.available_cores()[0]
    finally:
        nf.configure_runtime()


def test_restore_puts_back_what_snapshot_took():
    before = runtime.snapshot()
    nf.configure_runtime(threads=1, blas_threads=1, deterministic=False)
    assert runtime.snapshot() != before
    runtime.restore(before)
    assert runtime.snapshot() == before and runtime.policy() == before["policy"]


# -- no side effects ---------------------------------------------------------------------------
def run_python(code, **env):
    full = {k: v for k, v in os.environ.items()
            if k not in ("NUMBA_THREADING_LAYER", runtime.ENV_SWITCH, "OMP_NUM_THREADS")}
    full.update(env)
    full["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()


BLAS_THREADS = ("from threadpoolctl import ThreadpoolController as C\n"
                "def blas(): return C().select(user_api='blas').lib_controllers[0].get_num_threads()\n")


def test_restore_puts_back_the_rules_a_resumed_checkpoint_adopted():
    """Resuming a checkpoint from another machine adopts its choices and the machine features
    its rules read; restore(snapshot()) puts this machine's back (a test that resumed such a
    checkpoint left this process choosing variants as an AVX2 machine, so that the MPI test's
    in-process reference and its fresh ranks computed different bits)."""
    before, features = runtime.snapshot(), runtime.rule_features()
    rec = runtime.record()
    rec.update(features=dict(features, avx512f=not features["avx512f"], cpu="another"),
               choices={"<f4 CC- L1x1x1": "blas"}, machine="another")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")               # "written on another CPU or BLAS"
        runtime.adopt(rec, "a checkpoint of another machine")
    assert runtime.rule_features() != features
    runtime.restore(before)
    assert runtime.rule_features() == features and runtime.snapshot() == before
    assert "<f4 CC- L1x1x1" not in runtime.record()["choices"]


def test_importing_npformer_changes_nothing_and_the_engine_restores_blas_threads():
    code = BLAS_THREADS + """
import sys, numpy as np
before = blas()
import npformer as nf
import numba
print(before == blas(), "npformer.kernels" in sys.modules, numba.config.THREADING_LAYER)
seen = []
K = nf.backend.load("numba")
M = sys.modules["npformer.kernels.matmul"]
blas_variant = M.VARIANTS["blas"]
M.VARIANTS["blas"] = lambda a, b, out: (seen.append(blas()), blas_variant(a, b, out))[1]
model = nf.Transformer(50, 50, d_model=64, n_heads=4, d_ff=128, n_encoder_layers=1,
                       n_decoder_layers=1)
model.forward(np.ones((8, 12), int), np.ones((8, 11), int))
print(before == blas(), sorted(set(seen)))
"""
    assert run_python(code, OPENBLAS_NUM_THREADS="2") == ["True False default", "True [1]"]


def test_numba_runs_on_the_workqueue_layer_and_an_explicit_layer_wins():
    code = """
import numba, numpy as np, npformer as nf
K = nf.backend.load("numba")
from npformer.kernels._jit import SERIAL_BELOW
# work large enough for the parallel kernel (smaller runs its serial twin, see kernels/_jit.py)
K.adam_step(*(np.ones(SERIAL_BELOW, np.float32) for _ in range(4)), 1, 1e-3, 0.9, 0.98, 1e-9, 0.0,
            False)
print(numba.threading_layer())
"""
    assert run_python(code)[-1] == "workqueue"
    assert run_python(code, NUMBA_THREADING_LAYER="omp")[-1] == "omp"


def test_runtime_off_leaves_threads_to_the_libraries():
    code = BLAS_THREADS + """
import numba, numpy as np, npformer as nf
from npformer import runtime
K = nf.backend.load("numba")
numba.set_num_threads(1)
K.adam_step(*(np.ones(64, np.float32) for _ in range(4)), 1, 1e-3, 0.9, 0.98, 1e-9, 0.0, False)
print(runtime.managed(), runtime.kernel_threads(), runtime.workers(), numba.get_num_threads())
"""
    assert run_python(code, NPFORMER_RUNTIME="off")[-1].split() == ["False", "None", "1", "1"]


def test_a_contradicting_thread_setting_warns_once():
    lines = run_python("import warnings, numpy as np, npformer as nf\n"
                       "with warnings.catch_warnings(record=True) as w:\n"
                       "    warnings.simplefilter('always')\n"
                       "    nf.backend.load('numba')\n"
                       "    print(len(w), nf.runtime.policy().cores, str(w[0].message) if w else '')",
                       OMP_NUM_THREADS="512")
    count, cores, message = lines[-1].split(" ", 2)
    assert count == "1" and "OMP_NUM_THREADS=512" in message and f"using {cores}" in message


# -- the dispatch table ------------------------------------------------------------------------
@pytest.fixture
def fresh_dispatch():
    M.reset()
    runtime.use_table(None)
    yield
    runtime.use_table(None)
    dispatch_table._state["adopted"] = {}
    dispatch_table._state["rule_features"] = None
    M.reset()


def table_text(**override):
    data = {"format": runtime.TABLE_FORMAT, "version": runtime.TABLE_VERSION,
            "machine": runtime.machine_id(), "choices": {"<f8 CC- 3x40@40x64": "numba"}}
    data.update(override)
    return json.dumps(data)


@pytest.mark.parametrize("text,message", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "not an npformer dispatch table"),
    (table_text(version=runtime.TABLE_VERSION + 1), "version"),
    (table_text(machine="0123456789abcdef"), "another CPU or BLAS"),
    (table_text(choices={"<f8 CC- 3x40@40x64": "numba-turbo"}), "known variants"),
])
def test_a_bad_table_is_ignored_with_a_warning_naming_the_file(tmp_path, fresh_dispatch, text,
                                                               message):
    path = tmp_path / "table.json"
    path.write_text(text)
    with pytest.warns(runtime.NpformerRuntimeWarning, match=message) as record:
        assert runtime.use_table(path) is False
    assert str(path) in str(record[0].message)
    a, b = np.ones((3, 40)), np.ones((40, 64))
    M.matmul(a, b)
    assert M.choice(a, b) == M.rule(["blas", "numba", "numba-blocked"], runtime.rule_features())


def test_an_unreadable_table_falls_back_and_a_missing_one_is_silent(tmp_path, fresh_dispatch):
    with pytest.warns(runtime.NpformerRuntimeWarning, match="cannot be read"):
        assert runtime.use_table(tmp_path) is False                    # a directory
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert runtime.use_table(tmp_path / "absent.json") is False


def test_a_calibrated_table_decides_and_is_recorded(tmp_path, fresh_dispatch):
    path = runtime.write_table(tmp_path / "t" / "table.json", {"<f8 CC- 3x40@40x64": "numba"})
    assert runtime.use_table(path) is True
    a, b = np.random.default_rng(0).random((3, 40)), np.random.default_rng(1).random((40, 64))
    np.testing.assert_allclose(M.matmul(a, b), a @ b, rtol=0, atol=1e-13)
    assert M.choice(a, b) == "numba"
    rec = runtime.record()
    assert rec["choices"]["<f8 CC- 3x40@40x64"] == "numba" and rec["table"] == rec["choices"]


def test_a_table_naming_a_variant_its_product_cannot_use_is_refused(tmp_path, fresh_dispatch):
    """Attention's products run on several threads at once: a table that gives one of them the
    row-parallel Numba kernel (whose thread pool two threads must not enter) must not be
    followed. The dispatcher warns, naming the table, and the rules choose."""
    a = np.ones((2, 3, 16, 40))
    b = np.ones((2, 3, 40, 16))
    key = M.product_key(a, b, None, M.THREAD_SAFE)
    path = runtime.write_table(tmp_path / "table.json", {key: "numba"})
    assert runtime.use_table(path) is True
    with pytest.warns(runtime.NpformerRuntimeWarning, match=f"table.json.*'numba'.*{key}"):
        np.testing.assert_array_equal(M.matmul(a, b, candidates=M.THREAD_SAFE), a @ b)
    assert M.choice(a, b, candidates=M.THREAD_SAFE) in M.THREAD_SAFE


def test_a_resumed_run_computes_and_records_the_checkpoints_choices(tmp_path, fresh_dispatch):
    """A key computed before the resume (by the rules), a table calibrated since: after adopt,
    the checkpoint's variant computes it, the next checkpoint records that variant, and a key
    first seen after the resume ignores the new table (the straight run had the rules)."""
    a, b = np.ones((5, 40)), np.ones((40, 64))
    M.matmul(a, b)
    ruled = M.choice(a, b)
    other = "numba" if ruled != "numba" else "blas"
    rec = runtime.record()
    rec["choices"] = {M.product_key(a, b): other}
    rec["table"] = {}
    new = np.ones((7, 40))
    path = runtime.write_table(tmp_path / "since.json", {M.product_key(new, b): "numba-blocked"})
    assert runtime.use_table(path) is True
    assert runtime.adopt(rec, "ckpt") is True
    M.matmul(a, b)
    assert M.choice(a, b) == other and runtime.record()["choices"][M.product_key(a, b)] == other
    M.matmul(new, b)
    assert M.choice(new, b) == M.rule(["blas", "numba", "numba-blocked"], runtime.rule_features())


def test_a_checkpoint_from_another_machine_resumes_with_a_warning(fresh_dispatch):
    rec = dict(runtime.record(), machine="0000000000000000")
    with pytest.warns(runtime.NpformerRuntimeWarning, match="another CPU or BLAS"):
        assert runtime.adopt(rec, "ckpt") is False


def test_blas_scopes_from_two_threads_restore_the_users_count_last():
    """BLAS's thread count is one setting for the process: the first scope in saves the user's
    count, and a thread leaving its scope while another is still inside changes nothing; the
    last one out restores the user's count. Nested scopes restore the enclosing count."""
    import threading
    from threadpoolctl import ThreadpoolController
    blas = ThreadpoolController().select(user_api="blas").lib_controllers[0]
    original = blas.get_num_threads()
    blas.set_num_threads(2)
    if blas.get_num_threads() != 2:
        blas.set_num_threads(original)
        pytest.skip("this BLAS cannot run 2 threads here")
    try:
        with runtime.blas_threads(1):
            with runtime.blas_threads(1):            # as a helper thread's scope would nest
                done = threading.Event()

                def other():
                    with runtime.blas_threads(1):
                        pass
                    done.set()
                helper = threading.Thread(target=other)
                helper.start()
                helper.join(10)
                assert done.is_set() and blas.get_num_threads() == 1
            assert blas.get_num_threads() == 1
            with runtime.blas_threads(2):
                assert blas.get_num_threads() == 2
            assert blas.get_num_threads() == 1
        assert blas.get_num_threads() == 2
    finally:
        blas.set_num_threads(original)


def test_the_gradient_norm_does_not_depend_on_the_users_blas_threads():
    """OpenBLAS shares a float64 dot product between its threads and the partial sums follow
    their number; clip_grad_norm's sum of squares runs in npformer's scope."""
    model = nf.Transformer(50, 50, d_model=64, n_heads=4, d_ff=256, n_encoder_layers=2,
                           n_decoder_layers=2, dtype=np.float64)
    model.flatten_parameters()
    model.flat_grads[:] = np.random.default_rng(0).standard_normal(model.flat_grads.shape)
    norms = []
    for n in (1, 2, 3):
        with runtime.blas_threads(n):
            norms.append(nf.optim.clip.grad_norm(model))
    assert norms[1:] == norms[:-1]


def test_the_numpy_backends_products_run_in_npformers_blas_scope(monkeypatch):
    from threadpoolctl import ThreadpoolController
    blas = ThreadpoolController().select(user_api="blas").lib_controllers[0]
    previous = backend.get_backend()
    seen = []
    try:
        backend.set_backend("numpy")
        real = backend.ops().module.linear_forward
        monkeypatch.setattr(backend.ops().module, "linear_forward",
                            lambda *a: (seen.append(blas.get_num_threads()), real(*a))[1])
        backend.set_backend("numpy")                 # a fresh namespace: the patched function
        with runtime.blas_threads(2):
            backend.ops().linear_forward(np.ones((3, 4)), np.ones((5, 4)))
    finally:
        backend.set_backend(previous)
    assert seen == [1]


def test_a_checkpoint_naming_a_lost_variant_resumes_with_the_rules(fresh_dispatch):
    rec = runtime.record()
    rec["choices"] = {"<f8 CC- 3x40@40x64": "numba-turbo", "<f8 CC- 5x40@40x64": "numba"}
    with pytest.warns(runtime.NpformerRuntimeWarning, match="no longer bit-exact"):
        assert runtime.adopt(rec, "runs/x/last") is False
    a, b = np.ones((5, 40)), np.ones((40, 64))
    M.matmul(a, b)
    assert M.choice(a, b) == "numba"                                     # the recorded one
    a = np.ones((3, 40))
    M.matmul(a, b)
    assert M.choice(a, b) == M.rule(["blas", "numba", "numba-blocked"], runtime.rule_features())
    with pytest.warns(runtime.NpformerRuntimeWarning, match="not one this version reads"):
        assert runtime.adopt({"format": "something else"}, "runs/x/last") is False
    assert runtime.adopt(None, "an older checkpoint") is True


def test_a_resume_on_another_machine_keeps_the_recorded_rules_inputs(fresh_dispatch):
    rec = runtime.record()
    rec["features"] = dict(rec["features"], avx512f=True, blas_arch="Haswell")
    assert runtime.adopt(rec, "ckpt") is True
    assert M.rule(["blas", "numba-blocked"], runtime.rule_features()) == "numba-blocked"


def test_calibrate_writes_a_table_the_next_process_uses(tmp_path):
    table = tmp_path / "table.json"
    lines = run_python("from npformer.cli.main import main\n"
                       f"raise SystemExit(main(['calibrate', '--d-model', '32', '--n-heads', '2', "
                       f"'--d-ff', '64', '--layers', '1', '--src-vocab', '50', '--tgt-vocab', "
                       f"'50', '--batch-size', '4', '--min-len', '3', '--max-len-timed', '4', "
                       f"'--out', r'{table}']))")
    assert lines[-1].startswith(f"wrote {table}")
    data = json.loads(table.read_text())
    assert data["machine"] == runtime.machine_id() and len(data["choices"]) >= 10
    assert set(data["choices"].values()) <= set(M.VARIANTS)
    code = ("import numpy as np, npformer as nf\n"
            "K = nf.backend.load('numba')\n"
            "print(nf.runtime.describe()['dispatch_table'])")
    assert run_python(code, NPFORMER_DISPATCH_TABLE=str(table))[-1] == str(table)


def test_a_table_chosen_before_the_engines_first_use_stays_in_force(tmp_path):
    """The default table is read on the engine's first use (``runtime.ensure``, when the kernels
    load) unless ``use_table`` chose one before: then the kernels' loading keeps that choice
    (none, or another file), and the default file is not read over it."""
    default, other = tmp_path / "default.json", tmp_path / "other.json"
    runtime.write_table(default, {"key-a": "blas"})
    runtime.write_table(other, {"key-b": "blas"})

    def in_force(choose):
        code = ("import npformer as nf\n"
                "from npformer import runtime\n"
                f"{choose}\n"
                "K = nf.backend.load('numba')\n"
                "print(runtime.describe()['dispatch_table'], runtime.dispatch_choice('key-a'),"
                " runtime.dispatch_choice('key-b'))")
        return run_python(code, NPFORMER_DISPATCH_TABLE=str(default))[-1]
    assert in_force("pass") == f"{default} blas None"
    assert in_force("runtime.use_table(None)") == "None None None"
    assert in_force(f"runtime.use_table(r'{other}')") == f"{other} None blas"


# -- the same bits every run -------------------------------------------------------------------
TRAIN_TOY = """
import sys, numpy as np, npformer as nf
from npformer.training.toy import TOY_MODEL, toy_data
from npformer.training.trainer import TrainConfig
from npformer.training.translation import translation_trainer
steps, out, resume_from, save_to = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
data = toy_data(0, n_train=1000, n_heldout=10, n_valid=10)
model = nf.Transformer(len(data.vocabs.src), len(data.vocabs.tgt), **TOY_MODEL, seed=3)
config = TrainConfig(max_steps=steps, batch_size=64, lr=3e-3, warmup_steps=20, label_smoothing=0.1,
                     clip_norm=1.0, quiet=True, eval_every=1000)
trainer = translation_trainer(model, data.vocabs, data.train, None, config)
if resume_from != "-":
    trainer.resume(resume_from)
trainer.fit()
if save_to != "-":
    trainer.save(save_to)
np.save(out, model.flat_params)
print(nf.runtime.policy().kernel_threads, trainer.step)
"""


def train_toy(tmp_path, name, steps, threads, resume_from="-", save_to="-", busy=False):
    env = {k: v for k, v in os.environ.items() if k != runtime.ENV_SWITCH}
    env.update(PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS=str(threads))
    out = tmp_path / f"{name}.npy"
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        run = subprocess.run([sys.executable, "-c", TRAIN_TOY, str(steps), str(out), str(resume_from),
                              str(save_to)], capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=600)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    assert run.returncode == 0, run.stderr[-3000:]
    return np.load(out), run.stdout.split()


@pytest.mark.skipif(runtime.available_cores()[0] < 2, reason="needs 2 cores to compare 1 and 2 "
                    "threads (this process may use 1)")
def test_toy_training_gives_the_same_bits_on_1_and_2_threads_and_through_a_resume(tmp_path):
    """80 steps of the toy model with dropout, in four processes: on one thread; on two beside a
    busy core; 40 steps saved and resumed in a fresh process. Every weight is bit-identical.
    (Before the runtime, each process timed the product variants and kept the fastest, and the
    weights differed by up to 0.08.)"""
    one, (threads_one, steps_one) = train_toy(tmp_path, "one", 80, threads=1)
    two, (threads_two, _) = train_toy(tmp_path, "two", 80, threads=2, busy=True)
    assert (threads_one, steps_one) == ("1", "80")
    assert threads_two == "2"
    np.testing.assert_array_equal(two, one)
    half, _ = train_toy(tmp_path, "half", 40, threads=2, save_to=tmp_path / "ckpt")
    assert not np.array_equal(half, one)
    resumed, (_, steps_resumed) = train_toy(tmp_path, "resumed", 80, threads=1,
                                            resume_from=tmp_path / "ckpt")
    assert steps_resumed == "80"
    np.testing.assert_array_equal(resumed, one)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX's")
def test_a_forked_child_runs_parallel_parts_on_helpers_of_its_own():
    """A child forked after a parallel call has none of the parent's helper threads: its first
    call used to hand a part to the copied pool, which no thread runs, and hang."""
    import signal
    import threading
    import time
    nf.configure_runtime(threads=2)
    try:
        if runtime.workers() < 2:
            pytest.skip("needs 2 cores: on one, no helper thread is ever made")
        names = set()
        runtime.run_parts(lambda i: (time.sleep(0.01), names.add(threading.current_thread().name)),
                          range(2))
        assert runtime._state["pool"] is not None            # the parent's helper exists
        pid = os.fork()
        if pid == 0:                                        # the child
            code = 2
            try:
                signal.alarm(20)                            # a hang kills the child
                done = [0] * 4
                runtime.run_parts(lambda i: (time.sleep(0.005), done.__setitem__(i, 1)),
                                  range(4))
                code = 0 if done == [1] * 4 else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        nf.configure_runtime()
