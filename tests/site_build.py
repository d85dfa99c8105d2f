"""The documentation site built once per test session (``mkdocs build --strict``, mkdocs.yml),
for every test that reads it: tests/test_site.py, the browser test, the font test."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS_EXTRA = ("mkdocs", "material", "mkdocs_jupyter", "mkdocstrings_handlers.python")
_BUILT = {}          # the session's build: {"site": Path}


def unavailable(reason):
    """Skip for ``reason`` (a tool the site's tests need is missing), or fail where
    ``NPFORMER_REQUIRE_BROWSER=1`` (set by .ci/run) says that the site's tests must run."""
    if os.environ.get("NPFORMER_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}, and NPFORMER_REQUIRE_BROWSER=1 (as in .ci/run) requires it")
    pytest.skip(reason)


def mkdocs_build(root, out):
    """``mkdocs build --strict`` of the repository (or copy) at ``root`` into ``out``."""
    missing = [m for m in DOCS_EXTRA if importlib.util.find_spec(m.split(".")[0]) is None
               or importlib.util.find_spec(m) is None]
    if missing:
        unavailable(f"the docs extra is not installed ({', '.join(missing)} missing): "
                    f"pip install -e '.[docs]'")
    # (not --quiet: it silences the warnings that --strict counts, and nothing then fails)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(root / "mkdocs.yml"), "--site-dir", str(out)],
                          capture_output=True, text=True, cwd=root, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def built_site(tmp_path_factory):
    """The repository's site, built on the first call of the session and reused after it."""
    if "site" not in _BUILT:
        out = tmp_path_factory.mktemp("site")
        r = mkdocs_build(ROOT, out)
        assert r.returncode == 0, r.stdout + r.stderr
        _BUILT["site"] = out
    return _BUILT["site"]
