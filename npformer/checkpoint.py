"""Checkpoint files: atomic, pickle-free, verified on load.

A checkpoint is two files side by side::

    run/ckpt.npz    every array (model weights, optimizer moments, RNG state), one .npy per name
    run/ckpt.json   format version, sha256 + size of the npz, an index of the arrays, your metadata

``save_checkpoint("run/ckpt", arrays, meta)`` writes them and ``load_checkpoint("run/ckpt")``
reads them back (``"run/ckpt.npz"`` or ``"run/ckpt.json"`` name the same checkpoint).

Why temp file + fsync + rename?
    Writing straight over ``ckpt.npz`` destroys the old checkpoint the moment the file is
    opened; if the process is killed (OOM killer, Ctrl-C, a pre-empted cloud machine) half way
    through, you are left with neither the old nor the new one. Instead each file is written to
    a temporary file in the *same directory*, flushed and ``os.fsync``-ed (so its bytes are on
    disk, not just in the OS page cache), and only then ``os.replace``-d over the real name.
    A rename inside one file system is atomic: anyone opening ``ckpt.npz`` sees either the
    complete old file or the complete new one, never a mix. Finally the directory itself is
    fsync-ed, so the rename (a change to the directory) survives a power cut too.

Why a digest in the JSON?
    Two files cannot be renamed in one atomic step. The npz is renamed first and the JSON last,
    and the JSON records the sha256 of the npz it belongs to. If a save dies between the two
    renames, the stale JSON no longer matches the new npz and loading fails with a clear
    ``CheckpointError`` instead of silently pairing old metadata with new weights. The same
    check catches a truncated or bit-flipped npz and files copied from two different runs.
    Temporary files left behind by a killed process are named ``.ckpt.npz.<random>.tmp``; the
    loader only ever opens the two real names, so they are never mistaken for the checkpoint.

Why no pickle?
    ``pickle`` (used by ``torch.save`` and by ``np.load(..., allow_pickle=True)`` for object
    arrays) can run arbitrary code while loading, so opening a checkpoint someone sent you is
    like running their program. Here arrays are plain ``.npy`` data read with
    ``allow_pickle=False`` (object arrays are refused), metadata is plain JSON, and the RNG state
    is stored as integer arrays (see ``rng_state_to_arrays``). The npz is a standard, uncompressed
    npz: ``np.load("run/ckpt.npz")`` opens it too.

One writer per checkpoint path: two processes saving to the same path at once, or loading
while a save is renaming, can produce a mismatched pair (which the digest check reports).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CheckpointError",
    "FORMAT_VERSION",
    "checkpoint_paths",
    "save_checkpoint",
    "load_checkpoint",
    "rng_state_to_arrays",
    "rng_from_arrays",
]

FORMAT_NAME = "npformer-checkpoint"
FORMAT_VERSION = 1
_CHUNK = 1 << 20  # bytes read at a time when hashing
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed timestamp: same arrays -> same npz bytes -> same digest


class CheckpointError(ValueError):
    """A checkpoint (or an argument describing one) is missing, corrupt or inconsistent."""


# ----------------------------------------------------------------------------------------------
# paths
# ----------------------------------------------------------------------------------------------


def checkpoint_paths(path) -> tuple[Path, Path]:
    """Return ``(npz_path, json_path)`` for ``"x"``, ``"x.npz"`` or ``"x.json"``."""
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(
            f"path: expected a str or os.PathLike like 'run/ckpt', got {type(path).__name__}"
        )
    text = os.fspath(path)
    if not isinstance(text, str):
        raise CheckpointError(f"path: expected a text path, got {type(text).__name__} {text!r}")
    if text == "" or text.endswith(("/", os.sep)):
        raise CheckpointError(
            f"path: expected a file path like 'run/ckpt' (no trailing separator), got {text!r}"
        )
    for suffix in (".npz", ".json"):
        if text.endswith(suffix) and len(text) > len(suffix):
            text = text[: -len(suffix)]
            break
    return Path(text + ".npz"), Path(text + ".json")


# ----------------------------------------------------------------------------------------------
# save
# ----------------------------------------------------------------------------------------------


def save_checkpoint(path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> tuple[Path, Path]:
    """Atomically write ``arrays`` to ``<path>.npz`` and ``meta`` to ``<path>.json``.

    ``arrays`` is a flat ``{name: ndarray}`` dict; names may contain dots and slashes
    (``"model/encoder.layers.0.linear1.weight"``). ``meta`` must be JSON-serialisable with
    ``str`` keys (tuples come back as lists). Missing parent directories are created.
    Returns ``(npz_path, json_path)``.
    """
    npz_path, json_path = checkpoint_paths(path)
    _check_arrays(arrays)
    if not isinstance(meta, Mapping):
        raise CheckpointError(f"meta: expected a mapping (dict), got {type(meta).__name__}")
    plain_meta = _plain_json(meta, "meta", set())
    index = {name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in arrays.items()}

    npz_path.parent.mkdir(parents=True, exist_ok=True)
    temps: list[Path] = []  # temporary files not yet renamed into place
    try:
        npz_tmp = _write_temp(npz_path, lambda f: _write_npz(f, arrays), temps)
        digest, nbytes = _sha256_of(npz_tmp)
        doc = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "npz_sha256": digest,
            "npz_bytes": nbytes,
            "arrays": index,
            "meta": plain_meta,
        }
        text = _format_json(doc)
        json_tmp = _write_temp(json_path, lambda f: f.write(text.encode("utf-8")), temps)
        # npz first, JSON last: between the two renames the old JSON's digest does not match the
        # new npz, so a crash there gives a CheckpointError on load, never a mixed checkpoint.
        os.replace(npz_tmp, npz_path)
        temps.remove(npz_tmp)
        os.replace(json_tmp, json_path)
        temps.remove(json_tmp)
        _fsync_dir(npz_path.parent)
    finally:
        for tmp in temps:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
    return npz_path, json_path


def _check_arrays(arrays) -> None:
    if not isinstance(arrays, Mapping):
        raise CheckpointError(f"arrays: expected a mapping {{name: ndarray}}, got {type(arrays).__name__}")
    for name, value in arrays.items():
        if not isinstance(name, str) or name == "":
            raise CheckpointError(f"arrays: expected non-empty str names, got {name!r}")
        if "\x00" in name or "\\" in name:
            raise CheckpointError(f"arrays: name {name!r} contains a NUL byte or a backslash")
        _check_utf8(name, f"arrays: name {name!r}")
        if not isinstance(value, np.ndarray) or isinstance(value, np.ma.MaskedArray):
            raise CheckpointError(
                f"arrays[{name!r}]: expected a numpy.ndarray (wrap scalars with np.asarray), "
                f"got {type(value).__name__}"
            )
        if value.dtype.hasobject:
            raise CheckpointError(
                f"arrays[{name!r}]: dtype {value.dtype} holds Python objects, which only pickle "
                f"can store; convert it to a numeric or fixed-width string dtype"
            )


def _check_utf8(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates such as "\ud800"
        raise CheckpointError(f"{where}: text is not encodable as UTF-8 ({exc})") from None


def _plain_json(value, where: str, active: set[int]):
    """Return ``value`` as plain dicts/lists, refusing what ``json`` would reject or silently
    change (non-str keys, numpy scalars, sets, circular references)."""
    if isinstance(value, str):
        _check_utf8(value, where)
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (Mapping, list, tuple)):
        if id(value) in active:
            raise CheckpointError(f"{where}: circular reference")
        active.add(id(value))
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise CheckpointError(
                        f"{where}: expected str keys (JSON turns {type(key).__name__} keys into "
                        f"strings), got key {key!r}"
                    )
                _check_utf8(key, f"{where} key")
                out[key] = _plain_json(item, f"{where}[{key!r}]", active)
        else:
            out = [_plain_json(item, f"{where}[{i}]", active) for i, item in enumerate(value)]
        active.discard(id(value))
        return out
    raise CheckpointError(
        f"{where}: expected a JSON value (None, bool, int, float, str, list, dict), got "
        f"{type(value).__name__} {value!r:.60}"
    )


def _format_json(doc: dict) -> str:
    """``json.dumps`` with one line per top-level key and per array, ``meta`` indented."""
    def dump(value, indent=None) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    lines = [f" {dump(k)}: {dump(v)}," for k, v in doc.items() if k not in ("arrays", "meta")]
    entries = [f"  {dump(name)}: {dump(entry)}" for name, entry in doc["arrays"].items()]
    lines.append(' "arrays": {' + ("\n" + ",\n".join(entries) + "\n }" if entries else "}") + ",")
    lines.append(' "meta": ' + dump(doc["meta"], indent=1).replace("\n", "\n "))
    return "{\n" + "\n".join(lines) + "\n}\n"


def _write_npz(f, arrays: Mapping[str, np.ndarray]) -> None:
    """Write a standard uncompressed npz: one ``<name>.npy`` member per array."""
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            with zf.open(info, mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, value, allow_pickle=False)


def _write_temp(final: Path, write, temps: list[Path]) -> Path:
    """Create a fresh temp file next to ``final``, fill it with ``write(f)``, flush and fsync it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(16):
        tmp = final.with_name(f".{final.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        break
    else:  # pragma: no cover - 16 collisions of 64 random bits
        raise FileExistsError(f"could not create a temporary file next to {final}")
    temps.append(tmp)
    with os.fdopen(fd, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _fsync_dir(directory: Path) -> None:
    """Make renames in ``directory`` durable (POSIX only; Windows cannot open directories)."""
    if os.name == "nt":  # pragma: no cover
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_of(path_or_file) -> tuple[str, int]:
    """Return ``(hex sha256, size in bytes)`` of a path or of an open binary file (from its start)."""
    if isinstance(path_or_file, (str, os.PathLike)):
        with open(path_or_file, "rb") as f:
            return _sha256_of(f)
    h, n = hashlib.sha256(), 0
    path_or_file.seek(0)
    while chunk := path_or_file.read(_CHUNK):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


# ----------------------------------------------------------------------------------------------
# load
# ----------------------------------------------------------------------------------------------


def load_checkpoint(path) -> tuple[dict[str, np.ndarray], dict]:
    """Read ``(arrays, meta)`` saved by ``save_checkpoint``; raise ``CheckpointError`` if anything is off."""
    npz_path, json_path = checkpoint_paths(path)
    if not npz_path.exists() and not json_path.exists():
        raise CheckpointError(f"no checkpoint at {npz_path.with_suffix('')}: neither {npz_path} nor {json_path} exists")
    if not json_path.exists():
        raise CheckpointError(f"checkpoint metadata {json_path} is missing (its npz {npz_path} exists)")
    if not npz_path.exists():
        raise CheckpointError(f"checkpoint arrays {npz_path} are missing (its metadata {json_path} exists)")
    doc = _read_json(json_path)
    arrays = _read_npz(npz_path, json_path, doc)
    return arrays, doc["meta"]


def _read_json(json_path: Path) -> dict:
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint metadata {json_path}: {what}")

    try:
        doc = json.loads(json_path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise bad("file is missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"corrupt JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise bad(f"expected an object with format {FORMAT_NAME!r}, got {got!r}")
    version = doc.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise bad(f"expected format_version {FORMAT_VERSION}, got {version!r}")
    digest = doc.get("npz_sha256")
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        raise bad(f"expected npz_sha256 to be 64 lowercase hex digits, got {digest!r:.80}")
    if type(doc.get("npz_bytes")) is not int or doc["npz_bytes"] < 0:
        raise bad(f"expected npz_bytes to be a non-negative int, got {doc.get('npz_bytes')!r}")
    index = doc.get("arrays")
    if not isinstance(index, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("dtype"), str) and isinstance(v.get("shape"), list)
        for v in index.values()
    ):
        raise bad("expected 'arrays' to map names to {'dtype': str, 'shape': list}")
    if not isinstance(doc.get("meta"), dict):
        raise bad(f"expected 'meta' to be an object, got {type(doc.get('meta')).__name__}")
    return doc


def _read_npz(npz_path: Path, json_path: Path, doc: dict) -> dict[str, np.ndarray]:
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint arrays {npz_path}: {what}")

    try:
        f = open(npz_path, "rb")
    except FileNotFoundError:
        raise bad("file is missing") from None
    with f:  # one open file for hashing and reading: a concurrent rename cannot swap it under us
        digest, nbytes = _sha256_of(f)
        if digest != doc["npz_sha256"] or nbytes != doc["npz_bytes"]:
            raise bad(
                f"does not match {json_path} (npz: {nbytes} bytes, sha256 {digest[:16]}...; "
                f"json records {doc['npz_bytes']} bytes, sha256 {doc['npz_sha256'][:16]}...). "
                f"The npz is truncated/corrupted, or the two files come from different saves "
                f"(e.g. a save killed between its two renames)"
            )
        f.seek(0)
        arrays: dict[str, np.ndarray] = {}
        try:
            with zipfile.ZipFile(f) as zf:
                for info in zf.infolist():
                    if not info.filename.endswith(".npy"):
                        raise bad(f"unexpected member {info.filename!r} (expected <name>.npy)")
                    name = info.filename[: -len(".npy")]
                    if name in arrays:
                        raise bad(f"duplicate member {info.filename!r}")
                    with zf.open(info) as member:
                        try:
                            arrays[name] = np.lib.format.read_array(member, allow_pickle=False)
                        except ValueError as exc:
                            if "allow_pickle" in str(exc):
                                raise bad(
                                    f"array {name!r} is an object array; refusing to unpickle it ({exc})"
                                ) from None
                            raise
        except CheckpointError:
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError, EOFError,
                ValueError, KeyError) as exc:
            raise bad(f"corrupt npz ({type(exc).__name__}: {exc})") from None

    index = doc["arrays"]
    if set(arrays) != set(index):
        missing, extra = sorted(set(index) - set(arrays)), sorted(set(arrays) - set(index))
        raise bad(f"names do not match the index in {json_path}: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, a in arrays.items():
        if str(a.dtype) != index[name]["dtype"] or list(a.shape) != index[name]["shape"]:
            raise bad(
                f"array {name!r} is {a.dtype} {list(a.shape)} but {json_path} records "
                f"{index[name]['dtype']} {index[name]['shape']}"
            )
    return arrays


# ----------------------------------------------------------------------------------------------
# RNG state
# ----------------------------------------------------------------------------------------------
# ``Generator.bit_generator.state`` is a nested dict of str, int (PCG64's are 128-bit) and small
# uint arrays. Each leaf becomes one array named ``<prefix>/<kind>/<path>``:
#   kind "str":   UTF-8 bytes as uint8            e.g. rng/str/bit_generator -> b"PCG64"
#   kind "int":   non-negative int as little-endian uint64 limbs (lowest 64 bits first)
#   kind "array": the ndarray itself (dtype kept), e.g. MT19937's uint32 key


def rng_state_to_arrays(rng: np.random.Generator, prefix: str) -> dict[str, np.ndarray]:
    """Encode ``rng``'s bit-generator state as plain arrays named ``<prefix>/...`` (no pickle)."""
    if not isinstance(rng, np.random.Generator):
        raise CheckpointError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    _check_prefix(prefix)
    out: dict[str, np.ndarray] = {}

    def walk(node, keys: list[str]) -> None:
        where = "/".join(keys)
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str) or "/" in k or k == "":
                    raise CheckpointError(f"rng: state key {k!r} at {where!r} cannot be encoded")
                walk(v, keys + [k])
        elif isinstance(node, str):
            out[f"{prefix}/str/{where}"] = np.frombuffer(node.encode("utf-8"), dtype=np.uint8).copy()
        elif isinstance(node, (int, np.integer)):
            out[f"{prefix}/int/{where}"] = _int_to_limbs(int(node), f"rng state {where!r}")
        elif isinstance(node, np.ndarray) and not node.dtype.hasobject:
            out[f"{prefix}/array/{where}"] = node.copy()
        else:
            raise CheckpointError(f"rng: state entry {where!r} has unsupported type {type(node).__name__}")

    walk(rng.bit_generator.state, [])
    return out


def rng_from_arrays(arrays: Mapping[str, np.ndarray], prefix: str) -> np.random.Generator:
    """Rebuild the Generator saved by ``rng_state_to_arrays(rng, prefix)``.

    Draws from the result continue exactly where the saved generator stopped. (The bit
    generator's ``seed_seq``, used only by ``spawn``, is not part of the state and is not restored.)
    """
    if not isinstance(arrays, Mapping):
        raise CheckpointError(f"arrays: expected a mapping {{name: ndarray}}, got {type(arrays).__name__}")
    _check_prefix(prefix)
    head = prefix + "/"
    state: dict[str, Any] = {}
    for name, value in arrays.items():
        if not (isinstance(name, str) and name.startswith(head)):
            continue
        kind, _, where = name[len(head):].partition("/")
        keys = where.split("/")
        if where == "" or "" in keys:
            raise CheckpointError(f"arrays[{name!r}]: expected a name {head}<kind>/<path>")
        if kind == "str":
            leaf = _bytes_to_str(value, name)
        elif kind == "int":
            leaf = _limbs_to_int(value, name)
        elif kind == "array":
            if not isinstance(value, np.ndarray):
                raise CheckpointError(f"arrays[{name!r}]: expected an ndarray, got {type(value).__name__}")
            leaf = value.copy()
        else:
            raise CheckpointError(f"arrays[{name!r}]: unknown kind {kind!r} (expected str, int or array)")
        node = state
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise CheckpointError(f"arrays[{name!r}]: {k!r} is both a value and a group")
        node[keys[-1]] = leaf
    if not state:
        raise CheckpointError(f"arrays: no RNG state under prefix {head!r}")
    name = state.get("bit_generator")
    cls = getattr(np.random, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, np.random.BitGenerator)):
        raise CheckpointError(
            f"arrays[{head + 'str/bit_generator'!r}]: expected the name of a numpy bit generator "
            f"(e.g. 'PCG64'), got {name!r}"
        )
    bit_generator = cls()
    try:
        bit_generator.state = state
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"arrays: RNG state under {head!r} is not a valid {name} state ({exc})") from None
    return np.random.Generator(bit_generator)


