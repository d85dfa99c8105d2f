"""Loading a model checkpoint: a config is checked against the stored arrays before any model is
built, weights and optimizer state must be finite and of the recorded dtype, and whatever is
done to the file, the loader either succeeds or raises a CheckpointError naming it."""
import hashlib
import io
import json
import re
import shutil
import tempfile
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from npformer.data.vocab import Vocab, Vocabularies
from npformer.training.checkpointing import (POSITION_TABLE_CEILING, load_model_checkpoint,
                                             restore_training_state, save_model_checkpoint)

SRC = Vocab(list(Vocab.SPECIALS) + ["ein", "mann"])
TGT = Vocab(list(Vocab.SPECIALS) + ["a", "man", "."])
TRAILER = b"npformer-sha256:"


def tiny(seed=0):
    return nf.Transformer(len(SRC), len(TGT), d_model=8, n_heads=2, d_ff=8, n_encoder_layers=1,
                          n_decoder_layers=1, max_len=8, seed=seed)


def save_training_checkpoint(path):
    """A checkpoint of a tiny model after one AdamW step (non-zero moments), with RNG and counters."""
    model = tiny()
    optimizer = nf.AdamW(model, lr=1e-2)
    src, tgt = np.array([[4, 5, 2]]), np.array([[1, 4, 5]])
    logits = model.forward(src, tgt)
    _, d = nf.cross_entropy(logits, np.array([[4, 5, 2]]))
    model.backward(d)
    optimizer.step()
    save_model_checkpoint(path, model, Vocabularies(SRC, TGT), optimizer=optimizer, training={"step": 1})
    return model


def resave(path, arrays=None, meta=None):
    """Rewrite the checkpoint at ``path`` through save_checkpoint, so the tampering below carries
    a valid sha256 trailer and a consistent index: only the loader's own checks can catch it."""
    old_arrays, old_meta = load_checkpoint(path)
    save_checkpoint(path, {**old_arrays, **(arrays or {})} if not callable(arrays) else arrays(old_arrays),
                    meta(old_meta) if callable(meta) else (meta or old_meta))


def with_config(**changes):
    return lambda meta: {**meta, "config": {**meta["config"], **changes}}


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "ckpt"
    save_training_checkpoint(path)
    return path


def refusal(path, load=load_model_checkpoint):
    """The CheckpointError message of ``load(path)``; it must name the file."""
    with pytest.raises(CheckpointError) as err:
        load(path)
    message = str(err.value)
    assert str(path) in message, message
    return message


# -- a config that claims huge sizes ---------------------------------------------------------


@pytest.mark.parametrize("changes, expected", [
    (dict(max_len=10**12), r"max_len=1000000000000 needs a 32000000000000-byte position table"),
    (dict(d_model=10**6), r"model/src_embed.weight: the config implies shape \(6, 1000000\), the file stores \(6, 8\)"),
    (dict(src_vocab_size=10**9), r"model/src_embed.weight: the config implies shape \(1000000000, 8\)"),
    (dict(d_ff=10**7), r"model/encoder.layers.0.ffn.linear1.weight: the config implies shape \(10000000, 8\)"),
    (dict(n_encoder_layers=10**6), r"the config claims 1000001 layers but the file stores only 38 model arrays"),
    (dict(n_encoder_layers=2), r"missing \['model/encoder.layers.1.self_attn.in_proj_weight'"),
    (dict(n_decoder_layers=0), r"n_decoder_layers: expected a positive integer, got 0"),
    (dict(tie_embeddings=True), r"unexpected \['model/generator.weight'\]"),
    (dict(dtype="float64"), r"array 'model/src_embed.weight' is float32; expected float64"),
    (dict(d_modell=8), r"cannot build the model from its config \(.*d_modell"),
    (dict(arch=[]), r"holds a model of architecture \[\], written by"),   # JSON, not a name
])
def test_config_is_checked_against_the_stored_weights_before_building(ckpt, changes, expected):
    """The old loader built Transformer(**config) first: 238 GiB for max_len 1e9 -> MemoryError."""
    resave(ckpt, meta=with_config(**changes))
    tracemalloc.start()
    try:
        message = refusal(ckpt)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert re.search(expected, message), message
    assert peak < 16 * 2**20, f"refusing the checkpoint allocated {peak} bytes"


