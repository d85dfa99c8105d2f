"""Tests for npformer.checkpoint: round trips, corruption, kills during a save, RNG state."""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from npformer import checkpoint as ckpt_module
from npformer.checkpoint import (
    CheckpointError,
    checkpoint_paths,
    load_checkpoint,
    rng_from_arrays,
    rng_state_to_arrays,
    save_checkpoint,
)

REPO = Path(__file__).resolve().parents[1]


def sample_arrays(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "model/encoder.layers.0.self_attn.in_proj_weight": rng.standard_normal((6, 4)).astype(np.float32),
        "model/decoder.embed.weight": rng.standard_normal((5, 3)),  # float64
        "optim/step": np.asarray(seed + 7, dtype=np.int64),
        "optim/exp_avg": rng.integers(-(2**40), 2**40, size=(3, 2), dtype=np.int64),
        "data/mask": rng.random((2, 5)) > 0.5,
        "a": np.arange(3, dtype=np.float32),
        "a.npy": np.arange(4, dtype=np.float64),  # would collide with "a" under np.load's key lookup
        "empty": np.zeros((0, 3), dtype=np.float32),
        "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "strided": np.arange(20, dtype=np.int64)[::3],
    }


def sample_meta(step=1):
    return {
        "step": step,
        "config": {"d_model": 4, "betas": [0.9, 0.98], "dropout": 0.1, "tied": True, "note": None},
        "vocab": {"src": ["<pad>", "<s>", "你好", "世界", "🙂"], "tgt": ["<pad>", "hello", "world"]},
        "best_val_loss": float("inf"),
    }


def assert_same_arrays(got, expected):
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype, name
        assert got[name].shape == value.shape, name
        assert got[name].tobytes() == np.ascontiguousarray(value).tobytes(), name


def other_files(directory, stem="ckpt"):
    return sorted(p.name for p in Path(directory).iterdir() if p.name not in (f"{stem}.npz", f"{stem}.json"))


# ---------------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------------


def test_round_trip_dtypes_and_unicode_meta(tmp_path):
    arrays, meta = sample_arrays(), sample_meta()
    npz_path, json_path = save_checkpoint(tmp_path / "run" / "ckpt", arrays, meta)
    assert (npz_path, json_path) == (tmp_path / "run" / "ckpt.npz", tmp_path / "run" / "ckpt.json")
    assert other_files(tmp_path / "run") == []  # no temp files left behind
    for spelling in ("ckpt", "ckpt.npz", "ckpt.json"):
        got_arrays, got_meta = load_checkpoint(tmp_path / "run" / spelling)
        assert_same_arrays(got_arrays, arrays)
        assert got_meta == meta
    assert "你好" in json_path.read_text(encoding="utf-8")  # readable, not \u escapes


def test_tuples_come_back_as_lists_and_saving_twice_overwrites(tmp_path):
    save_checkpoint(tmp_path / "c", {"x": np.ones(2)}, {"betas": (0.9, 0.98)})
    save_checkpoint(tmp_path / "c", {"y": np.zeros(3, dtype=np.int64)}, {"step": 2})
    arrays, meta = load_checkpoint(tmp_path / "c")
    assert_same_arrays(arrays, {"y": np.zeros(3, dtype=np.int64)})
    assert meta == {"step": 2}
    assert other_files(tmp_path, "c") == []


def test_npz_is_a_standard_npz(tmp_path):
    arrays = {"w": np.arange(6.0).reshape(2, 3), "layer/b": np.ones(2, dtype=np.float32)}
    npz_path, _ = save_checkpoint(tmp_path / "c", arrays, {})
    with np.load(npz_path, allow_pickle=False) as z:
        assert sorted(z.files) == sorted(arrays)
        np.testing.assert_array_equal(z["w"], arrays["w"])


names = st.text(
    alphabet=st.characters(blacklist_characters="\x00\\", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)
dtypes = hnp.scalar_dtypes() | hnp.unicode_string_dtypes() | hnp.byte_string_dtypes()
some_arrays = st.dictionaries(
    names, dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))),
    max_size=4,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5).filter(lambda s: s.isprintable()), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=40, deadline=None)
