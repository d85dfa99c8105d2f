"""Every user mistake at the command line ends in one line on stderr naming the option or file and a
non-zero exit; a bug ends in one line pointing at a saved traceback. The tests use the shared tiny
run of conftest and never start a training of their own."""
import errno
import io
import sys
import tempfile

import numpy as np
import pytest

from npformer.cli import common as cli_common, evaluate, main as cli_main, toy
from npformer.cli.main import main
from npformer.data import textfile


@pytest.fixture
def pair(run_dir, tmp_path):
    _, data = run_dir
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(zh + "\n" for zh, _ in data.train[:3]), encoding="utf-8")
    ref.write_text("".join(en + "\n" for _, en in data.train[:3]), encoding="utf-8")
    return src, ref


def one_line_error(capsys, *names):
    """stderr's single line; it must name every one of ``names``."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def usage_error(capsys, argv, *names):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return one_line_error(capsys, *names)


# --- numeric options are checked as they are parsed ------------------------------------------

@pytest.mark.parametrize("argv,option,expected", [
    (["toy", "--layers", "0"], "--layers", "positive integer"),
    (["toy", "--layers", "-2"], "--layers", "positive integer"),
    (["toy", "--d-model", "abc"], "--d-model", "positive integer"),
    (["toy", "--seed", "-1"], "--seed", "non-negative integer"),
    (["toy", "--dropout", "1"], "--dropout", "[0, 1)"),
    (["toy", "--lr", "nan"], "--lr", "expected a finite positive number, got 'nan'"),
    (["toy", "--lr", "0"], "--lr", "finite positive number"),
    (["toy", "--clip-norm", "-1"], "--clip-norm", "finite number >= 0"),
    (["toy", "--label-smoothing", "inf"], "--label-smoothing", "[0, 1)"),
    (["train", "--dataset", "toy", "--out", "x", "--weight-decay", "-0.1"], "--weight-decay", ">= 0"),
    (["train", "--dataset", "toy", "--out", "x", "--epochs", "0.5"], "--epochs", "positive integer"),
    (["train", "--dataset", "toy", "--out", "x", "--warmup", "-1"], "--warmup-steps", "non-negative"),
    (["translate", "--checkpoint", "x", "--beam", "0", "a"], "--beam", "expected a positive integer, got '0'"),
    (["translate", "--checkpoint", "x", "--sample", "--temperature", "0", "a"], "--temperature", "finite positive number"),
    (["translate", "--checkpoint", "x", "--batch-size", "0", "a"], "--batch-size", "positive"),
    (["eval", "--checkpoint", "x", "--src", "a", "--ref", "b", "--beam", "0"], "--beam", "positive integer"),
    (["eval", "--checkpoint", "x", "--beam", "2", "--length-penalty", "-1"], "--length-penalty", ">= 0"),
    (["gradcheck", "--max-entries", "-1"], "--max-entries", "non-negative"),
    (["--blas-threads", "0", "gradcheck"], "--blas-threads", "positive integer"),
])
def test_bad_numbers_are_refused_naming_the_option(capsys, argv, option, expected):
    usage_error(capsys, argv, option, expected)


# every option that names a file or folder refuses an empty path (an unset shell variable)
EMPTY_PATHS = [("sample", "--checkpoint"), ("sample", "--hf"), ("sample", "--adapter"),
               ("translate", "--checkpoint"), ("translate", "--input"),
               ("eval", "--checkpoint"), ("eval", "--data-dir"), ("eval", "--src"),
               ("eval", "--ref"), ("eval", "--out"), ("eval", "--metrics-json"),
               ("lm", "--data"), ("lm", "--out"), ("lm", "--resume"), ("lm", "--init-from"),
               ("train", "--src-file"), ("train", "--tgt-file"), ("train", "--valid-src"),
               ("train", "--valid-tgt"), ("train", "--out"), ("train", "--data-dir"),
               ("train", "--resume"), ("toy", "--out"), ("toy", "--metrics-json"),
               ("export", "--checkpoint"), ("export", "--out"), ("average", "--out"),
               ("average", "--run"), ("calibrate", "--out"), ("download", "--dest"),
               ("plot", "--metrics"), ("plot", "--curve"), ("plot", "--grad-norms"),
               ("plot", "--checkpoint"), ("plot", "--out")]


@pytest.mark.parametrize("command,option", EMPTY_PATHS)
def test_an_empty_path_is_refused_naming_its_option(capsys, command, option):
    usage_error(capsys, [command, option, ""], f"argument {option}: expected a path, got an "
                                               f"empty one ('')")


def test_an_empty_checkpoint_to_average_is_refused(capsys, tmp_path):
    usage_error(capsys, ["average", "--out", str(tmp_path / "avg"), str(tmp_path / "a"), ""],
                "argument CKPT: expected a path, got an empty one ('')")


def test_clip_norm_zero_means_no_clipping(monkeypatch):
    seen = {}
    monkeypatch.setattr(toy, "run", lambda args: seen.update(toy.train_kwargs(args)) or 0)
    assert main(["toy", "--clip-norm", "0"]) == 0
    assert seen["clip_norm"] is None


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_min_lr_above_lr_names_both(capsys, monkeypatch, schedule):
    monkeypatch.setattr(toy, "run", lambda args: toy.train_kwargs(args) and 0)
    assert main(["toy", "--lr", "0.001", "--min-lr", "0.01", "--schedule", schedule]) == 1
    one_line_error(capsys, "--min-lr 0.01", "--lr 0.001", f"the {schedule} schedule")


def test_min_lr_above_lr_is_allowed_where_the_schedule_does_not_fall_to_it(monkeypatch):
    monkeypatch.setattr(toy, "run", lambda args: toy.train_kwargs(args) and 0)
    assert main(["toy", "--lr", "0.001", "--min-lr", "0.01", "--schedule", "inverse_sqrt"]) == 0


# --- too big for memory: a message before training, not "Unable to allocate" in a traceback --

@pytest.mark.parametrize("option,value", [("--max-len", "1000000000"), ("--d-model", "1000000"),
                                          ("--layers", "1000000000")])
def test_a_model_too_big_for_memory_is_refused_before_training(capsys, tmp_path, monkeypatch,
                                                               option, value):
    # pinned, so that on a host with hundreds of GiB these are still refused, not allocated
    monkeypatch.setattr(cli_common, "physical_memory", lambda: 8 << 30)
    assert main(["toy", "--quiet", "--out", str(tmp_path / "run"), option, value]) == 1
    one_line_error(capsys, f"{option} {value}", "GiB of memory", "choose smaller values")
    assert not (tmp_path / "run").exists()


def test_memory_error_is_one_line_with_the_size_and_a_hint(capsys, monkeypatch):
    monkeypatch.setattr(toy, "run", lambda args: np.empty((10**8, 10**8)))   # 73 PiB: refused
    assert main(["toy"]) == 1
    one_line_error(capsys, "npformer toy: error: out of memory: Unable to allocate", "--max-len")


# --- bugs: one line and a saved traceback; --debug shows it -----------------------------------

def _bug(args):
    raise KeyError("boom")


def test_an_internal_error_is_one_line_and_a_traceback_file(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(toy, "run", _bug)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("NPFORMER_DEBUG", raising=False)
    assert main(["toy"]) == cli_main.EXIT_INTERNAL
    line = one_line_error(capsys, "npformer toy: internal error: KeyError: 'boom' (traceback in ")
    [crash] = tmp_path.glob("npformer-crash-*.txt")
    assert str(crash) in line
    text = crash.read_text()
    assert "Traceback" in text and "_bug" in text and "KeyError: 'boom'" in text


def test_debug_lets_the_exception_through(monkeypatch):
    monkeypatch.setattr(toy, "run", _bug)
    with pytest.raises(KeyError):
        main(["--debug", "toy"])
    monkeypatch.setenv("NPFORMER_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["toy"])


def test_interrupt_exits_130(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(toy, "run", interrupted)
    assert main(["toy"]) == 130
    one_line_error(capsys, "interrupted")


def test_os_errors_name_their_file(capsys, monkeypatch):
    def fails(args):
        err = OSError(errno.EIO, "Input/output error")
        err.filename = "/some/where.npz"         # set afterwards: str(err) does not show it
        raise err
    monkeypatch.setattr(toy, "run", fails)
    assert main(["toy"]) == 1
    one_line_error(capsys, "Input/output error", "/some/where.npz")


# --- decoding options that would be ignored -----------------------------------------------------

@pytest.mark.parametrize("extra,option", [(["--top-k", "2"], "--top-k"),
                                          (["--temperature", "0.5"], "--temperature"),
                                          (["--seed", "3"], "--seed"),
                                          (["--length-penalty", "1.0"], "--length-penalty")])
def test_translate_refuses_options_of_another_method(run_dir, capsys, extra, option):
    out, data = run_dir
    assert main(["translate", "--checkpoint", str(out), *extra, data.train[0][0]]) == 1
    one_line_error(capsys, option, "only used with")


def test_translate_with_their_method_accepts_them(run_dir, capsys):
    out, data = run_dir
    zh = data.train[0][0]
    assert main(["translate", "--checkpoint", str(out), "--sample", "--top-k", "2",
                 "--temperature", "0.5", "--seed", "3", zh]) == 0
    assert main(["translate", "--checkpoint", str(out), "--beam", "2", "--length-penalty", "1", zh]) == 0


def test_eval_refuses_length_penalty_without_beam(run_dir, pair, capsys):
    out, _ = run_dir
    src, ref = pair
    assert main(["eval", "--checkpoint", str(out), "--src", str(src), "--ref", str(ref),
                 "--length-penalty", "1"]) == 1
    one_line_error(capsys, "--length-penalty", "--beam")


# --- outputs never name inputs, and are checked before decoding --------------------------------

@pytest.fixture
def no_decoding(monkeypatch):
    """eval must fail before it loads the checkpoint (and so before decoding)."""
    def load(args):
        raise AssertionError("eval loaded the checkpoint before checking its outputs")
    monkeypatch.setattr(evaluate, "load_translation_model", load)


@pytest.mark.parametrize("option,target", [("--out", "src"), ("--out", "ref"),
                                           ("--metrics-json", "ref"), ("--out", "npz"),
                                           ("--metrics-json", "json")])
def test_eval_outputs_must_not_name_inputs(run_dir, pair, capsys, no_decoding, option, target):
    out, _ = run_dir
    src, ref = pair
    path = {"src": src, "ref": ref, "npz": out / "best.npz", "json": out / "best.json"}[target]
    before = path.read_bytes()
    assert main(["eval", "--checkpoint", str(out), "--src", str(src), "--ref", str(ref),
                 option, str(path)]) == 1
    one_line_error(capsys, f"{option} {path}", "names the input")
    assert path.read_bytes() == before


@pytest.mark.parametrize("option,name", [("--metrics-json", "metrics.jsonl"), ("--out", "last.npz"),
                                         ("--out", "last.json"), ("--metrics-json", "step_4.json")])
def test_eval_outputs_never_replace_a_runs_files(run_dir, pair, capsys, no_decoding, option, name):
    """The review's case: evaluating run/best with --metrics-json run/metrics.jsonl replaced the
    run's training log, and --out run/last.npz its newest checkpoint."""
    out, _ = run_dir
    src, ref = pair
    path = out / name
    before = path.read_bytes() if path.exists() else None
    assert main(["eval", "--checkpoint", str(out), "--src", str(src), "--ref", str(ref),
                 option, str(path)]) == 1
    one_line_error(capsys, f"{option} {path}", "named like a run's own file")
    assert (path.read_bytes() if path.exists() else None) == before


