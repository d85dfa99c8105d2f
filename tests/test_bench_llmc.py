"""benchmarks/bench_llmc.py's writers of llm.c's files, read back with parsers of llm.c's formats
written here from its C (gpt2_build_from_checkpoint, fill_in_parameter_sizes, dataloader.h,
tokenizer.h), its step-time parsing and its command-line errors."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "bench_llmc.py"
_spec = importlib.util.spec_from_file_location("bench_llmc_under_test", SCRIPT)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def llmc_num_parameters(max_len, padded_vocab, n_layers, channels):
    """llm.c's num_parameters, summed by hand from fill_in_parameter_sizes: the embeddings, per
    layer four matrices (3C x C, C x C, 4C x C, C x 4C) and 13 C of gains and biases, the final
    layer norm."""
    C = channels
    return padded_vocab * C + max_len * C + n_layers * (12 * C * C + 13 * C) + 2 * C


def read_checkpoint(path):
    """llm.c's reader: the 256 x int32 header, then the float32 parameters to the end."""
    raw = Path(path).read_bytes()
    return np.frombuffer(raw[:1024], dtype="<i4"), np.frombuffer(raw[1024:], dtype="<f4")


def test_gpt2_small_has_llm_c_parameter_count():
    sizes = bench.parameter_sizes(1024, 50257, 12, 768)
    assert bench.padded_vocab(50257) == 50304
    assert sum(n for _, n in sizes) == 124_475_904          # llm.c's "num_parameters" for 124M
    assert sum(n for _, n in sizes) == llmc_num_parameters(1024, 50304, 12, 768)


def test_checkpoint_header_and_parameters_read_back(tmp_path):
    max_len, vocab, layers, heads, C = 16, 300, 2, 2, 8
    path = tmp_path / "gpt2_124M.bin"
    count = bench.write_checkpoint(path, max_len, vocab, layers, heads, C, seed=3)
    header, params = read_checkpoint(path)
    vp = 384                                                  # 300 padded to a multiple of 128
    assert list(header[:8]) == [20240326, 3, max_len, vocab, layers, heads, C, vp]
    assert not header[8:].any()
    assert count == params.size == llmc_num_parameters(max_len, vp, layers, C)
    assert path.stat().st_size == 1024 + 4 * count
    assert not list(tmp_path.glob("*.tmp"))
    # the tensors in llm.c's order: wte (Vp, C), wpe (maxT, C), then per kind over the layers
    order = [("wte", vp * C), ("wpe", max_len * C), ("ln1w", layers * C), ("ln1b", layers * C),
             ("qkvw", layers * 3 * C * C), ("qkvb", layers * 3 * C), ("attprojw", layers * C * C),
             ("attprojb", layers * C), ("ln2w", layers * C), ("ln2b", layers * C),
             ("fcw", layers * 4 * C * C), ("fcb", layers * 4 * C), ("fcprojw", layers * 4 * C * C),
             ("fcprojb", layers * C), ("lnfw", C), ("lnfb", C)]
    offsets = np.cumsum([0] + [n for _, n in order])
    t = {name: params[offsets[i]:offsets[i + 1]] for i, (name, _) in enumerate(order)}
    wte = t["wte"].reshape(vp, C)
    assert not wte[vocab:].any() and wte[:vocab].all()      # padded rows 0, the others drawn
    for name in ("ln1w", "ln2w", "lnfw"):
        assert (t[name] == 1).all(), name
    for name in ("ln1b", "qkvb", "attprojb", "ln2b", "fcb", "fcprojb", "lnfb"):
        assert not t[name].any(), name
    for name in ("wpe", "qkvw", "attprojw", "fcw", "fcprojw"):
        assert 0.015 < t[name].std() < 0.025 and abs(t[name].mean()) < 0.005, name
    again = tmp_path / "again.bin"
    bench.write_checkpoint(again, max_len, vocab, layers, heads, C, seed=3)
    assert again.read_bytes() == path.read_bytes()            # seeded


def test_checkpoint_refuses_heads_that_do_not_split_channels(tmp_path):
    with pytest.raises(ValueError, match="channels: expected a multiple of n_heads=3, got 8"):
        bench.write_checkpoint(tmp_path / "x.bin", 16, 300, 1, 3, 8)


def test_token_file_reads_back_as_llm_c_dataloader_reads_it(tmp_path):
    path = tmp_path / "tiny_shakespeare_train.bin"
    bench.write_tokens(path, 4 * 64 * 3 + 1, vocab=50257, seed=1)
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    tokens = np.frombuffer(raw[1024:], dtype="<u2")
    assert list(header[:3]) == [20240520, 1, 4 * 64 * 3 + 1] and not header[3:].any()
    assert len(raw) == 1024 + 2 * header[2]                  # dataloader.h's size check
    assert tokens.size == header[2] and tokens.max() < 50257 and tokens.max() > 40000


def test_tokenizer_file_reads_back_as_llm_c_tokenizer_reads_it(tmp_path):
    path = tmp_path / "gpt2_tokenizer.bin"
    bench.write_tokenizer(path, vocab=300, eot=299)
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<u4")
    assert list(header[:4]) == [20240328, 2, 300, 299]
    pos, table = 1024, []
    for _ in range(header[2]):
        n = raw[pos]
        assert n > 0                                          # tokenizer.h asserts length > 0
        table.append(raw[pos + 1:pos + 1 + n])
        pos += 1 + n
    assert pos == len(raw) and table[0] == b"<0>" and table[299] == b"<299>"


def test_step_times_leave_out_step_zero():
    output = ("val loss 10.83\nstep 0: train loss 10.827573 (took 275.305323 ms)\n"
              "step 1: train loss 10.839209 (took 161.833753 ms)\nval loss 10.8\n"
              "step 2: train loss 10.849203 (took 1200.5 ms)\n")
    assert bench.step_times(output) == pytest.approx([0.161833753, 1.2005])
    assert bench.step_times("val loss 10.83\n") == []


def test_limit_steps_changes_only_the_loop_bound():
    source = "int main() {\n    for (int step = 0; step <= 40; step++) {\n        train();\n}"
    out = bench.limit_steps(source, 12)
    assert out == source.replace("step <= 40", "step <= 12")
    with pytest.raises(ValueError, match="expected its training loop .* found it 0 times"):
        bench.limit_steps("for (int step = 0; step < 10; step++)", 12)


def test_source_shape_reads_batch_tokens_and_update():
    source = ("int B = 4; // batch\nint T = 64; // seq\n"
              "gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, step+1);\n")
    assert bench.source_shape(source) == (4, 64, source.splitlines()[2])
    with pytest.raises(ValueError, match="train_gpt2.c: expected 'int B"):
        bench.source_shape("int B = 4;")


@pytest.mark.parametrize("argv, message", [
    (["--llmc", "no/such/dir"], "--llmc no/such/dir: expected a checkout of llm.c with "
                                "train_gpt2.c, not found"),
    (["--llmc", ".", "--steps", "2"], "--steps: expected at least 5, got 2"),
    (["--llmc", ".", "--llmc-steps", "41"], "--llmc-steps: expected 5 to 40, got 41"),
])
def test_cli_errors_are_one_line(argv, message):
    out = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True,
                         cwd=REPO)
    assert out.returncode == 2 and out.stdout == ""
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()                   # argparse's usage, then the error
    assert lines[-1].startswith("bench_llmc.py: error: ") and message in lines[-1]
    assert all(line.startswith(("usage:", " ")) for line in lines[:-1])


