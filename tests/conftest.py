import sys
from pathlib import Path

import pytest

# tests import their helpers (torch_reference) as top-level modules
sys.path.insert(0, str(Path(__file__).resolve().parent))

MULTI30K_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


@pytest.fixture
def multi30k_dir():
    if not (MULTI30K_DIR / "train.de.gz").exists():
        pytest.skip(f"Multi30k data not found at {MULTI30K_DIR} (see shared/data/multi30k/README.md)")
    return MULTI30K_DIR


@pytest.fixture
def dispatcher_prefers(monkeypatch):
    """dispatcher_prefers("numba-blocked"): from now on the matmul dispatcher takes that
    candidate wherever it is offered (and its first candidate elsewhere), instead of timing them,
    so a test can hold a particular kernel against the reference whatever this machine finds
    fastest. The dispatcher's memory is cleared before and after."""
    import importlib
    dispatcher = importlib.import_module("npformer.kernels.matmul")

    def prefer(name):
        def measure(sig, a, b, out, names):
            dispatcher._choice[sig] = name if name in names else names[0]
            return dispatcher._choice[sig]
        dispatcher.reset()
        monkeypatch.setattr(dispatcher, "_measure", measure)
    yield prefer
    dispatcher.reset()