@given(arrays=some_arrays, meta=st.dictionaries(st.text(max_size=6).filter(lambda s: s.isprintable()), json_values, max_size=4))
def test_round_trip_property(arrays, meta):
    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(Path(d) / "c", arrays, meta)
        got_arrays, got_meta = load_checkpoint(Path(d) / "c")
        assert_same_arrays(got_arrays, arrays)  # bitwise: NaN payloads and -0.0 survive
        assert got_meta == meta
        assert other_files(d, "c") == []


# ---------------------------------------------------------------------------------------------
# paths and bad input
# ---------------------------------------------------------------------------------------------


def test_checkpoint_paths_normalises():
    expected = (Path("run/ckpt.npz"), Path("run/ckpt.json"))
    for spelling in ("run/ckpt", "run/ckpt.npz", "run/ckpt.json", Path("run/ckpt.npz")):
        assert checkpoint_paths(spelling) == expected
    assert checkpoint_paths("run/ckpt.step10") == (Path("run/ckpt.step10.npz"), Path("run/ckpt.step10.json"))


@pytest.mark.parametrize("bad", ["", "run/", 12, None, b"run/ckpt"])
def test_checkpoint_paths_rejects_bad_paths(bad):
    with pytest.raises(ValueError, match="path"):
        checkpoint_paths(bad)


@pytest.mark.parametrize(
    "arrays, meta, match",
    [
        ({"x": np.array([1, "a"], dtype=object)}, {}, r"arrays\['x'\].*object"),
        ({"x": [1.0, 2.0]}, {}, r"arrays\['x'\].*ndarray.*list"),
        ({"x": np.float32(1.0)}, {}, r"arrays\['x'\].*ndarray.*float32"),
        ({"x": np.ma.masked_array([1.0], mask=[True])}, {}, r"arrays\['x'\].*MaskedArray"),
        ({"": np.ones(1)}, {}, "arrays.*non-empty"),
        ({1: np.ones(1)}, {}, "arrays.*str names"),
        ({"a\x00b": np.ones(1)}, {}, "arrays.*NUL"),
        ([np.ones(1)], {}, "arrays: expected a mapping"),
        ({}, [1], "meta: expected a mapping"),
        ({}, {0: "tok"}, r"meta.*str keys.*0"),
        ({}, {"vocab": {"a": 1, 2: "b"}}, r"meta\['vocab'\].*str keys"),
        ({}, {"step": np.int64(3)}, r"meta\['step'\].*int64"),
        ({}, {"tags": {"a", "b"}}, r"meta\['tags'\].*set"),
        ({}, {"bad": "\ud800"}, r"meta\['bad'\].*UTF-8"),
    ],
)
def test_save_rejects_bad_input_and_writes_nothing(tmp_path, arrays, meta, match):
    with pytest.raises(ValueError, match=match):
        save_checkpoint(tmp_path / "c", arrays, meta)
    assert list(tmp_path.iterdir()) == []


def test_save_rejects_circular_meta(tmp_path):
    meta = {"a": []}
    meta["a"].append(meta)
    with pytest.raises(CheckpointError, match="circular"):
        save_checkpoint(tmp_path / "c", {}, meta)


# ---------------------------------------------------------------------------------------------
# corrupt and missing files
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    npz_path, json_path = save_checkpoint(tmp_path / "ckpt", sample_arrays(), sample_meta())
    return npz_path, json_path


def test_missing_files(saved, tmp_path):
    npz_path, json_path = saved
    moved = npz_path.read_bytes()
    npz_path.unlink()
    with pytest.raises(CheckpointError, match=r"ckpt\.npz.*missing"):
        load_checkpoint(npz_path)
    npz_path.write_bytes(moved)
    json_path.unlink()
    with pytest.raises(CheckpointError, match=r"ckpt\.json.*missing"):
        load_checkpoint(npz_path)
    npz_path.unlink()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "ckpt")