def _check_prefix(prefix) -> None:
    if not isinstance(prefix, str) or prefix == "" or prefix.endswith("/"):
        raise CheckpointError(f"prefix: expected a non-empty str without trailing '/', e.g. 'rng', got {prefix!r}")


def _int_to_limbs(value: int, where: str) -> np.ndarray:
    if value < 0:
        raise CheckpointError(f"{where}: expected a non-negative int, got {value}")
    limbs = []
    while True:
        limbs.append(value & 0xFFFF_FFFF_FFFF_FFFF)
        value >>= 64
        if value == 0:
            return np.array(limbs, dtype=np.uint64)


def _limbs_to_int(value, name: str) -> int:
    if not (isinstance(value, np.ndarray) and value.dtype == np.uint64 and value.ndim == 1 and value.size > 0):
        got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
        raise CheckpointError(f"arrays[{name!r}]: expected a 1-D non-empty uint64 array of limbs, got {got}")
    return sum(int(limb) << (64 * i) for i, limb in enumerate(value))


def _bytes_to_str(value, name: str) -> str:
    if not (isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1):
        got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
        raise CheckpointError(f"arrays[{name!r}]: expected a 1-D uint8 array of UTF-8 bytes, got {got}")
    try:
        return value.tobytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"arrays[{name!r}]: not valid UTF-8 ({exc})") from None
