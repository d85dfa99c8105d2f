"""Download the Multi30k task-1 files (``npformer download multi30k``) and check their sha256.

Each file is streamed into a temporary file in the destination folder, its sha256 is checked
against ``MULTI30K_FILES``, and only then is it renamed into place with ``os.replace``, so a
folder never holds a half-written or wrong file under the real name. Files that are already
present with the right digest are not downloaded again.

    >>> download_multi30k("~/.cache/npformer/multi30k")     # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

from tqdm import tqdm

from ..checkpoint import write_file_atomic

__all__ = ["MULTI30K_FILES", "DEFAULT_BASE_URL", "DownloadError", "download_multi30k", "sha256_file"]

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

_CHUNK = 1 << 16


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _wanted_files(files: Iterable[str] | Mapping[str, str] | None) -> dict[str, str]:
    """Normalise ``files`` to ``{name: sha256}``; names alone must be known Multi30k files."""
    if files is None:
        return dict(MULTI30K_FILES)
    if isinstance(files, Mapping):
        wanted = dict(files)
    elif isinstance(files, str):
        raise ValueError(f"files must be a list of file names, got the string {files!r}")
    else:
        wanted = {}
        for name in files:
            if name not in MULTI30K_FILES:
                raise ValueError(
                    f"files: unknown file {name!r}; known files are {sorted(MULTI30K_FILES)} "
                    f"(pass a dict name -> sha256 for other files)"
                )
            wanted[name] = MULTI30K_FILES[name]
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


def _fetch(url: str, dest: Path, expected: str, timeout: float, progress: bool) -> None:
    """Stream ``url`` into a temporary file next to ``dest``, check sha256, rename into place.

    The file is written as checkpoints are (``npformer.checkpoint.write_file_atomic``): with
    the user's umask, fsync-ed, and a failed write names ``dest``."""
    def check(actual):
        if actual != expected:
            raise ValueError(f"{dest.name} downloaded from {url} has the wrong sha256: "
                             f"expected {expected}, got {actual}")

    write_file_atomic(dest, lambda out: _stream(url, out, dest.name, timeout, progress), check)


def _stream(url: str, out, name: str, timeout: float, progress: bool) -> str:
    """Copy the body of ``url`` into ``out``; return its sha256 (hex)."""
    digest = hashlib.sha256()
    try:
        response = urllib.request.urlopen(url, timeout=timeout)
    except (OSError, http.client.HTTPException) as err:   # URLError is an OSError
        raise DownloadError(f"could not download {url}: {err}") from err
    with response:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        with tqdm(total=total, unit="B", unit_scale=True, desc=name,
                  disable=not progress, file=sys.stderr) as bar:
            while True:
                try:
                    block = response.read(_CHUNK)
                except (OSError, http.client.HTTPException) as err:
                    raise DownloadError(f"could not download {url}: {err}") from err
                if not block:
                    return digest.hexdigest()
                digest.update(block)
                out.write(block)                  # an OSError here is named by _write_temp
                bar.update(len(block))


def download_multi30k(
    dest_dir: str | os.PathLike,
    base_url: str = DEFAULT_BASE_URL,
    files: Iterable[str] | Mapping[str, str] | None = None,
    timeout: float = 60,
    progress: bool = True,
) -> list[Path]:
    """Download the Multi30k files into ``dest_dir`` (created if needed); return their paths.

    ``files`` is None (all of ``MULTI30K_FILES``), a list of names from ``MULTI30K_FILES``, or a
    dict ``{name: sha256}`` for other files. A file already present with the right sha256 is
    skipped; one with a wrong digest is downloaded again and replaced. Raises ``ValueError``
    when a downloaded file has the wrong sha256 (nothing is left behind) and ``OSError``
    naming the URL when the download itself fails.
    """
    if not isinstance(base_url, str):
        raise ValueError(f"base_url must be a str, got {type(base_url).__name__}")
    scheme = urllib.parse.urlsplit(base_url).scheme
    if scheme not in ("http", "https", "file"):
        raise ValueError(f"base_url must be an http(s):// or file:// URL, got {base_url!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    wanted = _wanted_files(files)
    dest_dir = Path(dest_dir).expanduser()
    if dest_dir.exists() and not dest_dir.is_dir():
        raise ValueError(f"{dest_dir} is a file, expected a folder for the downloads")
    dest_dir.mkdir(parents=True, exist_ok=True)

    paths = []
    for name, expected in wanted.items():
        dest = dest_dir / name
        paths.append(dest)
        if dest.is_file():
            if sha256_file(dest) == expected:
                if progress:
                    tqdm.write(f"{name}: present, sha256 ok", file=sys.stderr)
                continue
            if progress:
                tqdm.write(f"{name}: present with a wrong sha256, downloading again",
                           file=sys.stderr)
        url = urllib.parse.urljoin(base_url if base_url.endswith("/") else base_url + "/",
                                   urllib.parse.quote(name))
        _fetch(url, dest, expected, timeout, progress)
    return paths
