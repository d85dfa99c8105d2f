import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# tests import their helpers (torch_reference) as top-level modules
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The tests never read the user's calibrated dispatch table (``npformer calibrate`` writes one to
# ~/.cache/npformer by default): with it, this process and the children it starts (mpiexec ranks,
# CLI runs) could pick other product variants than the rules the tests hold them to. A test that
# wants a table sets NPFORMER_DISPATCH_TABLE itself; children inherit this one.
_NO_TABLE = tempfile.mkdtemp(prefix="npformer-tests-")
atexit.register(shutil.rmtree, _NO_TABLE, ignore_errors=True)
os.environ["NPFORMER_DISPATCH_TABLE"] = os.path.join(_NO_TABLE, "no-dispatch-table.json")

MULTI30K_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


@pytest.fixture(autouse=True)
def _runtime_restored():
    """Every test leaves npformer's runtime as it found it: a test that runs ``npformer
    --threads N`` or ``--blas-threads N`` in this process (or calls ``configure_runtime``)
    would otherwise change the threads of every test after it."""
    from npformer import runtime
    before = runtime.snapshot()
    yield
    if runtime.snapshot() != before:
        runtime.restore(before)


def _on_backend(name):
    """Set the backend ``name`` for a test, then restore the one before (a fixture's body)."""
    import npformer as nf
    before = nf.get_backend()
    nf.set_backend(name)
    yield name
    nf.set_backend(before)


@pytest.fixture(params=["numba", "numpy"])
def backend(request):
    """A test that takes ``backend`` runs on both: the Numba kernels and the NumPy reference
    (restored afterwards)."""
    yield from _on_backend(request.param)


@pytest.fixture
def numba_backend():
    """The test runs on the Numba kernels (restored afterwards)."""
    yield from _on_backend("numba")


@pytest.fixture
def numpy_backend():
    """The test runs on the NumPy reference (restored afterwards)."""
    yield from _on_backend("numpy")


@pytest.fixture
def multi30k_dir():
    if not (MULTI30K_DIR / "train.de.gz").exists():
        pytest.skip(f"Multi30k data not found at {MULTI30K_DIR} (see shared/data/multi30k/README.md)")
    return MULTI30K_DIR


@pytest.fixture
def dispatcher_prefers(monkeypatch):
    """dispatcher_prefers("numba-blocked"): from now on the matmul dispatcher takes that
    variant wherever it is offered (and BLAS elsewhere) instead of its rules' choice, so a test
    can hold a particular kernel against the reference whatever this machine's rules choose.
    The dispatcher's choices are cleared before and after."""
    import importlib
    dispatcher = importlib.import_module("npformer.kernels.matmul")

    def prefer(name):
        dispatcher.reset()
        monkeypatch.setattr(dispatcher, "rule", lambda names, features, **shape: name if name in names
                            else names[0])
    yield prefer
    dispatcher.reset()


@pytest.fixture
def nondeterministic():
    """The matmul dispatcher in non-deterministic mode (it times the variants) for one test; its
    choices are cleared before and after, and deterministic mode restored."""
    import importlib
    from npformer import runtime
    dispatcher = importlib.import_module("npformer.kernels.matmul")
    dispatcher.reset()
    runtime.set_deterministic(False)
    yield dispatcher
    runtime.set_deterministic(True)
    dispatcher.reset()


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    """A run directory (best, last, metrics.jsonl) from two epochs of a tiny model on a small toy
    corpus, and that corpus. Shared by the CLI tests, which only read it: a test that points an
    output at it must expect a refusal."""
    import npformer as nf
    from npformer.training.toy import toy_data
    from npformer.training.trainer import TrainConfig
    from npformer.training.translation import translation_trainer
    out = tmp_path_factory.mktemp("run")
    data = toy_data(seed=2, n_train=64, n_heldout=4, n_valid=8)
    model = nf.Transformer(len(data.vocabs.src), len(data.vocabs.tgt), d_model=16, n_heads=2,
                           d_ff=32, n_encoder_layers=1, n_decoder_layers=1, max_len=12)
    trainer = translation_trainer(model, data.vocabs, data.train, data.valid,
                      TrainConfig(epochs=2, batch_size=32, quiet=True, out_dir=str(out), log_every=1))
    trainer.fit()
    return out, data