def test_position_table_is_bounded_by_the_stated_ceiling(ckpt):
    rows = POSITION_TABLE_CEILING // (8 * 4)             # d_model 8, float32: exactly the ceiling
    resave(ckpt, meta=with_config(max_len=rows + 1))
    message = refusal(ckpt)
    assert f"a checkpoint may claim at most {POSITION_TABLE_CEILING} bytes" in message
    assert "the larger of 67108864 bytes and its stored weights' bytes" in message


def test_missing_extra_and_misshaped_weights_are_all_named(ckpt):
    def edit(arrays):
        arrays = dict(arrays)
        del arrays["model/generator.bias"]
        arrays["model/extra.weight"] = np.zeros(3, np.float32)
        arrays["model/encoder.norm.weight"] = np.zeros(5, np.float32)
        return arrays
    resave(ckpt, arrays=edit)
    message = refusal(ckpt)
    assert "missing ['model/generator.bias']" in message
    assert "unexpected ['model/extra.weight']" in message
    assert "model/encoder.norm.weight: the config implies shape (8,), the file stores (5,)" in message


# -- non-finite or wrongly typed weights and optimizer state ------------------------------


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weight_is_refused(ckpt, value):
    arrays, _ = load_checkpoint(ckpt)
    w = arrays["model/decoder.layers.0.ffn.linear2.weight"].copy()
    w[1, 2] = value
    resave(ckpt, arrays={"model/decoder.layers.0.ffn.linear2.weight": w})
    message = refusal(ckpt)
    assert ("array 'model/decoder.layers.0.ffn.linear2.weight' holds 1 non-finite value(s) "
            "(NaN or inf); refusing to load it") in message


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.complex64, np.float64])
def test_weight_of_another_dtype_is_refused(ckpt, dtype):
    """These used to be cast to the model's float32 without a word."""
    arrays, _ = load_checkpoint(ckpt)
    resave(ckpt, arrays={"model/generator.bias": arrays["model/generator.bias"].astype(dtype)})
    message = refusal(ckpt)
    assert f"array 'model/generator.bias' is {np.dtype(dtype)}; expected float32" in message


def test_the_library_still_casts_on_purpose():
    """Only checkpoint loading is strict: load_state_dict casts float32 into a float64 model."""
    model64 = nf.Transformer(len(SRC), len(TGT), d_model=8, n_heads=2, d_ff=8, n_encoder_layers=1,
                             n_decoder_layers=1, max_len=8, dtype=np.float64)
    state = tiny().state_dict()
    model64.load_state_dict(state)
    np.testing.assert_array_equal(model64.state_dict()["generator.bias"], state["generator.bias"])


def restore(path):
    loaded = load_model_checkpoint(path)
    model = tiny(seed=5)
    optimizer = nf.AdamW(model, lr=1e-2)
    before = (model.flat_params.copy(), optimizer.exp_avg.copy(), model.rng.bit_generator.state)
    try:
        return restore_training_state(loaded, model, optimizer)
    except CheckpointError:
        # a refused restore leaves the live run as it was
        np.testing.assert_array_equal(model.flat_params, before[0])
        np.testing.assert_array_equal(optimizer.exp_avg, before[1])
        assert model.rng.bit_generator.state == before[2]
        raise


def test_restore_round_trip(ckpt):
    saved = load_model_checkpoint(ckpt)
    assert restore(ckpt) == {"step": 1}
    assert saved.arrays["optim/exp_avg"].any()


