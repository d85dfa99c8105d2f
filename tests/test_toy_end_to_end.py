"""`npformer toy`, shortened for CI: three epochs must show that learning happened, the
metrics JSON must hold the promised figures, and the checkpoint must translate."""
import json

from npformer.cli.main import main
from npformer.training.metrics_log import read_metrics_log


def test_short_toy_run_learns_and_translates(tmp_path, capsys):
    out, figures = tmp_path / "run", tmp_path / "figures.json"
    assert main(["toy", "--epochs", "3", "--quiet", "--out", str(out),
                 "--metrics-json", str(figures), "--examples", "2"]) == 0
    printed = capsys.readouterr().out
    assert "held-out exact match" in printed and "->" in printed

    result = json.loads(figures.read_text())
    assert {"train_exact_match", "heldout_exact_match", "train_seconds"} <= set(result)
    # chance is ~0 (sentences of 3-8 words over a 90-word vocabulary)
    assert result["train_exact_match"] > 0.3
    assert result["heldout_exact_match"] > 0.2
    assert 0 < result["train_seconds"] < 120

    losses = [r["loss"] for r in read_metrics_log(out / "metrics.jsonl") if r["event"] == "train"]
    assert losses[-1] < 0.4 * losses[0]

    assert main(["translate", "--checkpoint", str(out), "我 有 一个 苹果"]) == 0
    assert capsys.readouterr().out.strip() != ""
