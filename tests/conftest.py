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
