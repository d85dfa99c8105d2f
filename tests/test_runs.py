"""Run folders (npformer.cli.runs): what train, toy and average may do with a folder or a
checkpoint that already holds saved work, and options that would be silently ignored."""
import json

import pytest

from npformer.cli.main import main
from npformer.cli.runs import is_toy_run, remove_stale_temps, run_files
from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.metrics_log import read_metrics_log
from npformer.training.toy import toy_data

TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--layers", "1", "--quiet"]


def toy(out, *extra):
    return main(["toy", "--out", str(out), "--examples", "0", "--max-steps", "3", *TINY, *extra])


def train(out, *extra):
    return main(["train", "--dataset", "toy", "--out", str(out), "--max-steps", "3", *TINY, *extra])


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def one_line_error(capsys, *parts):
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    for part in parts:
        assert part in err, err
    return err


def test_average_never_replaces_an_input_or_an_existing_checkpoint(tmp_path, capsys):
    assert toy(tmp_path / "R") == 0 and train(tmp_path / "B") == 0
    r_last, b_last, b_best = (str(tmp_path / "R" / "last"), str(tmp_path / "B" / "last"),
                              str(tmp_path / "B" / "best"))
    before = snapshot(tmp_path / "R")
    capsys.readouterr()
    assert main(["average", "--out", r_last, r_last, b_last]) == 1
    one_line_error(capsys, f"--out {r_last}", "names the input")
    assert main(["average", "--out", r_last + ".npz", b_best, b_last]) == 1
    one_line_error(capsys, "already exists", "--overwrite")
    assert snapshot(tmp_path / "R") == before
    assert load_model_checkpoint(r_last).meta["training"]["step"] == 3     # still resumable
    assert main(["average", "--out", r_last, b_best, b_last, "--overwrite"]) == 0
    assert "averaged_from" in load_model_checkpoint(r_last).meta["extra"]
    assert main(["average", "--out", str(tmp_path / "avg"), b_best, b_last]) == 0


def test_train_refuses_a_folder_holding_a_run_and_overwrite_removes_only_its_files(tmp_path, capsys):
    run = tmp_path / "run"
    assert train(run, "--max-steps", "4") == 0
    (run / "notes.txt").write_text("mine")
    stale = run / ".last.npz.0123456789abcdef.tmp"
    stale.write_bytes(b"half a checkpoint")
    before = snapshot(run)
    capsys.readouterr()
    assert train(run) == 1
    one_line_error(capsys, f"--out {run}: already holds a run", "--resume", "--overwrite")
    assert snapshot(run) == before
    assert train(run, "--overwrite") == 0
    assert "removed the previous run" in capsys.readouterr().out
    assert (run / "notes.txt").read_text() == "mine" and not stale.exists()
    assert load_model_checkpoint(run / "last").meta["training"]["step"] == 3
    events = [r["event"] for r in read_metrics_log(run / "metrics.jsonl")]
    assert events.count("start") == 1 and events.count("end") == 1      # a new log, not appended


def test_toy_replaces_its_own_run_and_refuses_any_other(tmp_path, capsys):
    t, b = tmp_path / "T", tmp_path / "B"
    assert toy(t, "--max-steps", "5") == 0 and is_toy_run(t)
    assert toy(t) == 0
    assert f"replacing the previous toy run in {t}" in capsys.readouterr().out
    assert load_model_checkpoint(t / "last").meta["training"]["step"] == 3
    assert [r["event"] for r in read_metrics_log(t / "metrics.jsonl")].count("start") == 1
    assert train(b) == 0 and not is_toy_run(b)
    before = snapshot(b)
    capsys.readouterr()
    assert toy(b) == 1
    one_line_error(capsys, f"--out {b}: holds a run that npformer toy did not write", "--overwrite")
    assert snapshot(b) == before
    assert toy(b, "--overwrite") == 0 and is_toy_run(b)


def test_toy_prints_a_checkpoint_that_exists(tmp_path, capsys):
    # 3 steps end inside the first epoch: the final weights are validated, so best exists
    assert toy(tmp_path / "X", "--metrics-json", str(tmp_path / "m.json")) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("checkpoint:")]
    path = printed[0].split()[1]
    assert path == str(tmp_path / "X" / "best") and (tmp_path / "X" / "best.npz").exists()
    assert json.loads((tmp_path / "m.json").read_text())["checkpoint"] == path