def test_eval_out_and_metrics_json_must_differ(run_dir, pair, capsys, no_decoding, tmp_path):
    out, _ = run_dir
    src, ref = pair
    same = str(tmp_path / "same.txt")
    assert main(["eval", "--checkpoint", str(out), "--src", str(src), "--ref", str(ref),
                 "--out", same, "--metrics-json", same]) == 1
    one_line_error(capsys, "--metrics-json", "--out")


def test_eval_unwritable_output_fails_before_decoding(run_dir, pair, capsys, no_decoding, tmp_path):
    out, _ = run_dir
    src, ref = pair
    (tmp_path / "file").write_text("x")
    assert main(["eval", "--checkpoint", str(out), "--src", str(src), "--ref", str(ref),
                 "--metrics-json", str(tmp_path / "file" / "m.json")]) == 1
    one_line_error(capsys, "--metrics-json", "is a file, not a folder")


def test_eval_full_disk_names_the_output_and_keeps_the_old_one(run_dir, pair, capsys, tmp_path,
                                                               monkeypatch):
    out, _ = run_dir
    src, ref = pair
    hyps = tmp_path / "hyps.txt"
    hyps.write_text("old\n")
    monkeypatch.setattr(textfile.os, "fsync", lambda fd: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    assert main(["eval", "--checkpoint", str(out), "--src", str(src), "--ref", str(ref),
                 "--out", str(hyps)]) == 1
    one_line_error(capsys, f"no space left on device writing {hyps}", "nothing saved before was lost")
    assert hyps.read_text() == "old\n"


def test_plot_out_that_is_a_file_is_refused(run_dir, capsys, tmp_path):
    out, _ = run_dir
    (tmp_path / "plots").write_text("x")
    assert main(["plot", "--metrics", str(out / "missing.jsonl"), "--out",
                 str(tmp_path / "plots")]) == 1
    one_line_error(capsys, "--out", "is a file, expected a folder")


def test_plot_must_not_overwrite_its_metrics(capsys, tmp_path):
    (tmp_path / "loss.png").write_text('{"event": "train", "step": 1, "loss": 1.0}\n')
    assert main(["plot", "--metrics", str(tmp_path / "loss.png"), "--out", str(tmp_path)]) == 1
    one_line_error(capsys, "--out", "names the input --metrics")


# --- input text: stdin strict UTF-8 like --input, byte-order marks dropped ----------------------

def _stdin(monkeypatch, data):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8",
                                                       errors="surrogateescape"))


