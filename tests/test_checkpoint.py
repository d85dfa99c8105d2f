"""Tests for npformer.checkpoint: round trips, corruption, kills during a save, RNG state."""

import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from npformer import checkpoint as ckpt_module
from npformer.checkpoint import (
    FORMAT_VERSION,
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
        "__meta__.json.npy": np.ones(2, dtype=np.int8),  # only the exact name "__meta__.json" is reserved
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


def load_quietly(path):
    """load_checkpoint, failing on any warning (e.g. a json copy that does not match the npz)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_checkpoint(path)


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
        got_arrays, got_meta = load_quietly(tmp_path / "run" / spelling)
        assert_same_arrays(got_arrays, arrays)
        assert got_meta == meta
    copy = json.loads(json_path.read_text(encoding="utf-8"))  # the readable copy beside the npz
    assert "你好" in json_path.read_text(encoding="utf-8")  # readable, not \u escapes
    assert copy["meta"] == meta and copy["format_version"] == FORMAT_VERSION == 3
    assert copy["arrays"]["model/decoder.embed.weight"] == {"dtype": "float64", "shape": [5, 3]}


def test_tuples_come_back_as_lists_and_saving_twice_overwrites(tmp_path):
    save_checkpoint(tmp_path / "c", {"x": np.ones(2)}, {"betas": (0.9, 0.98)})
    save_checkpoint(tmp_path / "c", {"y": np.zeros(3, dtype=np.int64)}, {"step": 2})
    arrays, meta = load_quietly(tmp_path / "c")
    assert_same_arrays(arrays, {"y": np.zeros(3, dtype=np.int64)})
    assert meta == {"step": 2}
    assert other_files(tmp_path, "c") == []


def test_npz_is_a_standard_npz(tmp_path):
    arrays = {"w": np.arange(6.0).reshape(2, 3), "layer/b": np.ones(2, dtype=np.float32)}
    npz_path, json_path = save_checkpoint(tmp_path / "c", arrays, {"step": 3})
    with np.load(npz_path, allow_pickle=False) as z:
        assert sorted(z.files) == sorted([*arrays, "__meta__.json"])
        np.testing.assert_array_equal(z["w"], arrays["w"])
        doc = json.loads(z["__meta__.json"].tobytes().decode("utf-8"))  # the metadata travels inside
    assert doc["meta"] == {"step": 3} and doc["arrays"]["layer/b"] == {"dtype": "float32", "shape": [2]}
    data = npz_path.read_bytes()
    assert data[-80:-64] == b"npformer-sha256:"
    assert data[-64:].decode() == hashlib.sha256(data[:-64]).hexdigest()  # trailer: hash of all before it
    copy = json.loads(json_path.read_text(encoding="utf-8"))
    assert (copy["npz_sha256"], copy["npz_bytes"]) == (hashlib.sha256(data).hexdigest(), len(data))


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
        got_arrays, got_meta = load_quietly(Path(d) / "c")  # also: the json copy is judged to match
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
        ({"w": np.ones(1), "__meta__.json": np.ones(1)}, {}, r"arrays.*'__meta__\.json' is reserved"),
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
# corrupt, forged and missing files
# ---------------------------------------------------------------------------------------------

TRAILER = b"npformer-sha256:"  # the npz ends with this and 64 hex digits (see the module docstring)


@pytest.fixture
def saved(tmp_path):
    npz_path, json_path = save_checkpoint(tmp_path / "ckpt", sample_arrays(), sample_meta())
    return npz_path, json_path


def reseal(npz_path):
    """Make the trailer vouch for whatever the npz now holds (as a forger or a buggy writer would)."""
    body = npz_path.read_bytes()[:-64]
    npz_path.write_bytes(body + hashlib.sha256(body).hexdigest().encode())


def npy_bytes(array, allow_pickle=False):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


def read_members(npz_path):
    with zipfile.ZipFile(npz_path) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def write_members(npz_path, members):
    """Write ``{member name: raw bytes}`` as a zip with a correct trailer, without save_checkpoint."""
    with zipfile.ZipFile(npz_path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.comment = TRAILER + b"0" * 64
    reseal(npz_path)


def meta_doc(members):
    return json.loads(np.lib.format.read_array(io.BytesIO(members["__meta__.json.npy"])).tobytes().decode())


def with_meta(members, doc):
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return {**members, "__meta__.json.npy": npy_bytes(np.frombuffer(raw, dtype=np.uint8))}


def test_npz_alone_is_the_checkpoint(saved, tmp_path):
    npz_path, json_path = saved
    json_path.unlink()  # the readable copy is optional
    arrays, meta = load_quietly(tmp_path / "ckpt")
    assert_same_arrays(arrays, sample_arrays())
    assert meta == sample_meta()
    npz_path.unlink()
    with pytest.raises(CheckpointError, match=r"no checkpoint at .*ckpt\.npz does not exist"):
        load_checkpoint(tmp_path / "ckpt")
    save_checkpoint(tmp_path / "ckpt", {}, {})
    npz_path.unlink()
    with pytest.raises(CheckpointError, match=r"ckpt\.npz is missing.*ckpt\.json.*only a readable copy"):
        load_checkpoint(json_path)


@pytest.mark.parametrize(
    "how, match",
    [
        ("truncate", "does not end with its sha256 trailer"),
        ("truncate_to_zero", "only 0 bytes"),
        ("flip_first", "sha256 mismatch"),
        ("flip_middle", "sha256 mismatch"),
        ("change_last_digit", "sha256 mismatch"),
        ("append", "does not end with its sha256 trailer"),
        ("plain_np_savez", "does not end with its sha256 trailer.*np.savez"),
    ],
)
def test_corrupt_npz_fails_the_trailer_check(saved, how, match):
    npz_path, _ = saved
    data = bytearray(npz_path.read_bytes())
    if how == "truncate":
        data = data[: len(data) // 2]
    elif how == "truncate_to_zero":
        data = bytearray()
    elif how == "flip_first":
        data[0] ^= 0xFF
    elif how == "flip_middle":
        data[len(data) // 2] ^= 0xFF
    elif how == "change_last_digit":
        data[-1:] = b"1" if data[-1:] == b"0" else b"0"
    elif how == "append":
        data += b"\x00"
    npz_path.write_bytes(bytes(data))
    if how == "plain_np_savez":
        np.savez(npz_path, w=np.ones(3))
    with pytest.raises(CheckpointError, match=r"ckpt\.npz: .*" + match):
        load_checkpoint(npz_path)


def add_evil_object_array(members):
    doc = meta_doc(members)
    doc["arrays"]["evil"] = {"dtype": "object", "shape": [1]}
    members = with_meta(members, doc)
    return {**members, "evil.npy": npy_bytes(np.array([{"a": 1}], dtype=object), allow_pickle=True)}


def edit_doc(change):
    def edit(members):
        doc = meta_doc(members)
        change(doc)
        return with_meta(members, doc)
    return edit


@pytest.mark.parametrize(
    "forge, match",
    [
        (lambda m: {k: v for k, v in m.items() if k != "__meta__.json.npy"}, r"member '__meta__\.json': missing.*format 1"),
        (lambda m: {**m, "__meta__.json.npy": npy_bytes(np.ones(3))}, "1-D uint8.*float64"),
        (lambda m: with_meta(m, b"\xff\xfe garbage"), "corrupt JSON"),
        (lambda m: with_meta(m, b'{"format": "npformer-checkpoint", "format_ver'), "corrupt JSON"),
        (lambda m: with_meta(m, b"[1, 2, 3]"), "expected an object"),
        (edit_doc(lambda d: d.update(format="something-else")), "format 'npformer-checkpoint', got 'something-else'"),
        (edit_doc(lambda d: d.update(format_version=1)), "format_version 2 or 3, got 1"),
        (edit_doc(lambda d: d.update(format_version="2")), "format_version 2 or 3, got '2'"),
        (edit_doc(lambda d: d.update(format_version=4)),
         r"format_version 4, written by a newer npformer: newer than this npformer reads"),
        (edit_doc(lambda d: (d.update(format_version=9), d["meta"].update(npformer_version="2.0"))),
         r"format_version 9, written by npformer 2\.0: newer than this npformer reads \(format "
         r"versions 2 to 3\); update npformer"),
        (edit_doc(lambda d: d.update(arrays=[])), "'arrays' to map names"),
        (edit_doc(lambda d: d.update(meta=[1])), "'meta' to be an object"),
        (edit_doc(lambda d: d["arrays"]["a"].update(shape=[99])), r"array 'a' is float32 \[3\].*records float32 \[99\]"),
        (edit_doc(lambda d: d["arrays"].pop("empty")), r"do not match the index.*unexpected \['empty'\]"),
        (lambda m: {**m, "notes.txt": b"hi"}, "unexpected member 'notes.txt'"),
        (add_evil_object_array, "'evil' is an object array; refusing to unpickle"),
    ],
)
def test_forged_npz_with_a_valid_trailer_is_still_checked(saved, forge, match):
    npz_path, _ = saved
    write_members(npz_path, forge(read_members(npz_path)))
    with pytest.raises(CheckpointError, match=r"ckpt\.npz: .*" + match):
        load_checkpoint(npz_path)


def load_peak(npz_path):
    """Load ``npz_path``, which must fail with CheckpointError; return (peak bytes allocated
    meanwhile, numpy arrays included, the error message)."""
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as err:
            load_checkpoint(npz_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, str(err.value)


def npy_header(descr, shape, version=(1, 0)):
    buf = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    if version == (1, 0):
        np.lib.format.write_array_header_1_0(buf, header)
    else:
        np.lib.format.write_array_header_2_0(buf, header)
    return buf.getvalue()


def test_compressed_member_is_refused_before_it_is_inflated(saved):
    """A small deflated member can expand to any size: it is refused unread, naming the member
    (the old loader inflated all of it, then failed the index check)."""
    npz_path, _ = saved
    members = read_members(npz_path)
    doc = meta_doc(members)
    doc["arrays"]["a"] = {"dtype": "float32", "shape": [16 * 2**20]}  # 64 MiB of zeros
    members = with_meta(members, doc)
    with zipfile.ZipFile(npz_path, "w") as zf:
        for name, data in members.items():
            if name != "a.npy":
                zf.writestr(name, data)
        info = zipfile.ZipInfo("a.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w") as out:  # streamed: no 64 MiB buffer in the test either
            out.write(npy_header("<f4", (16 * 2**20,)))
            zeros = bytes(2**20)
            for _ in range(64):
                out.write(zeros)
        zf.comment = TRAILER + b"0" * 64
    reseal(npz_path)
    assert npz_path.stat().st_size < 2**20
    peak, message = load_peak(npz_path)
    assert "ckpt.npz: member 'a.npy' is compressed (deflate)" in message
    assert peak < 8 * 2**20, f"refusing the file allocated {peak} bytes"


@pytest.mark.parametrize("shape, version, match", [
    ((2**40,), (1, 0), r"declares float32 \[1099511627776\] \(4398046511104 bytes\) but the member stores 12 bytes"),
    ((2**31,), (2, 0), r"declares float32 \[2147483648\] \(8589934592 bytes\) but the member stores 12 bytes"),
    ((2**32, 2**32, 0, 5), (1, 0), r"declares float32 .* \(0 bytes\) but the member stores 12 bytes"),
    ((2,), (1, 0), r"\(8 bytes\) but the member stores 12 bytes"),
    ((-1, -3), (1, 0), r"negative dimension in shape \[-1, -3\]"),
])
def test_npy_header_must_declare_exactly_the_stored_bytes(saved, shape, version, match):
    """A header is a claim: the loader checks it against the member's size before allocating
    (the old one allocated whatever the header declared: MemoryError, or 8 GiB of address space)."""
    npz_path, _ = saved
    members = read_members(npz_path)
    members["a.npy"] = npy_header("<f4", shape, version) + np.arange(3, dtype="<f4").tobytes()
    write_members(npz_path, members)
    peak, message = load_peak(npz_path)
    assert re.search(r"ckpt\.npz: member 'a\.npy': the npy header .*" + match, message), message
    assert peak < 8 * 2**20, f"refusing the file allocated {peak} bytes"


def test_npy_header_length_is_bounded(saved):
    npz_path, _ = saved
    members = read_members(npz_path)
    members["a.npy"] = b"\x93NUMPY\x02\x00" + (2**31).to_bytes(4, "little") + b"{" * 64
    write_members(npz_path, members)
    peak, message = load_peak(npz_path)
    assert "ckpt.npz: member 'a.npy': npy header of 2147483648 bytes; expected at most 10000" in message
    assert peak < 8 * 2**20


@pytest.mark.parametrize("text", [b"{'descr': '<f4', (\n", b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}\n",
                                  b"\xff\xfe\n", b"[" * 300 + b"\n"])
def test_corrupt_npy_header_text_is_a_checkpoint_error(saved, text):
    """numpy's header parser fails with tokenize.TokenError, SyntaxError or ValueError; the loader
    turns each into a CheckpointError naming the member (a TokenError used to escape)."""
    npz_path, _ = saved
    members = read_members(npz_path)
    members["a.npy"] = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text
    write_members(npz_path, members)
    with pytest.raises(CheckpointError, match=r"ckpt\.npz: member 'a\.npy': (corrupt npy header|the npy header)"):
        load_checkpoint(npz_path)


@pytest.mark.parametrize("edit, match", [
    (lambda info: setattr(info, "compress_size", 10**12) or setattr(info, "file_size", 10**12),
     r"member 'a\.npy' claims 1000000000000 bytes at offset \d+, beyond the end of the \d+-byte file"),
    (lambda info: setattr(info, "file_size", info.file_size + 1),
     r"member 'a\.npy' is stored uncompressed, yet the zip directory records \d+ stored bytes and \d+"),
    (lambda info: setattr(info, "flag_bits", info.flag_bits | 1), r"member 'a\.npy' is encrypted"),
])
def test_zip_directory_entries_are_checked_against_the_file(saved, edit, match):
    """The central directory's sizes are claims too. (Rewritten through zipfile's own writer,
    which copies the edited entry into the directory.)"""
    npz_path, _ = saved
    members = read_members(npz_path)
    with zipfile.ZipFile(npz_path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        edit(zf.getinfo("a.npy"))
        zf.comment = TRAILER + b"0" * 64
    reseal(npz_path)
    with pytest.raises(CheckpointError, match=r"ckpt\.npz: " + match):
        load_checkpoint(npz_path)


def test_save_refuses_what_the_loader_would_refuse(tmp_path):
    with pytest.raises(CheckpointError, match=r"arrays\['v'\]: dtype .* has zero-byte elements"):
        save_checkpoint(tmp_path / "c", {"v": np.zeros(3, dtype="V0")}, {})
    with pytest.raises(CheckpointError, match=r"arrays\['s'\]: .*non-ASCII field names"):
        save_checkpoint(tmp_path / "c", {"s": np.zeros(2, dtype=[("größe", "<f4")])}, {})
    assert not (tmp_path / "c.npz").exists()


@pytest.mark.parametrize("how", ["flip_member_data", "cut_the_middle", "not_a_zip"])
def test_corrupt_zip_behind_a_valid_trailer_is_still_caught(saved, how):
    npz_path, _ = saved
    data = npz_path.read_bytes()
    if how == "flip_member_data":
        i = data.index(b'"format_version"')  # inside the first member: its CRC-32 no longer matches
        data = data[:i] + b"X" + data[i + 1:]
    elif how == "cut_the_middle":
        data = data[: len(data) // 2] + data[-80:]
    else:
        data = b"not a zip file at all" * 10 + TRAILER + b"0" * 64
    npz_path.write_bytes(data)
    reseal(npz_path)
    with pytest.raises(CheckpointError, match=r"ckpt\.npz: corrupt npz"):
        load_checkpoint(npz_path)


@pytest.mark.parametrize(
    "how, reason",
    [
        ("old_json_new_npz", "belongs to another save"),
        ("new_json_old_npz", "belongs to another save"),
        ("edited_json", "was edited"),
        ("garbage_json", "cannot be read"),
    ],
)
def test_json_copy_that_does_not_describe_the_npz_is_ignored_with_a_warning(tmp_path, how, reason):
    save_checkpoint(tmp_path / "ckpt", sample_arrays(0), sample_meta(1))
    old_json, old_npz = (tmp_path / "ckpt.json").read_bytes(), (tmp_path / "ckpt.npz").read_bytes()
    save_checkpoint(tmp_path / "ckpt", sample_arrays(1), sample_meta(2))
    expected = (sample_arrays(1), sample_meta(2))
    if how == "old_json_new_npz":
        (tmp_path / "ckpt.json").write_bytes(old_json)
    elif how == "new_json_old_npz":
        (tmp_path / "ckpt.npz").write_bytes(old_npz)
        expected = (sample_arrays(0), sample_meta(1))
    elif how == "edited_json":
        doc = json.loads((tmp_path / "ckpt.json").read_text(encoding="utf-8"))
        doc["meta"]["step"] = 99
        (tmp_path / "ckpt.json").write_text(json.dumps(doc), encoding="utf-8")
    else:
        (tmp_path / "ckpt.json").write_bytes(b"\xff garbage")
    with pytest.warns(UserWarning, match=r"ckpt\.json does not describe .*ckpt\.npz: it " + reason):
        arrays, meta = load_checkpoint(tmp_path / "ckpt")
    assert_same_arrays(arrays, expected[0])
    assert meta == expected[1]


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
    arrays, meta = load_quietly(tmp_path / "ckpt")
    assert_same_arrays(arrays, sample_arrays(0))
    assert meta == sample_meta(1)


@pytest.mark.parametrize("failing_call, expected", [(1, "old"), (2, "new")])
def test_failing_rename_leaves_no_temp_files_and_a_complete_checkpoint(tmp_path, monkeypatch, failing_call, expected):
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
    assert Path(calls[0]).name == "ckpt.npz"  # the npz is renamed first, the json copy last
    assert other_files(tmp_path) == []
    if expected == "old":
        arrays, meta = load_quietly(tmp_path / "ckpt")
        assert_same_arrays(arrays, sample_arrays(0))
        assert meta == sample_meta(1)
    else:  # the new npz is in place; only its readable copy is stale, and that is reported
        with pytest.warns(UserWarning, match="belongs to another save"):
            arrays, meta = load_checkpoint(tmp_path / "ckpt")
        assert_same_arrays(arrays, sample_arrays(1))
        assert meta == sample_meta(2)


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


# save_a_then_b(directory, k) saves A, then saves B counting every file-system step of that
# save: os.open, numpy's write_array (one per zip member), hashlib.sha256 (sealing the trailer),
# os.fsync, os.replace. With k > 0 the process SIGKILLs itself just before step k runs. The script
# first runs a whole save (k=0) to list the steps, then forks one child per step (forking, rather
# than starting a fresh interpreter per step, imports numpy only once and keeps the test quick).
SELF_KILL = """
    import hashlib, json, os, signal, sys
    import numpy as np

    HOOKED = [(os, "open"), (np.lib.format, "write_array"), (hashlib, "sha256"), (os, "fsync"), (os, "replace")]

    def save_a_then_b(directory, kill_at):
        save_checkpoint(directory + "/ckpt", {"w": np.full(1000, 1.0)}, {"tag": "A"})
        steps, originals = [], [(owner, attr, getattr(owner, attr)) for owner, attr in HOOKED]

        def hook(owner, attr, real):
            def hooked(*args, **kwargs):
                steps.append(attr + (" " + os.path.basename(os.fspath(args[1])) if attr == "replace" else ""))
                if len(steps) == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)
            setattr(owner, attr, hooked)

        for owner, attr, real in originals:
            hook(owner, attr, real)
        try:
            save_checkpoint(directory + "/ckpt", {"w": np.full(1000, 2.0), "v": np.ones(3)}, {"tag": "B"})
        finally:
            for owner, attr, real in originals:
                setattr(owner, attr, real)
        return steps

    base = sys.argv[1]
    os.mkdir(base + "/done")
    steps = save_a_then_b(base + "/done", 0)
    status = {}
    for k in range(1, len(steps) + 1):
        os.mkdir(f"{base}/kill{k}")
        pid = os.fork()
        if pid == 0:
            save_a_then_b(f"{base}/kill{k}", k)
            os._exit(0)  # not reached: the child kills itself at step k
        status[k] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(json.dumps({"steps": steps, "status": status}))