def test_toy_metrics_json_is_checked_before_training(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert toy(tmp_path / "run", "--metrics-json", str(tmp_path / "file" / "m.json")) == 1
    one_line_error(capsys, "--metrics-json", "is a file, not a folder")
    assert not (tmp_path / "run").exists()
    assert toy(tmp_path / "run", "--metrics-json", str(tmp_path / "run" / "last.json")) == 1
    one_line_error(capsys, "--metrics-json", "is named like a run's own file")


@pytest.mark.parametrize("extra,option", [
    (["--data-dir", "somewhere"], "--data-dir"),
    (["--subword", "100"], "--subword"),
    (["--subset", "10"], "--subset"),
    (["--src", "en"], "--src"),
    (["--cased"], "--cased"),
    (["--min-freq", "2"], "--min-freq"),
    (["--valid-src", "v.txt"], "--valid-src"),
])
def test_options_the_toy_dataset_would_ignore_are_refused(tmp_path, capsys, extra, option):
    assert train(tmp_path / "run", *extra) == 1
    one_line_error(capsys, f"{option}: not used with --dataset toy")
    assert not (tmp_path / "run").exists()


@pytest.fixture
def text_files(tmp_path):
    data = toy_data(seed=3, n_train=40, n_heldout=2, n_valid=4)
    (tmp_path / "s.txt").write_text("\n".join(zh for zh, _ in data.train) + "\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("\n".join(en for _, en in data.train) + "\n", encoding="utf-8")
    return ["train", "--src-file", str(tmp_path / "s.txt"), "--tgt-file", str(tmp_path / "t.txt"),
            "--max-steps", "2", *TINY]


@pytest.mark.parametrize("extra,message", [
    (["--subset", "5"], "--subset: not used with --dataset files"),
    (["--data-dir", "x"], "--data-dir: not used with --dataset files"),
    (["--patience", "2"], "--patience: acts on validation"),
    (["--average-last", "2"], "--average-last: acts on validation"),
    (["--min-freq", "100000"], "--min-freq 100000: leaves the source vocabulary with only its 4 "
                               "special tokens"),
])
def test_files_dataset_refuses_what_it_would_ignore_or_cannot_train(tmp_path, capsys, text_files,
                                                                     extra, message):
    assert main(text_files + ["--out", str(tmp_path / "run"), *extra]) == 1
    one_line_error(capsys, message)
    assert not (tmp_path / "run").exists()


def test_empty_validation_files_are_refused(tmp_path, capsys, text_files):
    (tmp_path / "v.txt").write_text("")
    assert main(text_files + ["--out", str(tmp_path / "run"), "--valid-src", str(tmp_path / "v.txt"),
                              "--valid-tgt", str(tmp_path / "v.txt")]) == 1
    one_line_error(capsys, "validation data", "v.txt is empty")


def test_an_input_inside_the_run_folder_named_like_a_run_file_is_refused(tmp_path, capsys, text_files):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text((tmp_path / "s.txt").read_text(encoding="utf-8"),
                                       encoding="utf-8")
    argv = text_files[:]
    argv[argv.index("--src-file") + 1] = str(run / "metrics.jsonl")
    for extra in ([], ["--overwrite"]):          # --overwrite would delete the input itself
        assert main(argv + ["--out", str(run), *extra]) == 1
        one_line_error(capsys, f"--src-file {run / 'metrics.jsonl'}: is a file of the run")
        assert (run / "metrics.jsonl").read_text(encoding="utf-8") == \
            (tmp_path / "s.txt").read_text(encoding="utf-8")


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("keep me")
    assert train(tmp_path / "f") == 1
    one_line_error(capsys, "--out", "is a file; expected a run folder")
    assert (tmp_path / "f").read_text() == "keep me"


def test_stale_temps_are_the_only_files_removed(tmp_path):
    keep = [".hidden", "last.npz", "notes.tmp", ".last.npz.tmp", ".x.txt.0123abcd.tmp"]
    stale = [".last.npz.0123456789abcdef.tmp", ".best.json.00ff.tmp", ".my_avg.npz.abcdef01.tmp"]
    for name in keep + stale:
        (tmp_path / name).write_text("")
    assert remove_stale_temps(tmp_path) == sorted(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)
    assert run_files(tmp_path) == ["last.npz"]