@pytest.mark.parametrize("key, edit, expected", [
    ("optim/exp_avg", lambda a: np.where(np.arange(a.size) == 3, np.nan, a).astype(a.dtype),
     "array 'optim/exp_avg' holds 1 non-finite value(s)"),
    ("optim/exp_avg_sq", lambda a: np.full_like(a, np.inf), f"array 'optim/exp_avg_sq' holds"),
    ("optim/exp_avg_sq", lambda a: -a - 1, "array 'optim/exp_avg_sq' holds negative values"),
    ("optim/exp_avg", lambda a: a.astype(np.float64), "array 'optim/exp_avg' is float64; expected float32"),
    ("optim/step_count", lambda a: np.asarray(-1, np.int64), "optimizer state does not fit (optimizer state_dict: entry 'step_count' expected a non-negative integer scalar"),
    ("optim/step_count", lambda a: np.asarray(1.5), "entry 'step_count' expected a non-negative integer scalar, got float64"),
    ("optim/step_count", lambda a: np.asarray([1, 2], np.int64), "entry 'step_count' expected a non-negative integer scalar, got int64 (2,)"),
    ("rng/model/str/bit_generator", lambda a: np.frombuffer(b"Nonsense", np.uint8),
     "bad dropout RNG state"),
])
def test_bad_optimizer_or_rng_state_is_refused_by_restore(ckpt, key, edit, expected):
    arrays, _ = load_checkpoint(ckpt)
    resave(ckpt, arrays={key: edit(arrays[key])})
    load_model_checkpoint(ckpt)                        # inference needs none of it
    message = refusal(ckpt, restore)
    assert expected in message, message


# -- whatever is done to the file ---------------------------------------------------------

_BASE = {}


def base_checkpoint():
    """Bytes of a valid training checkpoint (built once)."""
    if not _BASE:
        with tempfile.TemporaryDirectory() as d:
            save_training_checkpoint(Path(d) / "ckpt")
            _BASE["npz"] = (Path(d) / "ckpt.npz").read_bytes()
            _BASE["arrays"], _BASE["meta"] = load_checkpoint(Path(d) / "ckpt")
    return _BASE


def reseal(data):
    body = data[:-64]
    return body + hashlib.sha256(body).hexdigest().encode()


def zip_members(data):
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(info.filename, zf.read(info)) for info in zf.infolist()]


def zip_bytes(members, deflate=()):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, raw in members:
            zf.writestr(name, raw, zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED)
        zf.comment = TRAILER + b"0" * 64
    return reseal(buf.getvalue())


def npy_header(descr, shape):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


odd_values = st.sampled_from([-1, 0, 1, 2, 3, 7, 10**9, 10**12, 2.5, float("nan"), True, None,
                              "x", "float64", "float16", [], {}])
odd_dtypes = st.sampled_from([np.int32, np.int64, np.float16, np.float64, np.complex64, np.uint8,
                              np.bool_, "U3"])
odd_shapes = st.lists(st.sampled_from([0, 1, 2, 3, 8, 2**31, 2**40]), max_size=3).map(tuple)