@pytest.mark.parametrize("how", ["truncate", "truncate_to_zero", "flip_middle", "flip_last", "append"])
def test_corrupt_npz_fails_digest_check(saved, how):
    npz_path, _ = saved
    data = bytearray(npz_path.read_bytes())
    if how == "truncate":
        data = data[: len(data) // 2]
    elif how == "truncate_to_zero":
        data = bytearray()
    elif how == "flip_middle":
        data[len(data) // 2] ^= 0xFF
    elif how == "flip_last":
        data[-1] ^= 0x01
    else:
        data += b"\x00"
    npz_path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"ckpt\.npz.*does not match.*ckpt\.json"):
        load_checkpoint(npz_path)


def rewrite_digest(npz_path, json_path):
    """Make the JSON vouch for whatever the npz now holds (as a hand edit or a buggy writer would)."""
    digest, nbytes = ckpt_module._sha256_of(npz_path)
    doc = json.loads(json_path.read_text(encoding="utf-8"))
    doc["npz_sha256"], doc["npz_bytes"] = digest, nbytes
    json_path.write_text(json.dumps(doc), encoding="utf-8")


@pytest.mark.parametrize("how", ["truncate", "flip_array_data", "not_a_zip"])
def test_corrupt_npz_behind_a_matching_digest_is_still_caught(saved, how):
    npz_path, json_path = saved
    data = bytearray(npz_path.read_bytes())
    if how == "truncate":
        data = data[: len(data) - 30]  # cuts the zip's central directory
    elif how == "flip_array_data":
        data[200] ^= 0xFF  # inside the first member: CRC, npy header or index check fails
    else:
        data = bytearray(b"not a zip file at all" * 10)
    npz_path.write_bytes(bytes(data))
    rewrite_digest(npz_path, json_path)
    with pytest.raises(CheckpointError, match=r"ckpt\.npz"):
        load_checkpoint(npz_path)


def test_object_arrays_are_refused_on_load(saved):
    npz_path, json_path = saved
    np.savez(npz_path, evil=np.array([{"a": 1}], dtype=object), ok=np.ones(2))  # pickled member
    rewrite_digest(npz_path, json_path)
    with pytest.raises(CheckpointError, match=r"ckpt\.npz.*'evil'.*object array"):
        load_checkpoint(npz_path)


def test_index_mismatch_is_caught(saved):
    npz_path, json_path = saved
    doc = json.loads(json_path.read_text(encoding="utf-8"))
    doc["arrays"]["a"]["shape"] = [99]
    json_path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"ckpt\.npz.*'a'.*\[3\].*\[99\]"):
        load_checkpoint(npz_path)


@pytest.mark.parametrize(
    "text, match",
    [
        (b"\xff\xfe garbage", "corrupt JSON"),
        (b'{"format": "npformer-checkpoint", "format_ver', "corrupt JSON"),
        (b"[1, 2, 3]", "expected an object"),
        (b'{"format": "something-else", "format_version": 1}', "expected an object with format"),
        ("version 2", "format_version 1, got 2"),
        ("version '1'", "format_version 1, got '1'"),
        ("no digest", "npz_sha256"),
        ("meta list", "'meta' to be an object"),
    ],
)
def test_corrupt_json(saved, text, match):
    npz_path, json_path = saved
    if isinstance(text, str):
        doc = json.loads(json_path.read_text(encoding="utf-8"))
        if text == "version 2":
            doc["format_version"] = 2
        elif text == "version '1'":
            doc["format_version"] = "1"
        elif text == "no digest":
            del doc["npz_sha256"]
        else:
            doc["meta"] = [1]
        text = json.dumps(doc).encode()
    json_path.write_bytes(text)
    with pytest.raises(CheckpointError, match=r"ckpt\.json.*" + match):
        load_checkpoint(npz_path)


def test_pair_from_two_saves_is_detected(tmp_path):
    save_checkpoint(tmp_path / "ckpt", sample_arrays(0), sample_meta(1))
    old_json = (tmp_path / "ckpt.json").read_bytes()
    old_npz = (tmp_path / "ckpt.npz").read_bytes()
    save_checkpoint(tmp_path / "ckpt", sample_arrays(1), sample_meta(2))
    new_json = (tmp_path / "ckpt.json").read_bytes()
    (tmp_path / "ckpt.json").write_bytes(old_json)  # old json + new npz
    with pytest.raises(CheckpointError, match=r"ckpt\.npz.*does not match.*ckpt\.json.*different saves"):
        load_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt.json").write_bytes(new_json)
    (tmp_path / "ckpt.npz").write_bytes(old_npz)  # new json + old npz
    with pytest.raises(CheckpointError, match="different saves"):
        load_checkpoint(tmp_path / "ckpt")


# ---------------------------------------------------------------------------------------------
# failures and kills during a save
# ---------------------------------------------------------------------------------------------