def test_stdin_that_is_not_utf8_is_refused_like_input(run_dir, capsys, monkeypatch, tmp_path):
    out, data = run_dir
    raw = data.train[0][0].encode("utf-8") + b"\n\xff\xfe\n"
    _stdin(monkeypatch, raw)
    assert main(["translate", "--checkpoint", str(out)]) == 1
    offset = len(data.train[0][0].encode("utf-8")) + 1
    one_line_error(capsys, "<stdin>, line 2: not valid UTF-8", f"at offset {offset}")
    (tmp_path / "in.txt").write_bytes(raw)
    assert main(["translate", "--checkpoint", str(out), "--input", str(tmp_path / "in.txt")]) == 1
    one_line_error(capsys, "in.txt, line 2: not valid UTF-8", f"at offset {offset}")


def test_a_byte_order_mark_does_not_stick_to_the_first_word(run_dir, capsys, monkeypatch, tmp_path):
    out, data = run_dir
    text = "".join(zh + "\n" for zh, _ in data.train[:2])
    assert main(["translate", "--checkpoint", str(out), *text.splitlines()]) == 0
    expected = capsys.readouterr().out
    _stdin(monkeypatch, b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert main(["translate", "--checkpoint", str(out)]) == 0
    got = capsys.readouterr()
    assert got.out == expected and "unknown" not in got.err
    (tmp_path / "in.txt").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert main(["translate", "--checkpoint", str(out), "--input", str(tmp_path / "in.txt")]) == 0
    got = capsys.readouterr()
    assert got.out == expected and "unknown" not in got.err


def test_a_data_dir_that_is_a_file(run_dir, capsys, tmp_path):
    out, _ = run_dir
    (tmp_path / "data").write_text("x")
    assert main(["eval", "--checkpoint", str(out), "--dataset", "multi30k",
                 "--data-dir", str(tmp_path / "data")]) == 1
    one_line_error(capsys, f"--data-dir {tmp_path / 'data'}", "is a file, expected a folder")


def test_download_dest_that_is_a_file(capsys, tmp_path):
    (tmp_path / "dest").write_text("x")
    assert main(["download", "multi30k", "--quiet", "--dest", str(tmp_path / "dest")]) == 1
    one_line_error(capsys, str(tmp_path / "dest"), "is a file, expected a folder")


def test_a_failed_checkpoint_write_names_the_checkpoint(tmp_path, monkeypatch):
    """A full disk during a save: the error names the checkpoint (write() itself names no file),
    and the checkpoint saved before is still there, whole."""
    from npformer.checkpoint import load_checkpoint, save_checkpoint
    save_checkpoint(tmp_path / "ckpt", {"w": np.arange(3.0)}, {"n": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr("os.fsync", full)
    with pytest.raises(OSError) as err:
        save_checkpoint(tmp_path / "ckpt", {"w": np.arange(4.0)}, {"n": 2})
    assert err.value.errno == errno.ENOSPC and str(tmp_path / "ckpt.npz") in str(err.value)
    monkeypatch.undo()
    arrays, meta = load_checkpoint(tmp_path / "ckpt")
    assert meta == {"n": 1} and list(arrays["w"]) == [0.0, 1.0, 2.0]


def test_a_failed_metrics_write_names_the_log(tmp_path):
    from npformer.training.metrics_log import MetricsLog

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log._f.close()
    log._f = Full()
    with pytest.raises(OSError, match="metrics.jsonl"):
        log.log("train", step=1)
