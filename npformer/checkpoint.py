"""Checkpoint files: atomic, pickle-free, verified on load.

A checkpoint is ONE file, ``ckpt.npz``; a readable copy of its metadata sits beside it::

    run/ckpt.npz    the checkpoint: one .npy member per array (model weights, optimizer moments,
                    RNG state), a member "__meta__.json" (format version, an index of the arrays,
                    your metadata) and, at the very end, a sha256 trailer
    run/ckpt.json   a human-readable copy of that metadata plus the npz's sha256 and size;
                    loading never needs it

``save_checkpoint("run/ckpt", arrays, meta)`` writes both and ``load_checkpoint("run/ckpt")``
reads the npz back (``"run/ckpt.npz"`` or ``"run/ckpt.json"`` name the same checkpoint).

Why temp file + fsync + rename?
    Writing straight over ``ckpt.npz`` destroys the old checkpoint the moment the file is
    opened; if the process is killed (OOM killer, Ctrl-C, a pre-empted cloud machine) half way
    through, you are left with neither the old nor the new one. Instead the file is written to
    a temporary file in the *same directory*, flushed and ``os.fsync``-ed (so its bytes are on
    disk, not just in the OS page cache), and only then ``os.replace``-d over the real name.
    A rename inside one file system is atomic: anyone opening ``ckpt.npz`` sees either the
    complete old file or the complete new one, never a mix. Finally the directory itself is
    fsync-ed, so the rename (a change to the directory) survives a power cut too. Temporary
    files left by a killed process are named ``.ckpt.npz.<random>.tmp``; the loader only opens
    the real name, so they are never mistaken for the checkpoint.

Why is the metadata inside the npz?
    Two files cannot be renamed in one atomic step: a save killed between two renames would
    leave a new npz beside an old json. So the npz alone is the checkpoint. Its metadata travels
    inside it as the uint8 array ``__meta__.json`` (UTF-8 JSON), and exactly one ``os.replace``
    switches from the old checkpoint to the new one: whenever the process dies, ``ckpt.npz`` is
    the complete old or the complete new checkpoint. ``ckpt.json`` is written afterwards (same
    temp + fsync + rename) for people and scripts to read. If it does not describe the npz (a
    kill between the two renames, a hand edit), ``load_checkpoint`` warns and ignores it; if it
    is missing, nothing is lost. The name ``__meta__.json`` is reserved for this member.

Why a sha256 trailer?
    A file cannot contain its own hash, but it can end with the hash of everything before it.
    The npz's zip comment (the last bytes of a zip file) is ``npformer-sha256:<64 hex digits>``,
    the sha256 of all bytes before those 64 digits. Zip tools ignore comments, so the file stays
    a standard npz; the loader recomputes the hash before reading anything, so a truncated,
    bit-flipped or appended-to file fails with a clear ``CheckpointError``. The zip's CRC-32 of
    each member and the index (names, dtypes, shapes) are checked as well. ``ckpt.json`` records
    the sha256 of the whole npz, the same as ``sha256sum run/ckpt.npz`` prints.

Why refuse compressed members and check every header?
    A zip directory and an npy header are claims about sizes, and a loader that believes them
    can be made to allocate far more than the file holds: a deflated member of a few MB can
    inflate to GBs, a header can declare 2**40 elements. ``save_checkpoint`` only writes stored
    (uncompressed) members, so the loader refuses any other member before reading it; it parses
    each npy header itself (at most 10,000 bytes) and requires the declared array,
    prod(shape) * itemsize bytes, to be exactly the bytes the member stores, and the members to
    lie inside the file. So whatever the file says, the loader allocates about its size.

Why no pickle?
    ``pickle`` (used by ``torch.save`` and by ``np.load(..., allow_pickle=True)`` for object
    arrays) can run arbitrary code while loading, so opening a checkpoint someone sent you is
    like running their program. Here arrays are plain ``.npy`` data read with
    ``allow_pickle=False`` (object arrays are refused), metadata is plain JSON, and the RNG state
    is stored as integer arrays (see ``rng_state_to_arrays``). The npz is a standard, uncompressed
    npz: ``np.load("run/ckpt.npz")`` opens it too, and
    ``np.load("run/ckpt.npz")["__meta__.json"].tobytes().decode()`` is the metadata JSON.

One writer per checkpoint path: two processes saving to the same path at once each leave a
complete npz (the last rename wins), but ``ckpt.json`` may then describe the other save (a
warning on load, never a wrong result).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import secrets
import shutil
import struct
import tokenize
import warnings
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
FORMAT_VERSION = 3  # 1: metadata only in the .json beside the npz; 2: metadata inside the npz;
                    # 3: a model checkpoint's metadata names its architecture, holds its
                    #    vocabularies as one value and the npformer version that wrote it
READABLE_VERSIONS = (2, 3)  # 2 loads as it is; its model metadata is migrated by the model layer
# (the npformer version itself goes into a model checkpoint's metadata: this module imports
# nothing of npformer, so that it can be loaded and tested on its own)
META_NAME = "__meta__.json"  # reserved array name: the npz member holding the metadata
_TRAILER = b"npformer-sha256:"  # the npz's zip comment: this, then 64 hex digits
_DIGEST_LEN = 64  # hex digits of a sha256
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
    """Atomically write ``arrays`` and ``meta`` to ``<path>.npz`` (plus a readable ``<path>.json``).

    ``arrays`` is a flat ``{name: ndarray}`` dict; names may contain dots and slashes
    (``"model/encoder.layers.0.linear1.weight"``); ``"__meta__.json"`` is reserved. ``meta``
    must be JSON-serialisable with ``str`` keys (tuples come back as lists). Missing parent
    directories are created. Returns ``(npz_path, json_path)``.

    The single rename of the npz is the moment the new checkpoint replaces the old one. If
    writing the json copy fails after it, the error is raised (the npz is already the new one).
    """
    npz_path, json_path = checkpoint_paths(path)
    _check_arrays(arrays)
    if not isinstance(meta, Mapping):
        raise CheckpointError(f"meta: expected a mapping (dict), got {type(meta).__name__}")
    doc = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "arrays": {name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in arrays.items()},
        "meta": _plain_json(meta, "meta", set()),
    }
    meta_member = np.frombuffer(_format_json(doc).encode("utf-8"), dtype=np.uint8)  # (n_bytes,)

    npz_path.parent.mkdir(parents=True, exist_ok=True)
    temps: list[Path] = []  # temporary files not yet renamed into place
    try:
        npz_tmp, (digest, nbytes) = _write_temp(
            npz_path, lambda f: _write_npz(f, {META_NAME: meta_member, **arrays}), temps
        )
        copy = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                "npz_sha256": digest, "npz_bytes": nbytes, "arrays": doc["arrays"], "meta": doc["meta"]}
        text = _format_json(copy)
        json_tmp, _ = _write_temp(json_path, lambda f: f.write(text.encode("utf-8")), temps)
        os.replace(npz_tmp, npz_path)  # <- the new checkpoint becomes visible, all at once
        temps.remove(npz_tmp)
        os.replace(json_tmp, json_path)  # the readable copy follows; loading never relies on it
        temps.remove(json_tmp)
        _fsync_dir(npz_path.parent)
    finally:
        _remove_temps(temps)
    return npz_path, json_path


def write_file_atomic(final: Path, write, check=None):
    """One file, all or nothing: ``write(f)`` fills a temporary file beside ``final`` (see
    ``_write_temp``), ``check(result)`` may refuse what was written (raise), then one rename
    makes it ``final`` and the folder is fsync-ed. On any failure ``final`` is unchanged and the
    temporary file is gone. Returns what ``write`` returned."""
    final = Path(final)
    temps: list[Path] = []
    try:
        tmp, result = _write_temp(final, write, temps)
        if check is not None:
            check(result)
        os.replace(tmp, final)
        temps.remove(tmp)
        _fsync_dir(final.parent)
        return result
    finally:
        _remove_temps(temps)


def _remove_temps(temps) -> None:
    for tmp in temps:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def temporary_folder(out, suffix=".partial"):
    """A new, empty folder beside ``out`` (``.<name>.<hex>.partial``: an export being written;
    ``.old``: the earlier export an ``--overwrite`` replaces), names that a later export to
    ``out`` removes when a killed one left them. Made by ``os.mkdir``, so it has the umask's
    mode like any folder."""
    out = Path(out)
    for _ in range(16):
        tmp = out.with_name(f".{out.name}.{secrets.token_hex(8)}{suffix}")
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary folder beside {out}")  # pragma: no cover


def write_folder(out, write, check=None):
    """Make the folder ``out`` by ``write(tmp)`` into a new folder beside it
    (:func:`temporary_folder`), then renamed into place; ``check()``, called just before the
    swap, may refuse it (raise): the place to ask again whether ``out`` may be replaced, since
    it may have appeared while ``write`` ran (as ``write_file_atomic``'s ``check``). An existing
    ``out`` (which the caller allowed to be replaced) is set aside as ``.old`` until then, and
    comes back where the rename fails. Whatever goes wrong, no half folder is left under
    ``out``'s name, and what a kill leaves a later export removes
    (``npformer.cli.runs.remove_stale_temps``). Returns ``out`` (a Path)."""
    out = Path(out)
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_folder(parent / out.name)
    old = None
    try:
        write(tmp)
        if check is not None:
            check()
        if out.exists():                             # --overwrite: swap, then remove the old one
            old = temporary_folder(parent / out.name, ".old")
            os.replace(out, old / "model")
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / "model").exists() and not out.exists():
            os.replace(old / "model", out)           # the earlier export comes back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out


def _check_arrays(arrays) -> None:
    if not isinstance(arrays, Mapping):
        raise CheckpointError(f"arrays: expected a mapping {{name: ndarray}}, got {type(arrays).__name__}")
    for name, value in arrays.items():
        if not isinstance(name, str) or name == "":
            raise CheckpointError(f"arrays: expected non-empty str names, got {name!r}")
        if name == META_NAME:
            raise CheckpointError(
                f"arrays: the name {META_NAME!r} is reserved for the checkpoint's own metadata; "
                f"rename that array"
            )
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
        # what the loader refuses is refused here too, so a save never writes an unloadable file
        if value.dtype.itemsize == 0:
            raise CheckpointError(f"arrays[{name!r}]: dtype {value.dtype} has zero-byte elements; "
                                  f"expected a dtype holding data")
        descr = repr(np.lib.format.dtype_to_descr(value.dtype)) + repr(value.shape)
        if len(descr) > _MAX_NPY_HEADER - 100 or not descr.isascii():
            raise CheckpointError(
                f"arrays[{name!r}]: dtype {value.dtype} needs an npy header longer than "
                f"{_MAX_NPY_HEADER} bytes or one with non-ASCII field names; the loader accepts "
                f"neither (use plain or shorter field names)"
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


def _write_npz(f, members: Mapping[str, np.ndarray]) -> tuple[str, int]:
    """Write a standard uncompressed npz (one ``<name>.npy`` member per array) ending in the
    sha256 trailer; return ``(sha256 of the whole file, its size in bytes)``."""
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in members.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            with zf.open(info, mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, value, allow_pickle=False)
        zf.comment = _TRAILER + b"0" * _DIGEST_LEN  # placeholder digits, patched below
    # The zip comment is the last thing in a zip file: replace its 64 digits by the sha256 of
    # every byte before them.
    size = f.seek(0, os.SEEK_END)
    h = _sha256_head(f, size - _DIGEST_LEN)
    digest = h.hexdigest().encode("ascii")
    f.seek(size - _DIGEST_LEN)
    f.write(digest)
    h.update(digest)  # now the hash of the whole file, as `sha256sum` computes it
    return h.hexdigest(), size


def _sha256_head(f, n: int):
    """Return a ``hashlib.sha256`` object fed with the first ``n`` bytes of the binary file ``f``."""
    h = hashlib.sha256()
    f.seek(0)
    while n > 0 and (chunk := f.read(min(_CHUNK, n))):
        h.update(chunk)
        n -= len(chunk)
    return h


def _write_temp(final: Path, write, temps: list[Path]) -> tuple[Path, Any]:
    """Create a fresh temp file next to ``final``, fill it with ``write(f)``, flush and fsync it.

    Returns ``(temp_path, whatever write returned)``. The file has mode 0o666 less the umask, as
    ``open(final, "w")`` would give. ``npformer.data.textfile.write_text_atomic`` writes with
    this function too (this module stays loadable on its own, so the writer lives here).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
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
    try:
        with os.fdopen(fd, "w+b") as f:
            result = write(f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.filename is None and e.errno is not None:   # write()/fsync name no file: say which
            raise OSError(e.errno, e.strerror, str(final)) from e
        raise
    return tmp, result


def _fsync_dir(directory: Path) -> None:
    """Make renames in ``directory`` durable (POSIX only; Windows cannot open directories)."""
    if os.name == "nt":  # pragma: no cover
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------------
# load
# ----------------------------------------------------------------------------------------------


def load_checkpoint(path) -> tuple[dict[str, np.ndarray], dict]:
    """Read ``(arrays, meta)`` saved by ``save_checkpoint``; raise ``CheckpointError`` if anything is off.

    Everything comes from ``<path>.npz``. The readable ``<path>.json`` may be missing; if it does
    not describe the npz, a ``UserWarning`` says so and it is ignored.
    """
    npz_path, json_path = checkpoint_paths(path)
    try:
        f = open(npz_path, "rb")
    except FileNotFoundError:
        if json_path.exists():
            raise CheckpointError(
                f"checkpoint {npz_path} is missing; {json_path} beside it is only a readable copy "
                f"of the metadata, the arrays live in the npz"
            ) from None
        raise CheckpointError(f"no checkpoint at {npz_path.with_suffix('')}: {npz_path} does not exist") from None
    with f:  # one open file for hashing and reading: a concurrent rename cannot swap it under us
        digest, nbytes = _check_trailer(f, npz_path)
        f.seek(0)
        members = _read_members(f, npz_path)
    doc = _parse_meta(members.pop(META_NAME, None), npz_path)
    _check_index(members, doc["arrays"], npz_path)
    _check_json_copy(json_path, npz_path, {"npz_sha256": digest, "npz_bytes": nbytes, **doc})
    return members, doc["meta"]


def _check_trailer(f, npz_path: Path) -> tuple[str, int]:
    """Verify the sha256 trailer; return ``(sha256 of the whole file, size in bytes)``."""
    size = f.seek(0, os.SEEK_END)
    tail_len = len(_TRAILER) + _DIGEST_LEN
    if size < tail_len:
        raise CheckpointError(
            f"checkpoint {npz_path}: only {size} bytes, too short to be a checkpoint "
            f"(truncated, or not written by save_checkpoint)"
        )
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    recorded = tail[len(_TRAILER):]
    if not (tail.startswith(_TRAILER) and all(c in b"0123456789abcdef" for c in recorded)):
        raise CheckpointError(
            f"checkpoint {npz_path}: does not end with its sha256 trailer ({_TRAILER.decode()}<64 hex "
            f"digits>), got {tail[-24:]!r}: the file is truncated or has bytes appended, or it is not "
            f"an npformer checkpoint of format_version {FORMAT_VERSION} (np.savez files have no trailer)"
        )
    h = _sha256_head(f, size - _DIGEST_LEN)
    if h.hexdigest().encode("ascii") != recorded:
        raise CheckpointError(
            f"checkpoint {npz_path}: sha256 mismatch (the trailer records {recorded[:16].decode()}..., "
            f"the {size} bytes hash to {h.hexdigest()[:16]}...): the file is corrupt"
        )
    h.update(recorded)
    return h.hexdigest(), size


def _read_members(f, npz_path: Path) -> dict[str, np.ndarray]:
    """Read every ``<name>.npy`` member with ``allow_pickle=False``, allocating no more than the
    file justifies.

    The zip directory and each npy header are only claims, and a forged one could ask for any
    amount of memory. So before reading a member's data: it must be stored, not compressed
    (``save_checkpoint`` never compresses, and inflating is where a small file turns into a huge
    one); its npy header must be short; and the array the header declares (element count times
    element size) must fill exactly the bytes the member stores. The members' stored sizes must
    add up to no more than the file's size. Every array read is then backed by bytes of the file.
    """
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {npz_path}: {what}")

    file_size = f.seek(0, os.SEEK_END)
    f.seek(0)
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(f) as zf:
            infos = zf.infolist()
            stored_total = 0
            for info in infos:
                _check_member_entry(info, file_size, bad)
                stored_total += info.compress_size
            if stored_total > file_size:
                raise bad(f"the zip directory claims {stored_total} bytes of members in a file of "
                          f"{file_size} bytes (overlapping members?)")
            for info in infos:
                if not info.filename.endswith(".npy"):
                    raise bad(f"unexpected member {info.filename!r} (expected <name>.npy)")
                name = info.filename[: -len(".npy")]
                if name in arrays:
                    raise bad(f"duplicate member {info.filename!r}")
                with zf.open(info) as member:
                    _check_npy_header(member, info, bad)
                    member.seek(0)
                    # the header's length is bounded above (numpy >= 1.24 bounds it too; its
                    # max_header_size keyword is absent from the older numpy setup.cfg allows)
                    arrays[name] = np.lib.format.read_array(member, allow_pickle=False)
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError, EOFError,
            ValueError, KeyError, RuntimeError, OverflowError, struct.error) as exc:
        raise bad(f"corrupt npz ({type(exc).__name__}: {exc})") from None
    return arrays


_MAX_NPY_HEADER = 10_000  # longest npy header accepted, in bytes (numpy's own default limit)


def _check_member_entry(info: zipfile.ZipInfo, file_size: int, bad) -> None:
    """A member must be stored uncompressed and unencrypted, and lie inside the file."""
    where = f"member {info.filename!r}"
    if info.compress_type != zipfile.ZIP_STORED:
        method = {zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2",
                  zipfile.ZIP_LZMA: "lzma"}.get(info.compress_type, f"method {info.compress_type}")
        raise bad(f"{where} is compressed ({method}); save_checkpoint stores members uncompressed, "
                  f"so this file was not written by it. Refusing to decompress it (a small "
                  f"compressed member can expand to any size)")
    if info.flag_bits & 0x1:
        raise bad(f"{where} is encrypted; save_checkpoint never encrypts")
    if info.file_size != info.compress_size:
        raise bad(f"{where} is stored uncompressed, yet the zip directory records "
                  f"{info.compress_size} stored bytes and {info.file_size} bytes of content")
    if info.header_offset < 0 or info.header_offset + info.compress_size > file_size:
        raise bad(f"{where} claims {info.compress_size} bytes at offset {info.header_offset}, "
                  f"beyond the end of the {file_size}-byte file")


def _check_npy_header(member, info: zipfile.ZipInfo, bad) -> None:
    """Parse the npy header of ``member`` (bounded in length) and check that the array it
    declares, prod(shape) * itemsize bytes, is exactly the data the member stores."""
    where = f"member {info.filename!r}"
    preamble = member.read(np.lib.format.MAGIC_LEN)
    if len(preamble) < np.lib.format.MAGIC_LEN:
        raise bad(f"{where}: {len(preamble)} bytes, too short for an npy header")
    major, minor = np.lib.format.read_magic(io.BytesIO(preamble))  # ValueError if not npy
    if (major, minor) not in ((1, 0), (2, 0)):
        raise bad(f"{where}: npy format version {major}.{minor}; expected 1.0 or 2.0 "
                  f"(what save_checkpoint writes)")
    length_bytes = member.read(2 if major == 1 else 4)  # little-endian length of the header text
    header_len = int.from_bytes(length_bytes, "little")
    if header_len > _MAX_NPY_HEADER:
        raise bad(f"{where}: npy header of {header_len} bytes; expected at most {_MAX_NPY_HEADER}")
    header = member.read(header_len)
    read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    try:
        shape, _, dtype = read_header(io.BytesIO(length_bytes + header))   # length bounded above
    except (ValueError, TypeError, SyntaxError, RecursionError, tokenize.TokenError) as exc:
        # numpy's parser of the header text (a Python dict literal) fails in all these ways
        raise bad(f"{where}: corrupt npy header ({type(exc).__name__}: {exc})") from None
    if dtype.hasobject:
        raise bad(f"array {info.filename[:-4]!r} is an object array; refusing to unpickle it "
                  f"(dtype {dtype} holds Python objects, which only pickle can store)")
    if dtype.itemsize == 0:
        raise bad(f"{where}: dtype {dtype} has zero-byte elements; expected a dtype holding data")
    data_bytes = info.file_size - (len(preamble) + len(length_bytes) + len(header))
    if any(n < 0 for n in shape):
        raise bad(f"{where}: the npy header declares a negative dimension in shape {list(shape)}")
    declared = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if declared != data_bytes:
        raise bad(f"{where}: the npy header declares {dtype} {list(shape)} ({declared} bytes) but "
                  f"the member stores {data_bytes} bytes of data")


def _parse_meta(member, npz_path: Path) -> dict:
    """Decode and check the ``__meta__.json`` member (a 1-D uint8 array of UTF-8 JSON)."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {npz_path}: member {META_NAME!r}: {what}")

    if member is None:
        raise bad(
            f"missing: not an npformer checkpoint of format_version {FORMAT_VERSION} "
            f"(format 1 kept its metadata only in the .json file; re-save it with this version)"
        )
    if not (member.dtype == np.uint8 and member.ndim == 1):
        raise bad(f"expected a 1-D uint8 array of UTF-8 JSON, got {member.dtype} {list(member.shape)}")
    try:
        doc = json.loads(member.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"corrupt JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise bad(f"expected an object with format {FORMAT_NAME!r}, got {got!r}")
    version = doc.get("format_version")
    if type(version) is int and version > FORMAT_VERSION:
        meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
        writer = meta.get("npformer_version")
        raise bad(f"format_version {version}, written by "
                  f"{'npformer ' + str(writer) if writer else 'a newer npformer'}: newer than this "
                  f"npformer reads (format versions {READABLE_VERSIONS[0]} to {FORMAT_VERSION}); "
                  f"update npformer to load it")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise bad(f"expected format_version {' or '.join(map(str, READABLE_VERSIONS))}, got "
                  f"{version!r}")
    index = doc.get("arrays")
    if not isinstance(index, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("dtype"), str) and isinstance(v.get("shape"), list)
        for v in index.values()
    ):
        raise bad("expected 'arrays' to map names to {'dtype': str, 'shape': list}")
    if not isinstance(doc.get("meta"), dict):
        raise bad(f"expected 'meta' to be an object, got {type(doc.get('meta')).__name__}")
    return doc


def _check_index(arrays: dict[str, np.ndarray], index: dict, npz_path: Path) -> None:
    """The arrays read must be exactly those the metadata lists, with the same dtypes and shapes."""
    if set(arrays) != set(index):
        missing, extra = sorted(set(index) - set(arrays)), sorted(set(arrays) - set(index))
        raise CheckpointError(
            f"checkpoint {npz_path}: arrays do not match the index in {META_NAME!r}: "
            f"missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for name, a in arrays.items():
        if str(a.dtype) != index[name]["dtype"] or list(a.shape) != index[name]["shape"]:
            raise CheckpointError(
                f"checkpoint {npz_path}: array {name!r} is {a.dtype} {list(a.shape)} but {META_NAME!r} "
                f"records {index[name]['dtype']} {index[name]['shape']}"
            )


def _check_json_copy(json_path: Path, npz_path: Path, expected: dict) -> None:
    """Warn (never fail) if the readable copy beside the npz exists but does not describe it."""
    try:
        copy = json.loads(json_path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return  # a missing copy is fine: the npz holds everything
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = f"it cannot be read ({type(exc).__name__}: {exc})"
    else:
        def canonical(doc) -> str:  # compares NaN equal to NaN, ignores key order
            return json.dumps(doc, sort_keys=True)

        if canonical(copy) == canonical(expected):
            return
        if not isinstance(copy, dict) or copy.get("npz_sha256") != expected["npz_sha256"]:
            reason = "it belongs to another save (e.g. one killed between writing the two files)"
        else:
            reason = "it was edited"
    warnings.warn(
        f"{json_path} does not describe {npz_path}: {reason}. Ignoring it: the npz alone is the "
        f"checkpoint, and the next save rewrites the json.",
        UserWarning,
        stacklevel=3,
    )


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

    Draws from the result continue exactly where the saved rng stopped. (The bit
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
