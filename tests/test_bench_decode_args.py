"""benchmarks/bench_decode.py's command line: the Multi30k files default to the download's folder
(``npformer download multi30k``), not to a ``../shared`` beside the authors' checkout."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_decode_under_test",
                                               REPO / "benchmarks" / "bench_decode.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_data_dir_defaults_to_the_download_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("NPFORMER_DATA", str(tmp_path / "data"))
    assert bench.parse_args([]).data_dir == str(tmp_path / "data")
    monkeypatch.delenv("NPFORMER_DATA")
    assert bench.parse_args([]).data_dir == str(Path.home() / ".cache" / "npformer" / "multi30k")
    assert bench.parse_args(["--data-dir", "elsewhere"]).data_dir == "elsewhere"
