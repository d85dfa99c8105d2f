"""The ``npformer`` command line: every sub-command's --help, translate/eval/plot/gradcheck on a
tiny checkpoint, and bad input giving a message on stderr and a non-zero exit."""
import json
import os
import subprocess
import sys

import pytest

import npformer as nf
from npformer.cli.main import COMMANDS, build_parser, main
from npformer.training.checkpointing import save_model_checkpoint
from npformer.training.toy import toy_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))




def test_every_command_has_help(capsys):
    for name in COMMANDS:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0
        assert "usage: npformer " + name in capsys.readouterr().out


def test_every_commands_description_is_whole_sentences_without_markup():
    """Each command's --help describes it in whole sentences (a capital first, a full stop
    last), never a docstring's "``npformer NAME``:" or its backquotes (calibrate's once showed
    its docstring's first line, cut mid-sentence)."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        about = parser.description
        assert about[0].isupper() and about.rstrip(")").endswith("."), (name, about)
        assert "``" not in about and not about.startswith("npformer"), (name, about)


def test_python_dash_m_npformer():
    r = subprocess.run([sys.executable, "-m", "npformer", "--help"], capture_output=True,
                       text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0 and "translate" in r.stdout


def test_translate_arguments_and_stdin(run_dir, capsys, monkeypatch):
    out, data = run_dir
    src = [zh for zh, _ in data.train[:3]]
    assert main(["translate", "--checkpoint", str(out), *src]) == 0
    by_args = capsys.readouterr().out.splitlines()
    assert len(by_args) == 3
    import io
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join([src[0], "", src[2]]) + "\n"))
    assert main(["translate", "--checkpoint", str(out / "best")]) == 0
    by_stdin = capsys.readouterr().out.splitlines()
    assert by_stdin == [by_args[0], "", by_args[2]]               # empty line -> empty line


def test_translate_unknown_words_warn_on_stderr(run_dir, capsys):
    out, data = run_dir
    assert main(["translate", "--checkpoint", str(out), "我 喜欢 恐龙"]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "'恐龙'" in err


def test_translate_too_long_fails_or_truncates(run_dir, capsys):
    out, _ = run_dir
    long = " ".join(["我"] * 13)                                    # max_len is 12
    assert main(["translate", "--checkpoint", str(out), long]) == 1
    err = capsys.readouterr().err
    assert "npformer translate: error" in err and "max_len=12" in err and "--truncate" in err
    assert main(["translate", "--checkpoint", str(out), "--truncate", long]) == 0
    assert "cut to max_len=12" in capsys.readouterr().err


def test_translate_trace_beam_and_sample(run_dir, capsys):
    out, data = run_dir
    zh = data.train[0][0]
    assert main(["translate", "--checkpoint", str(out), "--trace", zh]) == 0
    trace = capsys.readouterr().out
    assert trace.startswith(f"source: {zh}") and "p=" in trace
    assert main(["translate", "--checkpoint", str(out), "--beam", "3", zh]) == 0
    assert main(["translate", "--checkpoint", str(out), "--sample", "--top-k", "2", "--seed", "1", zh]) == 0
    assert main(["translate", "--checkpoint", str(out), "--beam", "2", "--sample", zh]) == 1
    assert "choose one" in capsys.readouterr().err


def test_missing_truncated_and_mismatched_checkpoints(run_dir, tmp_path, capsys):
    out, data = run_dir
    assert main(["translate", "--checkpoint", str(tmp_path / "nothing"), "我"]) == 1
    assert "nothing.npz" in capsys.readouterr().err
    raw = (out / "best.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) - 200])
    assert main(["translate", "--checkpoint", str(tmp_path / "cut"), "我"]) == 1
    assert "cut.npz" in capsys.readouterr().err
    # weights of another shape than the config says
    model = nf.Transformer(len(data.vocabs.src), len(data.vocabs.tgt), d_model=16, n_heads=2,
                           d_ff=32, n_encoder_layers=1, n_decoder_layers=1, max_len=12)
    model.config = model.config.replace(d_ff=48)             # a config the weights do not fit
    save_model_checkpoint(tmp_path / "bad", model, data.vocabs)
    assert main(["translate", "--checkpoint", str(tmp_path / "bad"), "我"]) == 1
    err = capsys.readouterr().err
    assert "bad" in err and "do not match its config" in err


def test_eval_on_a_file_pair(run_dir, tmp_path, capsys):
    out, data = run_dir
    (tmp_path / "src.txt").write_text("\n".join(zh for zh, _ in data.train[:8]) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(en for _, en in data.train[:8]) + "\n", encoding="utf-8")
    assert main(["eval", "--checkpoint", str(out), "--src", str(tmp_path / "src.txt"),
                 "--ref", str(tmp_path / "ref.txt"), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["sentences"] == 8 and 0 <= figures["exact_match"] <= 1 and 0 <= figures["bleu"] <= 100
    (tmp_path / "ref.txt").write_text("one line\n", encoding="utf-8")
    assert main(["eval", "--checkpoint", str(out), "--src", str(tmp_path / "src.txt"),
                 "--ref", str(tmp_path / "ref.txt")]) == 1
    assert "has 8 lines" in capsys.readouterr().err


def test_train_on_files_and_resume(tmp_path, capsys):
    data = toy_data(seed=3, n_train=40, n_heldout=2, n_valid=4)
    (tmp_path / "s.txt").write_text("\n".join(zh for zh, _ in data.train) + "\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("\n".join(en for _, en in data.train) + "\n", encoding="utf-8")
    common = ["train", "--src-file", str(tmp_path / "s.txt"), "--tgt-file", str(tmp_path / "t.txt"),
              "--d-model", "16", "--n-heads", "2", "--d-ff", "16", "--layers", "1",
              "--batch-size", "16", "--quiet", "--out", str(tmp_path / "run")]
    assert main(common + ["--max-steps", "2"]) == 0
    assert (tmp_path / "run" / "last.npz").exists()
    assert main(common + ["--max-steps", "4", "--resume", str(tmp_path / "run" / "last")]) == 0
    assert "done: 4 steps" in capsys.readouterr().out
    assert main(common[:5] + ["--dataset", "multi30k", "--out", str(tmp_path / "x")]) == 1
    assert "multi30k" in capsys.readouterr().err
    (tmp_path / "t.txt").write_text("only one\n", encoding="utf-8")
    assert main(common) == 1
    assert "t.txt has 1" in capsys.readouterr().err


def test_gradcheck_table(capsys):
    assert main(["gradcheck", "--only", "linear", "softmax"]) == 0
    table = capsys.readouterr().out
    assert "Linear module" in table and "masked softmax" in table and "FAIL" not in table
    assert main(["gradcheck", "--only", "nosuchlayer"]) == 1


def test_plot_losses_and_attention(run_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out, data = run_dir
    assert main(["plot", "--metrics", str(out / "metrics.jsonl"), "--checkpoint", str(out),
                 "--sentence", data.train[0][0], "--out", str(tmp_path / "plots")]) == 0
    written = capsys.readouterr().out.split()
    assert str(tmp_path / "plots" / "loss.png") in written
    assert any("decoder_0_cross_attn" in p for p in written)
    for p in written:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


CURVE = [{"run": "tiny-en-de", "src": "en", "tgt": "de", "split": split, "minutes": m,
          "bleu": b, "bleu_cased": b - 2, "bleu_papers": b + 1, "step": int(m * 80)}
         for split in ("val", "test_2016_flickr") for m, b in ((10.0, 20.5), (30.0, 33.0))]


def test_plot_draws_bleu_against_minutes_from_curve_points(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    curve = tmp_path / "curve.jsonl"
    curve.write_text("".join(json.dumps(p) + "\n" for p in CURVE))
    assert main(["plot", "--curve", str(curve), "--out", str(tmp_path / "plots")]) == 0
    written = capsys.readouterr().out.split()
    assert written == [str(tmp_path / "plots" / "bleu_curve.png")]
    assert open(written[0], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("text, message", [
    ('{"run": "r", "split": "val", "minutes": 1.0}\n', ":1: expected an object with the keys "
                                                       "run, split, minutes, bleu"),
    ('{"run": "r", "split": "val", "minutes": "10", "bleu": 1.0}\n',
     "point 1: minutes expected a number, got '10'"),
    ("not json\n", ":1: expected one JSON object per line"), ("", "no points")])
def test_plot_refuses_a_bad_curve_file_naming_it(tmp_path, capsys, text, message):
    curve = tmp_path / "curve.jsonl"
    curve.write_text(text)
    assert main(["plot", "--curve", str(curve), "--out", str(tmp_path / "plots")]) == 1
    err = capsys.readouterr().err
    assert f"--curve {curve}" in err and message in err


def test_plot_without_matplotlib_is_a_clear_error(run_dir, monkeypatch, capsys):
    out, _ = run_dir
    monkeypatch.setitem(sys.modules, "matplotlib", None)            # import now fails
    assert main(["plot", "--metrics", str(out / "metrics.jsonl")]) == 1
    assert "matplotlib is not installed" in capsys.readouterr().err


def test_download_reports_the_failing_url(tmp_path, capsys):
    import socket
    with socket.socket() as s:                                      # a closed local port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["download", "multi30k", "--dest", str(tmp_path), "--quiet",
                 "--base-url", f"http://127.0.0.1:{port}/"]) == 1
    assert f"127.0.0.1:{port}" in capsys.readouterr().err


def test_blas_threads_option(capsys):
    with pytest.raises(SystemExit) as e:                            # refused as it is parsed
        main(["--blas-threads", "0", "gradcheck", "--only", "relu"])
    assert e.value.code == 2
    assert "--blas-threads: expected a positive integer" in capsys.readouterr().err
    assert main(["--blas-threads", "1", "gradcheck", "--only", "relu"]) == 0


def test_help_never_shows_default_none_and_toy_has_no_resume(capsys):
    """train's recipe-dependent options read "default from the dataset's recipe", not "None";
    toy (a demo that always starts afresh) offers no --resume it would refuse."""
    for name in COMMANDS:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert "default None" not in capsys.readouterr().out, name
    with pytest.raises(SystemExit):
        main(["toy", "--help"])
    assert "--resume" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "options left out keep the checkpoint's values" in " ".join(capsys.readouterr().out.split())
