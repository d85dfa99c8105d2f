"""Standard output that cannot be written (closed with ``>&-``, a full device, a descriptor open
for reading only) ends any command in one line on stderr that says "standard output" and why,
with exit 1, never a traceback, exit 70 or exit 0 with the output lost. An error never lands on
the line of output that was being written (a sampled prompt), and a bad ``NPFORMER_BACKEND`` is
refused before any output. The commands run in a child process, as a user runs them."""
import errno
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from npformer.cli import info
from npformer.cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    env.pop("NPFORMER_DEBUG", None)
    return env


def npformer(argv, stdout=subprocess.PIPE, shell_redirect="", env=None, stderr=subprocess.PIPE):
    """Run ``python -m npformer argv`` through ``sh``, with ``shell_redirect`` (e.g. ``>&-``)
    applied to it; the finished process."""
    command = f'exec "$@" {shell_redirect}'
    return subprocess.run(["sh", "-c", command, "sh", sys.executable, "-m", "npformer", *argv],
                          stdout=stdout, stderr=stderr, cwd=ROOT, env=env or _env(), timeout=300)


def one_line(text, *names):
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text and "Exception ignored" not in text, text
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory):
    """A tiny character-level GPT checkpoint, as npformer lm saves one (untrained)."""
    import npformer as nf
    from npformer.data.vocab import Vocabularies
    from npformer.training.checkpointing import save_model_checkpoint
    from npformer.training.language_model import CharTokenizer
    tokenizer = CharTokenizer.from_text("ab")
    path = tmp_path_factory.mktemp("lm") / "best"
    model = nf.GPT(len(tokenizer), d_model=8, n_heads=2, d_ff=8, n_layers=1, max_len=8)
    save_model_checkpoint(path, model, Vocabularies.joint(tokenizer.vocab))
    return path


def sample_argv(checkpoint):
    return ["sample", "--checkpoint", str(checkpoint), "--prompt", "a", "--max-new-tokens", "3",
            "--seed", "0"]


def commands(run_dir, lm_checkpoint):
    out, data = run_dir
    return {"sample": sample_argv(lm_checkpoint),
            "translate": ["translate", "--checkpoint", str(out / "best"), data.train[0][0]],
            "info": ["info"]}


@pytest.mark.parametrize("command", ["sample", "translate", "info"])
def test_closed_standard_output_is_one_line_naming_it(run_dir, lm_checkpoint, command):
    done = npformer(commands(run_dir, lm_checkpoint)[command], stdout=None, shell_redirect=">&-")
    assert done.returncode == 1, done.stderr.decode()
    one_line(done.stderr.decode(), f"npformer {command}: error: cannot write to standard output",
             "closed")


@pytest.mark.parametrize("command", ["sample", "info"])
def test_a_full_standard_output_says_standard_output_and_why(run_dir, lm_checkpoint, command):
    with open("/dev/full", "wb") as full:
        done = npformer(commands(run_dir, lm_checkpoint)[command], stdout=full)
    assert done.returncode == 1, done.stderr.decode()
    one_line(done.stderr.decode(), "cannot write to standard output: No space left on device")


def test_a_standard_output_open_for_reading_only_says_so(tmp_path):
    path = tmp_path / "read-only"
    path.write_bytes(b"")
    with open(path, "rb") as reading:
        done = npformer(["info"], stdout=reading)
    assert done.returncode == 1, done.stderr.decode()
    one_line(done.stderr.decode(), "cannot write to standard output: Bad file descriptor")
    assert path.read_bytes() == b""


def test_a_bad_backend_is_refused_before_any_output(lm_checkpoint):
    """The prompt "a" is one token: before, the model first ran (and looked the backend up) after
    the prompt was printed, and the message continued the prompt's line."""
    done = npformer(sample_argv(lm_checkpoint), env=_env(NPFORMER_BACKEND="bogus"),
                    stderr=subprocess.STDOUT)              # one terminal: both streams, in order
    assert done.returncode == 1
    text = done.stdout.decode()
    assert text.endswith("\n")
    assert one_line(text, "NPFORMER_BACKEND", "'bogus'", "numba", "numpy").startswith(
        "npformer sample: error: ")


FAILS_MID_LINE = textwrap.dedent("""
    import sys
    from npformer.cli import info, main

    def run(args):
        sys.stdout.write("a partial line")
        sys.stdout.flush()
        raise ValueError("it failed")

    info.run = run
    sys.exit(main.main(["info"]))
""")


def test_an_error_after_a_partial_line_starts_a_line_of_its_own():
    done = subprocess.run([sys.executable, "-c", FAILS_MID_LINE], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, cwd=ROOT, env=_env(), timeout=300)
    assert done.returncode == 1
    assert done.stdout.decode() == "a partial line\nnpformer info: error: it failed\n"


def test_a_partial_line_is_not_ended_where_errors_go_elsewhere():
    """Standard output alone (a file, a pipe to another program) gets no newline of npformer's."""
    done = subprocess.run([sys.executable, "-c", FAILS_MID_LINE], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, cwd=ROOT, env=_env(), timeout=300)
    assert done.returncode == 1
    assert done.stdout.decode() == "a partial line"
    one_line(done.stderr.decode(), "npformer info: error: it failed")


class FullDisk(io.RawIOBase):
    """A file on a full disk: every write fails with ENOSPC until ``freed``."""

    full = True

    def writable(self):
        return True

    def write(self, data):
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)


def test_output_still_buffered_when_the_command_ends_is_written_before_the_exit_code(
        monkeypatch, capsys):
    """A regular file buffers a short output: its write fails only when it is flushed, which
    Python does at exit ("Exception ignored", exit 120) unless the command line does it first."""
    disk = FullDisk()
    buffered = io.TextIOWrapper(io.BufferedWriter(disk), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", buffered)
    monkeypatch.setattr(info, "run", lambda args: print("a short output") or 0)
    try:
        assert main(["info"]) == 1
    finally:
        disk.full = False
        buffered.flush()
    one_line(capsys.readouterr().err,
             "npformer info: error: cannot write to standard output: No space left on device")


@pytest.mark.parametrize("redirect,reason", [(">/dev/full", "No space left on device"),
                                             (">&-", "closed")])
def test_help_that_standard_output_cannot_take_is_not_lost_silently(redirect, reason):
    done = npformer(["sample", "--help"], stdout=None, shell_redirect=redirect)
    assert done.returncode == 1
    one_line(done.stderr.decode(), "npformer sample: error: cannot write to standard output",
             reason)