def test_exception_while_writing_leaves_old_checkpoint_and_no_temp_files(tmp_path, monkeypatch):
    save_checkpoint(tmp_path / "ckpt", sample_arrays(0), sample_meta(1))
    real_write = np.lib.format.write_array
    calls = []

    def failing_write(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", failing_write)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "ckpt", sample_arrays(1), sample_meta(2))
    assert len(calls) == 3
    assert other_files(tmp_path) == []
    arrays, meta = load_checkpoint(tmp_path / "ckpt")
    assert_same_arrays(arrays, sample_arrays(0))
    assert meta == sample_meta(1)


@pytest.mark.parametrize("failing_call, loads_old", [(1, True), (2, False)])
def test_failing_rename_leaves_no_temp_files_and_never_a_mixed_pair(tmp_path, monkeypatch, failing_call, loads_old):
    save_checkpoint(tmp_path / "ckpt", sample_arrays(0), sample_meta(1))
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == failing_call:
            raise OSError("rename failed (simulated)")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="rename failed"):
        save_checkpoint(tmp_path / "ckpt", sample_arrays(1), sample_meta(2))
    monkeypatch.undo()
    assert Path(calls[0]).name == "ckpt.npz"  # the npz is renamed first, the json last
    assert other_files(tmp_path) == []
    if loads_old:
        arrays, meta = load_checkpoint(tmp_path / "ckpt")
        assert_same_arrays(arrays, sample_arrays(0))
        assert meta == sample_meta(1)
    else:  # new npz, old json: refused instead of mixing old metadata with new weights
        with pytest.raises(CheckpointError, match="different saves"):
            load_checkpoint(tmp_path / "ckpt")


# The child loads npformer/checkpoint.py by file path (it needs only numpy) rather than through
# `import npformer`, whose __init__ may pull in numba: the kill tests time the save, not imports.
LOAD_MODULE = f"""
import importlib.util
_spec = importlib.util.spec_from_file_location("ckpt_under_test", {str(REPO / "npformer" / "checkpoint.py")!r})
ck = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ck)
save_checkpoint = ck.save_checkpoint
"""


def run_python(code, *args, **popen_kwargs):
    code = LOAD_MODULE + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], **popen_kwargs)


SELF_KILL = """
    import os, signal, sys
    import numpy as np

    directory, function, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    save_checkpoint(directory + "/ckpt", {"w": np.full(1000, 1.0)}, {"tag": "A"})
    real = getattr(os, function)
    calls = [0]

    def hooked(*args, **kwargs):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(os, function, hooked)
    save_checkpoint(directory + "/ckpt", {"w": np.full(1000, 2.0), "v": np.ones(3)}, {"tag": "B"})
"""


@pytest.mark.parametrize(
    "function, kill_at, expected",
    [
        ("fsync", 1, "A"),  # npz temp written, not yet synced
        ("fsync", 2, "A"),  # json temp written, not yet synced
        ("replace", 1, "A"),  # both temps durable, nothing renamed
        ("replace", 2, "mismatch"),  # new npz in place, old json: the unavoidable window
        ("fsync", 3, "B"),  # both renamed, directory not yet synced
        ("fsync", 99, "B"),  # the save completes
    ],
)
def test_kill_at_each_step_of_a_save(tmp_path, function, kill_at, expected):
    proc = run_python(SELF_KILL, tmp_path, function, kill_at)
    assert proc.wait(timeout=30) == (0 if kill_at == 99 else -signal.SIGKILL)
    if expected == "mismatch":
        with pytest.raises(CheckpointError, match=r"ckpt\.npz.*different saves"):
            load_checkpoint(tmp_path / "ckpt")
        return
    arrays, meta = load_checkpoint(tmp_path / "ckpt")
    assert meta == {"tag": expected}
    assert_same_arrays(arrays, {"w": np.full(1000, 1.0)} if expected == "A" else {"w": np.full(1000, 2.0), "v": np.ones(3)})
    # stray temp files (if any) are ignored, and the next save works next to them
    save_checkpoint(tmp_path / "ckpt", {"w": np.zeros(2)}, {"tag": "C"})
    assert load_checkpoint(tmp_path / "ckpt")[1] == {"tag": "C"}


BIG_SAVE = """
    import sys
    import numpy as np

    directory = sys.argv[1]
    save_checkpoint(directory + "/ckpt", {"w": np.arange(10.0)}, {"tag": "A"})
    big = {f"layer{i}": np.arange(3_125_000, dtype=np.float64) + i for i in range(8)}  # 200 MB
    print("A saved", flush=True)
    save_checkpoint(directory + "/ckpt", big, {"tag": "B"})
    print("B saved", flush=True)
"""