"""
SAVE_A = ({"w": np.full(1000, 1.0)}, {"tag": "A"})
SAVE_B = ({"w": np.full(1000, 2.0), "v": np.ones(3)}, {"tag": "B"})


def test_kill_at_every_step_of_a_save_leaves_a_or_b(tmp_path):
    proc = run_python(SELF_KILL, tmp_path, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    report = json.loads(out)
    steps = report["steps"]
    assert steps.count("replace ckpt.npz") == steps.count("replace ckpt.json") == 1, steps
    npz_rename = steps.index("replace ckpt.npz") + 1  # step numbers count from 1
    json_rename = steps.index("replace ckpt.json") + 1
    assert npz_rename < json_rename and {"write_array", "sha256", "fsync"} <= set(steps), steps
    arrays, meta = load_quietly(tmp_path / "done" / "ckpt")
    assert meta == SAVE_B[1]
    assert_same_arrays(arrays, SAVE_B[0])

    assert report["status"] == {str(k): -signal.SIGKILL for k in range(1, len(steps) + 1)}
    for k in range(1, len(steps) + 1):
        directory = tmp_path / f"kill{k}"
        expected = SAVE_B if k > npz_rename else SAVE_A  # killed just before step k ran
        if npz_rename < k <= json_rename:  # new npz, old json copy: B, and the stale copy is reported
            with pytest.warns(UserWarning, match="belongs to another save"):
                arrays, meta = load_checkpoint(directory / "ckpt")
        else:
            arrays, meta = load_quietly(directory / "ckpt")
        assert meta == expected[1], (k, steps[k - 1])
        assert_same_arrays(arrays, expected[0])
        # stray temp files (if any) are ignored, and the next save works next to them
        assert all(name.endswith(".tmp") for name in other_files(directory))
        save_checkpoint(directory / "ckpt", {"w": np.zeros(2)}, {"tag": "C"})
        assert load_quietly(directory / "ckpt")[1] == {"tag": "C"}


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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arrays, meta = load_checkpoint(Path(directory) / "ckpt")  # must not raise
    if meta == {"tag": "A"}:
        assert caught == []
        assert_same_arrays(arrays, {"w": np.arange(10.0)})
    else:
        assert meta == {"tag": "B"}
        assert all("belongs to another save" in str(w.message) for w in caught)  # killed between renames
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


def test_checkpoint_files_get_the_mode_open_would(tmp_path):
    """Checkpoints and text outputs share one temp-file writer (checkpoint._write_temp):
    0o666 less the umask, as open(path, "w") would give, and no temporary file left."""
    old = os.umask(0o027)
    try:
        npz, js = save_checkpoint(tmp_path / "ckpt", {"w": np.arange(3.0)}, {"n": 1})
    finally:
        os.umask(old)
    for path in (npz, js):
        assert os.stat(path).st_mode & 0o777 == 0o640, path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.json", "ckpt.npz"]
