"""``npformer translate`` reads its input a window at a time (issue 66, defect 6): the first
translations come before standard input has ended, and memory holds one window, however long
the input. An input that fits one window is translated as before, bit for bit."""
import gzip
import os
import random
import select
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from npformer.cli.main import main
from npformer.data.textfile import iter_lines, read_lines
from npformer.decoding.translator import MAX_ROWS, Translator
from npformer.training.checkpointing import load_model_checkpoint

ROOT = Path(__file__).resolve().parent.parent


def _translator(run_dir, **kwargs):
    out, _ = run_dir
    loaded = load_model_checkpoint(out / "best")
    return Translator(loaded.model, loaded.vocabs, **kwargs)


def _env():
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    return env


def test_translate_prints_a_window_before_standard_input_ends(run_dir, capsys):
    out, data = run_dir
    lines = [zh for zh, _ in data.train[:3]]
    assert main(["translate", "--checkpoint", str(out / "best"), *lines]) == 0
    want = capsys.readouterr().out.splitlines()
    job = subprocess.Popen([sys.executable, "-m", "npformer", "translate", "--checkpoint",
                            str(out / "best"), "--batch-size", "2"], cwd=ROOT, env=_env(),
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        job.stdin.write(("\n".join(lines[:2]) + "\n").encode())
        job.stdin.flush()                        # a window of 2 lines; standard input stays open
        ready, _, _ = select.select([job.stdout], [], [], 60)
        assert ready, "no translation within 60 s while standard input was open"
        first = [job.stdout.readline().decode().rstrip("\n") for _ in range(2)]
        assert job.poll() is None                # still waiting for more input
        job.stdin.write((lines[2] + "\n").encode())
        job.stdin.close()
        rest = job.stdout.read().decode().splitlines()
        assert job.wait(timeout=60) == 0, job.stderr.read().decode()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert first + rest == want


class EndlessInput:
    """Standard input's ``buffer`` with as many lines as are asked for (every third one empty)
    until ``stop()``: an input far larger than memory, which a reader must not read whole."""

    def __init__(self, lines):
        self.lines, self.read_count, self.stopped = lines, 0, False

    def readline(self, size=-1):
        if self.stopped:
            return b""
        line = "" if self.read_count % 3 == 2 else self.lines[self.read_count % len(self.lines)]
        self.read_count += 1
        return (line + "\n").encode()

    def read(self, size=-1):
        raise AssertionError("standard input was read whole")

    def stop(self):
        self.stopped = True


class WindowsSeen:
    """Standard output that records how many input lines had been read at each write, and ends
    the input after ``windows`` writes."""

    def __init__(self, stdin, windows):
        self.stdin, self.windows, self.writes = stdin, windows, []

    def write(self, text):
        self.writes.append((self.stdin.read_count, text.count("\n")))
        if len(self.writes) == self.windows:
            self.stdin.stop()

    def flush(self):
        pass


@pytest.mark.parametrize("batch_size", [3, None])
def test_translate_reads_one_window_ahead_of_what_it_printed(run_dir, monkeypatch, batch_size):
    """With --batch-size N a window is N lines, read only once the last window is printed; by
    default one token batch (at most MAX_ROWS lines, empty ones counted)."""
    out, data = run_dir
    stdin = EndlessInput([zh for zh, _ in data.train])
    stdout = WindowsSeen(stdin, windows=3 if batch_size else 1)
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=stdin))
    monkeypatch.setattr(sys, "stdout", stdout)
    extra = ["--batch-size", str(batch_size)] if batch_size else []
    assert main(["translate", "--checkpoint", str(out / "best"), *extra]) == 0
    window = batch_size or MAX_ROWS
    printed = 0
    for read, count in stdout.writes[:-1]:       # (the last: what was read before the end)
        printed += count
        assert 0 < count <= window and read <= printed + (1 if batch_size is None else 0)
    if batch_size:
        assert [count for _, count in stdout.writes] == [3, 3, 3, 0][:len(stdout.writes)]
        assert stdout.writes[0][0] == 3          # the 4th line was not read before printing


def test_one_window_is_translated_as_a_list_is_and_windows_as_their_lists(run_dir):
    _, data = run_dir
    lines = [zh for zh, _ in data.train[:20]] + ["", "  "]
    for method, options in (("greedy", {}), ("beam", {"beam_size": 3}),
                            ("sample", {"top_k": 5})):
        whole = _translator(run_dir).translate(lines, method, rng=np.random.default_rng(1),
                                               **options)
        windows = list(_translator(run_dir).translate_windows(
            iter(lines), method, rng=np.random.default_rng(1), **options))
        assert len(windows) == 1
        assert [(t.text, t.probs) for t in windows[0]] == [(t.text, t.probs) for t in whole]
    small = _translator(run_dir, batch_size=7)
    windows = list(small.translate_windows(lines))
    assert [len(w) for w in windows] == [7, 7, 7, 1]
    assert [t.text for w in windows for t in w] == \
        [t.text for i in range(0, len(lines), 7) for t in small.translate(lines[i:i + 7])]


def test_a_line_too_long_names_its_place_in_the_whole_input(run_dir):
    _, data = run_dir
    lines = [data.train[0][0]] * 5 + [" ".join(["x"] * 50)]
    with pytest.raises(ValueError, match=r"sentences\[5\]: 50 tokens exceed"):
        list(_translator(run_dir, batch_size=2).translate_windows(lines))


def test_lines_read_one_at_a_time_are_the_lines_read_whole(tmp_path):
    """Line ends \\n, \\r\\n and \\r, byte-order marks, bad UTF-8 (the same line and offset in
    the error), gzip: ``iter_lines`` gives what ``read_lines`` gives."""
    rng = random.Random(0)
    pieces = ["a", "é", "\r", "\n", "\r\n", " ", "\ufeff", "x"]
    for trial in range(300):
        data = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))).encode()
        if rng.random() < 0.25:
            cut = rng.randint(0, len(data))
            data = data[:cut] + b"\xff" + data[cut:]
        path = tmp_path / f"{trial}.txt{'.gz' if trial % 5 == 0 else ''}"
        path.write_bytes(gzip.compress(data) if trial % 5 == 0 else data)
        results = []
        for read in (read_lines, lambda p: list(iter_lines(p))):
            try:
                results.append(read(path))
            except ValueError as e:
                results.append(str(e))
        assert results[0] == results[1], data


def test_help_says_that_sampled_output_depends_on_the_window(capsys):
    with pytest.raises(SystemExit):
        main(["translate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a window at a time" in text
    assert "Sampled output (--sample) depends on the windows" in text


def test_a_reader_that_leaves_ends_translate_quietly(run_dir, tmp_path):
    """``npformer translate < big | head -1``: once the reader has gone, the next write breaks
    the pipe; translate stops at once, with no message, and exits 141 as a tool killed by
    SIGPIPE would (it used to print '[Errno 32] Broken pipe' and exit 1)."""
    out, data = run_dir
    src = tmp_path / "many.txt"
    src.write_text((data.train[0][0] + "\n") * 400, encoding="utf-8")
    with open(src, "rb") as stdin:
        job = subprocess.Popen([sys.executable, "-m", "npformer", "translate", "--checkpoint",
                                str(out / "best"), "--batch-size", "4"], cwd=ROOT, env=_env(),
                               stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert job.stdout.readline()          # one line, then the reader goes away
            job.stdout.close()
            assert job.wait(timeout=120) == 141
            assert job.stderr.read().decode() == ""
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
