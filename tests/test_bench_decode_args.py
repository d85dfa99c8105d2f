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


def test_profile_covers_every_method_given(monkeypatch, capsys):
    """``--profile`` profiles each method of ``--methods`` (it profiled greedy alone, so beam
    search's costs never showed): the worker runs on stand-ins for the checkpoint and data."""
    from types import SimpleNamespace

    import npformer.training.checkpointing as checkpointing
    import npformer.training.multi30k as multi30k
    calls = []

    class Translator:
        def translate(self, sources, method, beam_size, truncate):
            calls.append((method, beam_size))
            return [SimpleNamespace(tokens=["a"], finished=True) for _ in sources]
    monkeypatch.setattr(checkpointing, "load_model_checkpoint", lambda path: None)
    monkeypatch.setattr(multi30k, "checkpoint_text_settings",
                        lambda loaded: {"src_lang": "de", "tgt_lang": "en"})
    monkeypatch.setattr(multi30k, "text_pipeline",
                        lambda loaded, settings: SimpleNamespace(tokenize=None,
                                                                 tokenised_text=None))
    monkeypatch.setattr(multi30k, "load_split", lambda *a: [("ein satz", "a sentence")])
    monkeypatch.setattr(multi30k, "make_translator", lambda *a: Translator())
    args = bench.parse_args(["--data-dir", "unused", "--methods", "greedy", "beam5",
                             "--repeats", "1", "--profile", "--worker", "npformer"])
    bench.worker(args)
    assert calls.count(("beam", 5)) == 3                # warm-up, one timed pass, the profile
    err = capsys.readouterr().err
    assert "greedy: cProfile of one pass" in err
    assert "beam5: cProfile of one pass" in err
