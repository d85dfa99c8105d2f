"""Reading and writing UTF-8 text the same way everywhere: files, standard input, outputs.

* ``decode_utf8`` decodes strictly (a byte that is not UTF-8 is an error naming the source, the
  line and the byte offset, never a silent replacement) and drops a leading byte-order mark,
  which some editors write and which would otherwise stick to the first word.
* ``read_text`` reads a whole UTF-8 text file (a language model's corpus) as one string.
* ``read_lines`` reads a text file (gzip-compressed if its name ends in ``.gz``) or standard
  input (``-``) into its lines; ``iter_lines`` yields the same lines one at a time as they are
  read (``npformer translate`` translates a window of them while the rest is still coming);
  ``read_parallel`` reads two such files, line i of one translating
  line i of the other, into (source, target) pairs.
* ``write_text_atomic`` writes a whole file under a temporary name next to it and renames it
  into place, so a full disk or a crash leaves the previous file as it was; it writes with the
  same temp-file writer as ``npformer.checkpoint``.
"""

from __future__ import annotations

import gzip
import os
import sys
import zlib
from pathlib import Path
from typing import Iterator

# the writer every atomic save shares: a fresh ``.NAME.<hex>.tmp`` beside the file (mode 0o666
# less the umask, as open() gives), fsync-ed, a failed write() naming the final path; then the
# folder's fsync. npformer.checkpoint holds them because it must stay loadable on its own.
from ..checkpoint import write_file_atomic

__all__ = ["BOM", "decode_utf8", "iter_lines", "read_lines", "read_parallel", "read_text",
           "write_text_atomic"]

BOM = "\ufeff"


def decode_utf8(data: bytes, name: str, first_line: int = 1, offset: int = 0) -> str:
    """``data`` decoded as strict UTF-8 without a leading byte-order mark.

    ``name`` is what an error calls the source (a path, or ``<stdin>``): the ``ValueError``
    gives the 1-based line and the byte offset of the first byte that is not UTF-8
    (``first_line`` and ``offset``: where ``data`` starts in the source, for a part of it).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        before = data[:err.start]                # line ends as read_lines splits at them
        line_no = (before.count(b"\n") + before.count(b"\r") - before.count(b"\r\n")
                   + first_line)
        raise ValueError(
            f"{name}, line {line_no}: not valid UTF-8 "
            f"(byte {data[err.start:err.start + 1]!r} at offset {offset + err.start}); "
            f"expected UTF-8 text"
        ) from None
    return text[1:] if text.startswith(BOM) and offset == 0 else text


def read_text(path: str | os.PathLike) -> str:
    """The whole text of a UTF-8 file (gzip-compressed if its name ends in ``.gz``), line ends
    as they are, a leading byte-order mark dropped. ``ValueError`` naming the file for a missing
    file, a folder, a corrupt gzip stream, bytes that are not UTF-8 or an empty file."""
    text = _file_text(Path(path))
    if not text:
        raise ValueError(f"{path}: is empty, expected UTF-8 text")
    return text


def _file_text(path: Path) -> str:
    """A file's text, decoded as ``decode_utf8`` does (gunzipped first for ``.gz``)."""
    if path.is_dir():
        raise ValueError(f"{path}: is a folder, expected a text file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:   # BadGzipFile is an OSError
            raise ValueError(f"{path}: not a valid gzip file ({err})") from err
    return decode_utf8(data, str(path))


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of a UTF-8 text file (gzip-compressed if its name ends in ``.gz``), or of
    standard input for ``"-"``.

    Only the line ends are removed (``\\n``, ``\\r\\n`` or ``\\r``, as text-mode reading has
    them; not the other characters ``str.splitlines`` splits on), and a leading byte-order mark.
    Spaces inside and at the ends of a line are kept. Raises ``ValueError`` naming the file for a
    missing file, a folder, a corrupt gzip stream, or bytes that are not UTF-8 (with the 1-based
    line number and the byte offset).
    """
    if os.fspath(path) == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:                       # a text stream without bytes (a test's StringIO)
            text = sys.stdin.read()
            text = text[1:] if text.startswith(BOM) else text
        else:
            text = decode_utf8(stream.read(), "<stdin>")
    else:
        text = _file_text(Path(path))
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":                          # the text ends with a line end, or is empty
        lines.pop()
    return lines


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines ``read_lines(path)`` returns, one at a time as they are read: memory for one
    line, not the file, and the first line before standard input has ended. The same errors,
    raised when the reading reaches them (the lines before were given already)."""
    if os.fspath(path) == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:                       # a text stream without bytes (a test's StringIO)
            yield from read_lines(path)
            return
        yield from _split_lines(stream, "<stdin>")
        return
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a folder, expected a text file")
    try:
        f = gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    with f:
        try:
            yield from _split_lines(f, str(path))
        except (OSError, EOFError, zlib.error) as err:
            if not path.name.endswith(".gz"):
                raise
            raise ValueError(f"{path}: not a valid gzip file ({err})") from err


def _split_lines(stream, name: str) -> Iterator[str]:
    """The lines of a binary stream, split as ``read_lines`` splits a text: at ``\n``, ``\r\n``
    and ``\r`` (a byte that is no part of any other UTF-8 character, so the bytes can be split
    before they are decoded), each decoded as ``decode_utf8`` does, a final empty line dropped."""
    line_no, start = 1, 0                        # the next line's number, the chunk's offset
    while True:
        chunk = stream.readline()                # up to and with b"\n", or the end
        if not chunk:
            return
        ended = chunk.endswith(b"\n")
        body = chunk[:-2] if chunk.endswith(b"\r\n") else chunk[:-1] if ended else chunk
        parts = body.split(b"\r")
        at = start
        for i, part in enumerate(parts):
            line = decode_utf8(part, name, line_no, at)
            if line or ended or i < len(parts) - 1:      # no line after the text's last end
                yield line
            at += len(part) + 1
            line_no += 1
        start += len(chunk)


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike,
                  what: str = "data", max_len: int | None = None) -> list[tuple[str, str]]:
    """(source, target) pairs from two text files of equal line counts, line i of one
    translating line i of the other. ``what`` names the data in errors ("training data"): files
    of different lengths, an empty line on either side, or no line at all are refused. With
    ``max_len`` (the model's), so is a line of more whitespace tokens than it holds (a target
    also holds its ``<eos>``), naming the file and the line."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(f"{what}: {os.fspath(src_path)} has {len(src)} lines but "
                         f"{os.fspath(tgt_path)} has {len(tgt)}")
    pairs = []
    for n, (s, t) in enumerate(zip(src, tgt), 1):
        if not s.split() or not t.split():
            empty = src_path if not s.split() else tgt_path
            raise ValueError(f"{what}: line {n} is empty in {os.fspath(empty)}")
        if max_len is not None:
            for path, line, room in ((src_path, s, max_len), (tgt_path, t, max_len - 1)):
                if len(line.split()) > room:
                    eos = "" if room == max_len else " and with its <eos>"
                    raise ValueError(
                        f"{what}: line {n} of {os.fspath(path)} has {len(line.split()):,} "
                        f"tokens,{eos} more than the model's max_len={max_len}; shorten or "
                        f"remove the line, or raise max_len (--max-len)")
        pairs.append((s, t))
    if not pairs:
        raise ValueError(f"{what}: {os.fspath(src_path)} is empty")
    return pairs


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
