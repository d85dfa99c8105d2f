"""Reading and writing UTF-8 text the same way everywhere: files, standard input, outputs.

* ``decode_utf8`` decodes strictly (a byte that is not UTF-8 is an error naming the source, the
  line and the byte offset, never a silent replacement) and drops a leading byte-order mark,
  which some editors write and which would otherwise stick to the first word.
* ``write_text_atomic`` writes a whole file under a temporary name next to it and renames it
  into place, so a full disk or a crash leaves the previous file as it was; it writes with the
  same temp-file writer as ``npformer.checkpoint``.
"""

from __future__ import annotations

import os
from pathlib import Path

# the writer every atomic save shares: a fresh ``.NAME.<hex>.tmp`` beside the file (mode 0o666
# less the umask, as open() gives), fsync-ed, a failed write() naming the final path; then the
# folder's fsync. npformer.checkpoint holds them because it must stay loadable on its own.
from ..checkpoint import write_file_atomic

__all__ = ["BOM", "decode_utf8", "write_text_atomic"]

BOM = "\ufeff"


def decode_utf8(data: bytes, name: str) -> str:
    """``data`` decoded as strict UTF-8 without a leading byte-order mark.

    ``name`` is what an error calls the source (a path, or ``<stdin>``): the ``ValueError``
    gives the 1-based line and the byte offset of the first byte that is not UTF-8.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_no = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"{name}, line {line_no}: not valid UTF-8 "
            f"(byte {data[err.start:err.start + 1]!r} at offset {err.start}); "
            f"expected UTF-8 text"
        ) from None
    return text[1:] if text.startswith(BOM) else text


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, creating its folder if needed, all or nothing.

    The text goes to a temporary file in the same folder (checkpoint's ``write_file_atomic``), is
    flushed to disk, and only then replaces ``path``; the folder is fsync-ed so the rename lasts
    too. If anything fails (no space left, say) the temporary file is removed and an existing
    ``path`` is unchanged. An ``OSError`` raised while writing names ``path``. The file gets the
    mode ``open(path, "w")`` would give a new file (0o666 less the umask).
    """
    path = os.fspath(path)
    data = text.encode("utf-8")
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    write_file_atomic(Path(path), lambda f: f.write(data))
