"""Property (issue 66): a Hugging Face GPT-2 folder edited at random, in its config.json (types,
huge and negative numbers, nesting), its shard index or its safetensors headers (forged shapes,
dtypes, offsets and lengths), either loads with finite weights or ends in one ValueError that
names a file of the folder; never another exception, never more than 5 s or 1 GiB.

Each load runs in a forked child whose address space is capped at what it already maps plus
1 GiB (RLIMIT_AS), so a loader that tried to allocate what a file claims would fail the test
with a MemoryError instead of taking the machine's memory; a child still running after 5 s is
killed and fails the test."""
import json
import os
import resource
import select
import shutil
import signal
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npformer as nf
from test_hf_bad_input import make_folder

pytest.importorskip("tokenizers", reason="extra hf: pip install 'npformer[hf]'")
pytest.importorskip("safetensors", reason="extra hf: pip install 'npformer[hf]'")

SECONDS, MEMORY = 5.0, 1 << 30


def run_bounded(fn, seconds=SECONDS, memory=MEMORY):
    """``fn()`` in a forked child under RLIMIT_AS (what it maps now + ``memory``):
    ("ok", value) or (exception type name, message); ("timeout", ...) past ``seconds``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                          # the child
        try:
            os.close(r)
            mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (mapped + memory, hard))
            try:
                result = ["ok", fn()]
            except BaseException as e:                    # noqa: B036 (reported, not kept)
                result = [type(e).__name__, str(e)]
            with os.fdopen(w, "w") as f:
                json.dump(result, f)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        ready, _, _ = select.select([f], [], [], seconds)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return ["timeout", f"still running after {seconds} s"]
        text = f.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else ["died", "the child wrote nothing"]


def load(path):
    model = nf.GPT.from_pretrained(path)
    return bool(np.isfinite(model.flat_params).all())


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-property")
    make_folder(root / "single")
    make_folder(root / "sharded", shards=True)
    return root


# -- the edits ------------------------------------------------------------------------------------
CONFIG_KEYS = ["n_layer", "n_embd", "n_head", "n_positions", "vocab_size", "n_inner",
               "eos_token_id", "layer_norm_epsilon", "tie_word_embeddings", "model_type",
               "activation_function", "attn_pdrop", "resid_pdrop", "embd_pdrop",
               "add_cross_attention", "scale_attn_weights"]
NUMBERS = st.sampled_from([0, -1, 1, 2, 3, 7, 8, 16, 17, 10**6, 10**9, 2**31, 2**63, 10**30,
                           -10**9, 0.5, 1e-300, 1e300, float("nan"), float("inf")])
LEAVES = NUMBERS | st.none() | st.booleans() | st.text(max_size=4) | st.integers(-2**70, 2**70) \
    | st.floats()
VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)
DEPTH = st.integers(1, 150_000)

config_edits = st.one_of(
    st.tuples(st.just("config value"), st.sampled_from(CONFIG_KEYS), VALUES),
    st.tuples(st.just("config value"), st.sampled_from(CONFIG_KEYS), NUMBERS),
    st.tuples(st.just("config removed"), st.sampled_from(CONFIG_KEYS), st.none()),
    st.tuples(st.just("config nested"), st.sampled_from(CONFIG_KEYS + [None]), DEPTH),
    st.tuples(st.just("config whole"), VALUES, st.none()),
    st.tuples(st.just("config bytes"), st.binary(max_size=40), st.integers(0, 400)),
)
SHARD_NAMES = st.sampled_from(["../x.safetensors", "/etc/passwd", "", ".", "model.safetensors",
                               "config.json", "model-00003-of-00002.safetensors", "a\x00b",
                               "sub/../../x", "./model-00001-of-00002.safetensors"])
index_edits = st.one_of(
    st.tuples(st.just("index map"), VALUES, st.none()),
    st.tuples(st.just("index entry"), st.integers(0, 100), VALUES | SHARD_NAMES),
    st.tuples(st.just("index whole"), VALUES, st.none()),
    st.tuples(st.just("index nested"), DEPTH, st.none()),
)
SHAPES = st.lists(st.integers(-5, 2**64) | st.sampled_from([0, 1, 8, 32, 2**31, 2**62]),
                  max_size=4) | VALUES
DTYPES = st.sampled_from(["F32", "F16", "BF16", "F64", "I64", "I8", "U8", "BOOL", "F8_E4M3",
                          "XX", ""]) | VALUES
OFFSETS = st.lists(st.integers(-2, 2**64) | st.sampled_from([0, 32, 4096]), max_size=3) | VALUES
header_edits = st.one_of(
    st.tuples(st.just("header shape"), st.integers(0, 100), SHAPES),
    st.tuples(st.just("header dtype"), st.integers(0, 100), DTYPES),
    st.tuples(st.just("header offsets"), st.integers(0, 100), OFFSETS),
    st.tuples(st.just("header entry"), st.sampled_from(["h.1.ln_1.weight", "h.99999999.x",
                                                        "transformer.wte.weight", "lm_head.weight",
                                                        "__metadata__"]), VALUES),
    st.tuples(st.just("header length"), st.integers(0, 2**64 - 1), st.none()),
    st.tuples(st.just("header truncated"), st.integers(0, 4000), st.none()),
)


def nested(depth):
    return "[" * depth + "]" * depth


def apply(path, edit):
    kind, a, b = edit
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    if kind == "config value":
        config[a] = b
        config_file.write_text(json.dumps(config))
    elif kind == "config removed":
        config.pop(a, None)
        config_file.write_text(json.dumps(config))
    elif kind == "config nested":
        if a is None:
            config_file.write_text(nested(b))
        else:
            config_file.write_text(json.dumps({**config, a: 0}).replace(f'"{a}": 0',
                                                                        f'"{a}": {nested(b)}'))
    elif kind == "config whole":
        config_file.write_text(json.dumps(a))
    elif kind == "config bytes":
        text = config_file.read_bytes()
        config_file.write_bytes(text[:b] + a + text[b + len(a):])
    elif kind.startswith("index"):
        index_file = path / "model.safetensors.index.json"
        index = json.loads(index_file.read_text())
        names = sorted(index["weight_map"])
        if kind == "index map":
            index["weight_map"] = a
        elif kind == "index entry":
            index["weight_map"][names[a % len(names)]] = b
        elif kind == "index whole":
            index = a
        if kind == "index nested":
            index_file.write_text('{"weight_map": ' + nested(a) + "}")
        else:
            index_file.write_text(json.dumps(index))
    else:
        forge_header(path / "model.safetensors", kind, a, b)


def forge_header(file, kind, a, b):
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    names = sorted(k for k in header if k != "__metadata__")
    if kind == "header length":
        file.write_bytes(struct.pack("<Q", a) + raw[8:])
        return
    if kind == "header truncated":
        file.write_bytes(raw[:min(a, len(raw) - 1)])
        return
    if kind == "header entry":
        header[a] = b
    else:
        field = {"header shape": "shape", "header dtype": "dtype",
                 "header offsets": "data_offsets"}[kind]
        header[names[a % len(names)]][field] = b
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    file.write_bytes(struct.pack("<Q", len(text)) + text + data)


@settings(max_examples=70, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edit=st.one_of(config_edits, index_edits, header_edits))
def test_an_edited_folder_loads_or_is_refused_naming_its_file(originals, tmp_path, edit):
    source = originals / ("sharded" if edit[0].startswith("index") else "single")
    loads_or_is_refused(source, tmp_path / "folder", edit, load)


def loads_or_is_refused(source, path, edit, load):
    """The folder ``source`` copied to ``path`` and ``edit``ed there (an edit JSON cannot write
    is passed over), then ``load(path)`` in a bounded child: it gives True (finite weights) or
    is refused by a one-line ValueError naming the folder."""
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(source, path)
    try:
        apply(path, edit)
    except (ValueError, TypeError):                 # an edit json cannot write (a NaN key...)
        return
    outcome, message = run_bounded(lambda: load(path))
    if outcome == "ok":
        assert message is True, "loaded weights that are not finite"
        return
    assert outcome == "ValueError", (edit, outcome, message)
    assert str(path) in message and "\n" not in message, (edit, message)
