"""The papers' preprocessing and BLEU (npformer.data.moses, metrics.papers_bleu): reproduces the
tokenised references the Multi30k papers score against, and ``npformer eval`` prints that BLEU
beside ours. Skipped where the optional sacremoses package is not installed."""
import gzip
from pathlib import Path

import pytest

pytest.importorskip("sacremoses", reason="the papers' preprocessing needs the optional sacremoses")

from npformer.cli.main import main  # noqa: E402
from npformer.data.moses import papers_tokenize  # noqa: E402
from npformer.training.metrics import papers_bleu  # noqa: E402

from test_multi30k_training import TINY, mini_dir  # noqa: E402,F401  (the fixture)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def test_moses_normalises_lowercases_and_escapes():
    assert papers_tokenize(['A man\'s "red" hat & coat.'], "en") == [
        "a man &apos;s &quot; red &quot; hat &amp; coat ."]


@pytest.mark.skipif(not (SHARED / "test_2016_flickr.en.gz").exists(),
                    reason="../shared/data/multi30k is absent")
def test_the_papers_tokenised_references_are_reproduced():
    lines = gzip.open(SHARED / "test_2016_flickr.en.gz", "rt", encoding="utf-8").read().split("\n")
    out = papers_tokenize([lines[0], lines[29]], "en")
    assert out == ["a man in an orange hat starring at something .",
                   "one man holds another man &apos;s head down and prepares to punch him in "
                   "the face ."]


def test_papers_bleu_counts_on_the_preprocessed_text():
    refs = ["A dog runs in the park.", "Two men's hats."]
    # hypotheses come detokenised (as npformer's output is): both sides get the same pipeline
    result = papers_bleu(["a dog runs in the park.", "two men's hats."], refs, "en")
    assert result["bleu_papers"] == pytest.approx(100.0)
    assert "tok:none" in result["signature_papers"]
    assert result["signature_papers"].endswith("+moses-lc-esc")
    assert papers_bleu(["a cat sleeps.", "one hat."], refs, "en")["bleu_papers"] < 50


def test_eval_prints_the_papers_bleu_beside_ours(mini_dir, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    assert main(["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--min-freq", "1",
                 "--max-steps", "2", "--max-tokens", "80", "--out", str(run)] + TINY) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run / "last"), "--dataset", "multi30k",
                 "--data-dir", str(mini_dir)]) == 0
    out = capsys.readouterr().out
    assert "BLEU (lowercased)" in out and "BLEU (papers': lowercased, Moses-tokenised" in out