@st.composite
def tamperings(draw):
    """A function from the base checkpoint's bytes to tampered bytes, and a description."""
    base = base_checkpoint()
    names = sorted(base["arrays"])
    kind = draw(st.sampled_from(["truncate", "flip", "members", "resave"]))
    if kind == "truncate":
        cut = draw(st.integers(0, len(base["npz"]) - 1))
        return f"truncate at {cut}", lambda data: data[:cut]
    if kind == "flip":
        spots = draw(st.lists(st.tuples(st.integers(0, len(base["npz"]) - 1), st.integers(1, 255)),
                              min_size=1, max_size=4))
        sealed = draw(st.booleans())

        def flip(data):
            data = bytearray(data)
            for at, xor in spots:
                data[at] ^= xor
            return reseal(bytes(data)) if sealed else bytes(data)
        return f"flip {spots} resealed={sealed}", flip
    if kind == "members":
        target = draw(st.sampled_from(names + ["__meta__.json"])) + ".npy"
        action = draw(st.sampled_from(["remove", "add", "rename", "header", "compress", "garbage"]))
        header = (draw(st.sampled_from(["<f4", "<f8", "<i8", "|u1", "|O", "<U2"])), draw(odd_shapes))
        body = draw(st.binary(max_size=64))

        def edit(data):
            members = zip_members(data)
            deflate = ()
            if action == "remove":
                members = [m for m in members if m[0] != target]
            elif action == "add":
                members.append(("model/extra.npy", npy_header(*header) + body))
            elif action == "rename":
                members = [(n + "x" if n == target else n, raw) for n, raw in members]
            elif action == "header":
                members = [(n, npy_header(*header) + body if n == target else raw) for n, raw in members]
            elif action == "compress":
                deflate = (target,)
            else:
                members = [(n, body if n == target else raw) for n, raw in members]
            return zip_bytes(members, deflate)
        return f"{action} {target} {header}", edit
    # resave: a valid file (sha256, CRC, index all consistent) with edited arrays or metadata
    action = draw(st.sampled_from(["value", "dtype", "shape", "remove", "add", "config", "meta"]))
    target = draw(st.sampled_from(names))
    value = draw(st.sampled_from([np.nan, np.inf, -np.inf, -1.0, 0.0, 1e30]))
    dtype, shape, odd = draw(odd_dtypes), draw(odd_shapes), draw(odd_values)
    shape = tuple(min(n, 3) for n in shape)                   # real arrays: keep them small
    key = draw(st.sampled_from(["src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff",
                                "n_encoder_layers", "n_decoder_layers", "dropout", "max_len",
                                "pad_id", "norm_first", "activation", "layer_norm_eps", "qk_dim",
                                "tie_embeddings", "dtype", "seed", "arch", "bogus"]))
    meta_key = draw(st.sampled_from(["kind", "vocabularies", "config", "training",
                                     "npformer_version"]))

    def edit(_):
        arrays, meta = dict(base["arrays"]), json.loads(json.dumps(base["meta"]))
        a = arrays[target]
        if action == "value" and a.size and a.dtype.kind == "f":      # weights, moments
            a = a.copy()
            a.reshape(-1)[0] = value
        elif action == "dtype":
            with np.errstate(all="ignore"):                       # overflowing casts are fine
                a = a.astype(dtype) if a.dtype.kind in "fiub" else a
        elif action == "shape":
            a = np.zeros(shape, a.dtype)
        elif action == "remove":
            del arrays[target]
        elif action == "add":
            arrays[target + ".extra"] = a
        elif action == "config":
            meta["config"][key] = odd
        else:
            meta[meta_key] = odd
        if action not in ("remove", "add"):
            arrays[target] = a
        with tempfile.TemporaryDirectory() as d:
            save_checkpoint(Path(d) / "c", arrays, meta)
            return (Path(d) / "c.npz").read_bytes()
    return f"resave {action} {target} {dtype} {shape} {key}={odd!r} {meta_key}", edit


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tampering=tamperings())
def test_tampered_checkpoint_loads_cleanly_or_is_refused_naming_the_file(tampering):
    """Never another exception type, never a MemoryError, never non-finite or recast weights."""
    description, tamper = tampering
    d = tempfile.mkdtemp()
    try:
        path = Path(d) / "ckpt"
        (Path(d) / "ckpt.npz").write_bytes(tamper(base_checkpoint()["npz"]))
        try:
            loaded = load_model_checkpoint(path)
        except CheckpointError as e:
            assert str(path) in str(e), (description, str(e))
            return
        dtype = np.dtype(loaded.model.config.dtype)
        for name, p in loaded.model.named_parameters():
            assert p.data.dtype == dtype and np.isfinite(p.data).all(), (description, name)
        try:
            restore(path)
        except CheckpointError as e:
            assert str(path) in str(e), (description, str(e))
    finally:
        shutil.rmtree(d)
