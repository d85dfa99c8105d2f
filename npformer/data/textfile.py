"""Reading and writing UTF-8 text the same way everywhere: files, standard input, outputs.

* ``decode_utf8`` decodes strictly (a byte that is not UTF-8 is an error naming the source, the
  line and the byte offset, never a silent replacement) and drops a leading byte-order mark,
  which some editors write and which would otherwise stick to the first word.
* ``write_text_atomic`` writes a whole file under a temporary name next to it and renames it
  into place, so a full disk or a crash leaves the previous file as it was.
"""

from __future__ import annotations

import os
import tempfile

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

    The text goes to a temporary file in the same folder, is flushed to disk, and only then
    replaces ``path``; if anything fails (no space left, say) the temporary file is removed and
    an existing ``path`` is unchanged. An ``OSError`` raised while writing names ``path``.
    """
    path = os.fspath(path)
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
    try:
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            if err.filename is None and err.errno is not None:   # a write() error names nothing
                raise OSError(err.errno, err.strerror, path) from err
            raise
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
