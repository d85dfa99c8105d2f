"""Download a data set (``npformer download NAME``) and check every file's sha256.

One downloader serves the table ``DATASETS``: Multi30k's task-1 files (``multi30k``) and the
character model's text, char-rnn's tiny Shakespeare (``tinyshakespeare``). Each file is streamed
into a temporary file in the destination folder, its sha256 is checked against the table, and
only then is it renamed into place with ``os.replace``, so a folder never holds a half-written
or wrong file under the real name. Files that are already present with the right digest are
not downloaded again. Both data sets go to the same folder, ``resolve_data_dir()``'s
(``$NPFORMER_DATA``, else ``~/.cache/npformer/multi30k``).

    >>> download("tinyshakespeare")                      # doctest: +SKIP
    [PosixPath('/home/me/.cache/npformer/multi30k/tinyshakespeare.txt')]
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from ..checkpoint import write_file_atomic
from .multi30k import resolve_data_dir

__all__ = ["DATASETS", "DataSet", "MULTI30K_FILES", "DEFAULT_BASE_URL", "DownloadError",
           "dataset", "download", "download_multi30k", "find_downloaded", "sha256_file",
           "text_file"]

DEFAULT_BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"

# File name -> sha256 of the raw (untokenized, cased) task-1 files.
MULTI30K_FILES: dict[str, str] = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}


@dataclass(frozen=True)
class DataSet:
    """A data set ``npformer download`` knows: where its files are and their sha256.

    ``files`` maps each file's name in the data folder to its sha256; ``sources`` maps a name to
    the file's name on the server where the two differ (tiny Shakespeare is char-rnn's
    ``input.txt``, kept as ``tinyshakespeare.txt`` beside the Multi30k files)."""

    name: str
    base_url: str
    files: Mapping[str, str]
    sources: Mapping[str, str] = field(default_factory=dict)
    about: str = ""

    def source(self, name: str) -> str:
        return self.sources.get(name, name)


DATASETS: dict[str, DataSet] = {
    "multi30k": DataSet("multi30k", DEFAULT_BASE_URL, MULTI30K_FILES,
                        about="Multi30k task 1, German-English (the translation model's data)"),
    "tinyshakespeare": DataSet(
        "tinyshakespeare",
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/",
        {"tinyshakespeare.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"},
        {"tinyshakespeare.txt": "input.txt"},
        about="char-rnn's tiny Shakespeare, 1,115,394 bytes (the character model's text)"),
}


def dataset(name: str) -> DataSet:
    """The data set called ``name`` (a ValueError listing the known names otherwise)."""
    if not isinstance(name, str) or name not in DATASETS:
        raise ValueError(f"data set: expected one of {', '.join(DATASETS)}, got {name!r}")
    return DATASETS[name]


_CHUNK = 1 << 16


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _wanted_files(files: Iterable[str] | Mapping[str, str] | None,
                  known: Mapping[str, str]) -> dict[str, str]:
    """Normalise ``files`` to ``{name: sha256}``; names alone must be in ``known`` (the data
    set's table)."""
    if files is None:
        return dict(known)
    if isinstance(files, Mapping):
        wanted = dict(files)
    elif isinstance(files, str):
        raise ValueError(f"files must be a list of file names, got the string {files!r}")
    else:
        wanted = {}
        for name in files:
            if name not in known:
                raise ValueError(
                    f"files: unknown file {name!r}; known files are {sorted(known)} "
                    f"(pass a dict name -> sha256 for other files)"
                )
            wanted[name] = known[name]
    for name, digest in wanted.items():
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
            raise ValueError(f"files: {name!r} is not a plain file name")
        if not (isinstance(digest, str) and len(digest) == 64
                and all(c in "0123456789abcdef" for c in digest)):
            raise ValueError(f"files: sha256 of {name!r} must be 64 lowercase hex digits, "
                             f"got {digest!r}")
    return wanted


class DownloadError(OSError):
    """The server could not be reached or the transfer broke off (the message names the URL)."""


def _fetch(url: str, dest: Path, expected: str, timeout: float, progress: bool,
           stale: bool = False) -> None:
    """Stream ``url`` into a temporary file next to ``dest``, check sha256, rename into place.

    The file is written as checkpoints are (``npformer.checkpoint.write_file_atomic``): with
    the user's umask, fsync-ed, and a failed write names ``dest``. ``stale``: the file already
    at ``dest`` is known to have a wrong sha256; when the new download is wrong too, it is
    removed as well, so that no wrong file stays under the real name."""
    def check(actual):
        if actual != expected:
            if stale:
                dest.unlink(missing_ok=True)
            raise ValueError(f"{dest} downloaded from {url} has the wrong sha256 (a truncated "
                             f"or altered file; not kept): expected {expected}, got {actual}")

    write_file_atomic(dest, lambda out: _stream(url, out, dest.name, timeout, progress), check)


def _failed(url: str, err: BaseException, timeout: float) -> DownloadError:
    """The error for a transfer that failed; a stalled server's says how long it was waited for."""
    reason = getattr(err, "reason", err)                      # URLError wraps the socket's error
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return DownloadError(f"could not download {url}: the server sent nothing for {timeout:g} s "
                             f"(timed out; try again later, or raise --timeout)")
    return DownloadError(f"could not download {url}: {err}")


def _stream(url: str, out, name: str, timeout: float, progress: bool) -> str:
    """Copy the body of ``url`` into ``out``; return its sha256 (hex). ``timeout`` bounds the
    connection and every read: a server that stalls is given up on, never waited for forever."""
    digest = hashlib.sha256()
    try:
        response = urllib.request.urlopen(url, timeout=timeout)
    except (OSError, http.client.HTTPException) as err:   # URLError is an OSError
        raise _failed(url, err, timeout) from err
    with response:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        with tqdm(total=total, unit="B", unit_scale=True, desc=name,
                  disable=not progress, file=sys.stderr) as bar:
            while True:
                try:
                    block = response.read(_CHUNK)
                except (OSError, http.client.HTTPException) as err:
                    raise _failed(url, err, timeout) from err
                if not block:
                    return digest.hexdigest()
                digest.update(block)
                out.write(block)                  # an OSError here is named by _write_temp
                bar.update(len(block))


def download(
    name: str,
    dest_dir: str | os.PathLike | None = None,
    base_url: str | None = None,
    files: Iterable[str] | Mapping[str, str] | None = None,
    timeout: float = 60,
    progress: bool = True,
) -> list[Path]:
    """Download data set ``name`` (a key of ``DATASETS``) into ``dest_dir`` (default
    ``resolve_data_dir()``, created if needed); return the files' paths.

    ``base_url`` replaces the data set's (a mirror, or a test's local server). ``files`` is None
    (all of the data set's files), a list of its file names, or a dict ``{name: sha256}`` for
    other files. A file already present with the right sha256 is skipped; one with a wrong
    digest is downloaded again and replaced. Raises ``ValueError`` when a downloaded file has
    the wrong sha256 (the message names the file and both digests; nothing is left behind, not
    even the wrong file that was there before) and
    ``OSError`` naming the URL when the download itself fails or the server stalls for
    ``timeout`` seconds.
    """
    entry = dataset(name)
    base_url = entry.base_url if base_url is None else base_url
    if not isinstance(base_url, str):
        raise ValueError(f"base_url must be a str, got {type(base_url).__name__}")
    scheme = urllib.parse.urlsplit(base_url).scheme
    if scheme not in ("http", "https", "file"):
        raise ValueError(f"base_url must be an http(s):// or file:// URL, got {base_url!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    wanted = _wanted_files(files, entry.files)
    dest_dir = resolve_data_dir(dest_dir)
    if dest_dir.exists() and not dest_dir.is_dir():
        raise ValueError(f"{dest_dir} is a file, expected a folder for the downloads")
    dest_dir.mkdir(parents=True, exist_ok=True)

    paths = []
    for file, expected in wanted.items():
        dest = dest_dir / file
        paths.append(dest)
        stale = dest.is_file()
        if stale:
            if sha256_file(dest) == expected:
                if progress:
                    tqdm.write(f"{file}: present, sha256 ok", file=sys.stderr)
                continue
            if progress:
                tqdm.write(f"{file}: present with a wrong sha256, downloading again",
                           file=sys.stderr)
        url = urllib.parse.urljoin(base_url if base_url.endswith("/") else base_url + "/",
                                   urllib.parse.quote(entry.source(file)))
        _fetch(url, dest, expected, timeout, progress, stale)
    return paths


def download_multi30k(
    dest_dir: str | os.PathLike,
    base_url: str = DEFAULT_BASE_URL,
    files: Iterable[str] | Mapping[str, str] | None = None,
    timeout: float = 60,
    progress: bool = True,
) -> list[Path]:
    """``download("multi30k", ...)``: the Multi30k files into ``dest_dir``."""
    return download("multi30k", dest_dir, base_url, files, timeout, progress)


def find_downloaded(name: str, dest_dir: str | os.PathLike | None = None) -> Path | None:
    """The path of data set ``name``'s one file in ``dest_dir`` (default ``resolve_data_dir()``)
    when it is there with the right sha256; None when it is not there. A file there with another
    sha256 is a ``ValueError`` that names it, both digests and the command that fetches it again.
    """
    entry = dataset(name)
    if len(entry.files) != 1:
        raise ValueError(f"data set {name!r} has {len(entry.files)} files, not one")
    (file, expected), = entry.files.items()
    path = resolve_data_dir(dest_dir) / file
    if not path.is_file():
        return None
    actual = sha256_file(path)
    if actual != expected:
        raise ValueError(f"{path} has the wrong sha256 (expected {expected}, got {actual}); "
                         f"fetch it again with `npformer download {name}`")
    return path


def text_file(data: str | os.PathLike, dest_dir: str | os.PathLike | None = None
              ) -> tuple[Path, str | None]:
    """Where the text of ``npformer lm --data DATA`` is: ``(path, note)``.

    A file that exists is read as it is, even where its name is also a data set's (the note
    then says which was read); a folder of that name (char-rnn's ``data/tinyshakespeare/``) does
    not hide the data set. Otherwise the name of a one-file data set (``tinyshakespeare``)
    is its download in ``dest_dir`` (default ``resolve_data_dir()``), and a ``ValueError`` gives
    the one command that fetches it when it is not there. Anything else is returned as a path
    for the reader to refuse (``note`` None)."""
    if not isinstance(data, (str, os.PathLike)) or str(data) == "":
        raise ValueError(f"--data: expected a text file or a data set name, got {data!r}")
    known = {key for key, entry in DATASETS.items() if len(entry.files) == 1}
    if Path(data).is_file() or str(data) not in known:
        note = None
        if str(data) in known:
            note = (f"--data {data}: read the file {Path(data).resolve()} in the working folder, "
                    f"not the downloaded data set {data} (give its path to read that one)")
        return Path(data), note
    path = find_downloaded(str(data), dest_dir)
    if path is None:
        (file,) = DATASETS[str(data)].files
        where = resolve_data_dir(dest_dir) / file
        raise ValueError(f"--data {data}: not downloaded yet (no {where}); fetch it with "
                         f"`npformer download {data}`")
    return path, f"--data {data}: read the download {path}"
