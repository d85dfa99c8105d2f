"""Read the Multi30k German-English translation data (task 1, raw) from a folder.

The folder holds one file per split and language, one sentence a line, line i of
``NAME.de.gz`` translating line i of ``NAME.en.gz``::

    train.de.gz  train.en.gz            29,000 sentences
    val.de.gz    val.en.gz               1,014
    test_2016_flickr.de.gz  ...en.gz     1,000

Files may also be uncompressed (``NAME.de``). Get the data with ``npformer download multi30k``
(see ``npformer.data.download``), or point ``$NPFORMER_DATA`` at a folder that has it.

    >>> pairs = load_split(None, "val")       # the download's folder     # doctest: +SKIP
    >>> pairs[0]                                                  # doctest: +SKIP
    ('Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen',
     'A group of men are loading cotton onto a truck')
"""

from __future__ import annotations

import os
from pathlib import Path

from .textfile import read_lines

__all__ = [
    "SPLITS",
    "LANGUAGES",
    "MissingDataError",
    "resolve_data_dir",
    "load_split",
    "available_splits",
]

SPLITS = ("train", "val", "test_2016_flickr")
LANGUAGES = ("de", "en")
ENV_VAR = "NPFORMER_DATA"
DEFAULT_DATA_DIR = Path("~/.cache/npformer/multi30k")


class MissingDataError(FileNotFoundError, ValueError):
    """A data folder or split is missing (catch it as FileNotFoundError or ValueError)."""


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data folder: ``data_dir`` if given, else ``$NPFORMER_DATA``, else
    ``~/.cache/npformer/multi30k``. An empty ``$NPFORMER_DATA`` counts as unset.

    ``~`` is expanded; the folder is not required to exist (it may be a download target).
    """
    if data_dir is None:
        data_dir = os.environ.get(ENV_VAR) or DEFAULT_DATA_DIR
    elif not isinstance(data_dir, (str, os.PathLike)):
        raise ValueError(
            f"data_dir must be a str, a path or None, got {type(data_dir).__name__}"
        )
    if str(data_dir) == "":
        raise ValueError("data_dir must not be an empty string (pass None for the default)")
    return Path(data_dir).expanduser()


def _split_file(data_dir: Path, split: str, lang: str) -> Path | None:
    """``NAME.lang.gz`` if it exists, else ``NAME.lang`` if that exists, else None."""
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (data_dir / name).is_file():
            return data_dir / name
    return None


def _check_data_dir(data_dir: Path) -> None:
    if data_dir.exists() and not data_dir.is_dir():
        raise ValueError(f"data folder {data_dir} is a file, expected a folder (with the "
                         f"Multi30k .de.gz/.en.gz files)")
    if not data_dir.is_dir():
        raise MissingDataError(
            f"data folder {data_dir} does not exist; download Multi30k with "
            f"`npformer download multi30k` or set ${ENV_VAR}"
        )


def available_splits(data_dir: str | os.PathLike | None = None) -> list[str]:
    """Sorted names of the splits in ``data_dir`` that have both a ``.de`` and an ``.en`` file
    (compressed or not)."""
    data_dir = resolve_data_dir(data_dir)
    _check_data_dir(data_dir)
    found: dict[str, set[str]] = {}
    for entry in data_dir.iterdir():
        name = entry.name[:-3] if entry.name.endswith(".gz") else entry.name
        split, dot, lang = name.rpartition(".")
        if dot and split and lang in LANGUAGES and entry.is_file():
            found.setdefault(split, set()).add(lang)
    return sorted(split for split, langs in found.items() if langs == set(LANGUAGES))


def load_split(
    data_dir: str | os.PathLike | None,
    split: str,
    src: str = "de",
    tgt: str = "en",
) -> list[tuple[str, str]]:
    """The ``(source, target)`` sentence pairs of one split, e.g. ``"train"`` or ``"val"``.

    Reads ``<split>.<lang>.gz``, or the uncompressed ``<split>.<lang>`` when there is no
    ``.gz``. Any split name works (``test_2017_flickr``, ``test_2018_flickr`` ...).
    """
    for arg, lang in (("src", src), ("tgt", tgt)):
        if lang not in LANGUAGES:
            raise ValueError(f"{arg} must be one of {LANGUAGES}, got {lang!r}")
    if src == tgt:
        raise ValueError(f"src and tgt must differ, got src={src!r} and tgt={tgt!r}")
    if not isinstance(split, str) or split == "" or "/" in split or "\\" in split:
        raise ValueError(f"split must be a file name stem such as 'train', got {split!r}")

    data_dir = resolve_data_dir(data_dir)
    _check_data_dir(data_dir)
    paths = {}
    for lang in (src, tgt):
        path = _split_file(data_dir, split, lang)
        if path is None:
            present = ", ".join(available_splits(data_dir)) or "none"
            raise MissingDataError(
                f"split {split!r} not found in {data_dir}: looked for "
                f"{split}.{lang}.gz and {split}.{lang}; splits present: {present}"
            )
        paths[lang] = path

    src_lines = read_lines(paths[src])
    tgt_lines = read_lines(paths[tgt])
    if len(src_lines) != len(tgt_lines):
        raise ValueError(
            f"split {split!r}: {paths[src]} has {len(src_lines)} lines but "
            f"{paths[tgt]} has {len(tgt_lines)}; line i of one must translate line i of the other"
        )
    return list(zip(src_lines, tgt_lines))
