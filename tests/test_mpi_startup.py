"""Every npformer process of an MPI job takes part in the start-up agreement (issue 66, defect 2):
a rank started with another command or another command line ends the whole job at once, on
every rank with the same message, instead of leaving the others waiting forever. The MPI tests
launch ``mpiexec`` with a timeout and skip where it or mpi4py is absent (tests/test_mpi.py)."""
import time

import pytest
from test_mpi import NPFORMER, TOY, mpirun, needs_mpi

from npformer.cli.main import build_parser
from npformer.cli.parallel import describe_difference


def test_command_lines_are_compared_by_what_they_ask_for():
    parser = build_parser()
    train = ["train", "--dataset", "toy", "--out", "runs/a", "--lr", "0.002"]
    assert describe_difference(parser, train, list(train), 1) is None
    reordered = ["train", "--lr", "0.002", "--out", "runs/a", "--dataset", "toy"]
    assert describe_difference(parser, train, reordered, 1) is None
    message = describe_difference(parser, train, train[:4] + ["runs/b", "--lr", "0.002"], 3)
    assert message.startswith("rank 3 of the data-parallel run was started with other option out "
                              "than rank 0 (out: rank 0 runs/a, rank 3 runs/b)")
    message = describe_difference(parser, train, train[:5] + ["--epochs", "2"], 1)
    assert "other options epochs, lr than rank 0" in message      # in the parser's order
    assert "epochs: rank 0 not given, rank 1 2; lr: rank 0 0.002, rank 1 not given" in message
    message = describe_difference(parser, train, ["translate", "--checkpoint", "c", "x"], 1)
    assert "other command translate than rank 0 (train)" in message
    message = describe_difference(parser, train, ["train", "--lr", "x"], 1)
    assert "another command line than rank 0" in message
    assert "rank 1: npformer train --lr x" in message


@needs_mpi
def test_a_rank_started_with_another_command_ends_the_job(tmp_path, run_dir):
    """The issue's case: rank 0 trains while rank 1 translates."""
    out, _ = run_dir
    t0 = time.monotonic()
    r = mpirun((1, NPFORMER + TOY + ["--out", tmp_path / "run"]),
               (1, NPFORMER + ["translate", "--checkpoint", out / "best", "x"]), timeout=60)
    assert r.returncode != 0
    said = "rank 1 of the data-parallel run was started with other command translate than rank 0"
    assert f"npformer train (rank 0 of 2): error: {said}" in r.stderr
    assert f"npformer translate (rank 1 of 2): error: {said}" in r.stderr
    assert "Traceback" not in r.stderr and time.monotonic() - t0 < 60
    assert not (tmp_path / "run").exists()


@needs_mpi
def test_ranks_with_another_out_are_refused(tmp_path):
    """Rank 1's --out was silently ignored (rank 0 writes the run)."""
    r = mpirun((1, NPFORMER + TOY + ["--out", tmp_path / "a"]),
               (1, NPFORMER + TOY + ["--out", tmp_path / "b"]), timeout=60)
    assert r.returncode != 0
    assert (f"rank 1 of the data-parallel run was started with other option out than rank 0 "
            f"(out: rank 0 {tmp_path / 'a'}, rank 1 {tmp_path / 'b'})") in r.stderr
    assert r.stderr.count("every rank must run the same command line") == 2   # both ranks say it
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