def check_a_or_b(directory):
    arrays, meta = load_checkpoint(Path(directory) / "ckpt")  # must not raise
    if meta == {"tag": "A"}:
        assert_same_arrays(arrays, {"w": np.arange(10.0)})
    else:
        assert meta == {"tag": "B"}
        assert sorted(arrays) == [f"layer{i}" for i in range(8)]
        expected = np.arange(3_125_000, dtype=np.float64)
        for i in range(8):
            assert np.array_equal(arrays[f"layer{i}"], expected + i)
    return meta["tag"]


def start_big_save(directory):
    proc = run_python(BIG_SAVE, directory, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "A saved"
    return proc


def test_sigkill_during_a_large_save_leaves_a_or_b(tmp_path):
    # 1) kill as soon as the npz temp file shows up (B is mid-write)
    d1 = tmp_path / "at_temp"
    d1.mkdir()
    proc = start_big_save(d1)
    deadline = time.monotonic() + 10
    while not other_files(d1) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    temps = other_files(d1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    assert temps and all(name.endswith(".tmp") for name in temps), temps
    assert check_a_or_b(d1) == "A"  # the big npz takes ~1 s to write; we killed within ms

    # 2) kill after a few random short delays
    delays = random.Random(1234).sample([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2], 2)
    for k, delay in enumerate(delays):
        d = tmp_path / f"delay{k}"
        d.mkdir()
        proc = start_big_save(d)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
        check_a_or_b(d)
        assert all(name.endswith(".tmp") for name in other_files(d))


# ---------------------------------------------------------------------------------------------
# RNG state
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bit_generator", ["PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"])
def test_rng_round_trip_through_a_checkpoint(tmp_path, bit_generator):
    rng = np.random.Generator(getattr(np.random, bit_generator)(2024))
    rng.standard_normal(7)
    rng.integers(0, 2**32, dtype=np.uint32)  # leaves half a 64-bit draw buffered (has_uint32)
    arrays = rng_state_to_arrays(rng, "rng")
    assert all(name.startswith("rng/") and a.dtype != object for name, a in arrays.items())
    save_checkpoint(tmp_path / "c", {**arrays, "rngfoo/x": np.ones(1)}, {})
    loaded, _ = load_checkpoint(tmp_path / "c")
    restored = rng_from_arrays(loaded, "rng")
    assert type(restored.bit_generator).__name__ == bit_generator
    assert restored.integers(0, 2**32, dtype=np.uint32) == rng.integers(0, 2**32, dtype=np.uint32)
    np.testing.assert_array_equal(restored.standard_normal(50), rng.standard_normal(50))
    np.testing.assert_array_equal(restored.permutation(20), rng.permutation(20))


def test_rng_int_limbs_hold_128_bit_state():
    rng = np.random.default_rng(5)
    arrays = rng_state_to_arrays(rng, "r")
    limbs = arrays["r/int/state/state"]
    assert limbs.dtype == np.uint64 and limbs.ndim == 1
    assert int(limbs[0]) + (int(limbs[1]) << 64) == rng.bit_generator.state["state"]["state"]


def test_rng_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="rng: expected a numpy.random.Generator"):
        rng_state_to_arrays(np.random.RandomState(0), "rng")
    with pytest.raises(ValueError, match="prefix"):
        rng_state_to_arrays(rng, "")
    arrays = rng_state_to_arrays(rng, "rng")
    with pytest.raises(CheckpointError, match="no RNG state under prefix 'other/'"):
        rng_from_arrays(arrays, "other")
    bad_name = {**arrays, "rng/str/bit_generator": np.frombuffer(b"Generator", dtype=np.uint8)}
    with pytest.raises(CheckpointError, match="bit generator.*'Generator'"):
        rng_from_arrays(bad_name, "rng")
    bad_limbs = {**arrays, "rng/int/state/inc": np.array([1.5])}
    with pytest.raises(CheckpointError, match="uint64"):
        rng_from_arrays(bad_limbs, "rng")
    missing = {k: v for k, v in arrays.items() if k != "rng/int/state/inc"}
    with pytest.raises(CheckpointError, match="not a valid PCG64 state"):
        rng_from_arrays(missing, "rng")
