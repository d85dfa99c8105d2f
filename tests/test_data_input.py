"""Reading data: a byte-order mark never sticks to the first word, a file where a folder belongs is
called a file, and a failed write (a full disk) names its path and leaves the old file intact."""
import errno
import gzip
import json
import os
import stat

import pytest

from npformer.data import download as download_module
from npformer.data import textfile
from npformer.data.download import download_multi30k, sha256_file
from npformer.data.multi30k import load_split
from npformer.data.textfile import read_lines, read_parallel
from npformer.data.textfile import decode_utf8, write_text_atomic
from npformer.data.vocab import Vocab

BOM = "\ufeff".encode("utf-8")


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("name", ["val.de", "val.de.gz"])
def test_multi30k_reader_strips_a_leading_byte_order_mark(tmp_path, name):
    data = BOM + "Ein Mann\nZwei Hunde\n".encode("utf-8")
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    assert read_lines(tmp_path / name) == ["Ein Mann", "Zwei Hunde"]


def test_only_a_leading_byte_order_mark_is_removed():
    assert decode_utf8(BOM + "a\ufeffb".encode("utf-8"), "x") == "a\ufeffb"


def test_non_utf8_names_the_source_line_and_offset():
    with pytest.raises(ValueError, match=r"<stdin>, line 2: not valid UTF-8 \(byte b'\\xff' at offset 4\)"):
        decode_utf8(b"abc\n\xff\n", "<stdin>")


def test_a_data_dir_that_is_a_file_is_called_a_file(tmp_path):
    (tmp_path / "notes").write_text("x\n")
    with pytest.raises(ValueError, match=r"notes is a file, expected a folder"):
        load_split(tmp_path / "notes", "val")


def test_vocab_file_with_a_byte_order_mark_loads(tmp_path):
    v = Vocab.build([["我", "有"]])
    path = tmp_path / "vocab.json"
    path.write_bytes(BOM + json.dumps(v.to_dict(), ensure_ascii=False).encode("utf-8"))
    assert Vocab.load(path) == v


def test_failed_vocab_save_names_the_path_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "vocab.json"
    Vocab.build([["old"]]).save(path)
    before = path.read_bytes()
    monkeypatch.setattr(textfile.os, "fsync", _no_space)
    with pytest.raises(OSError) as err:
        Vocab.build([["new", "words"]]).save(path)
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab.json"]   # no temporary left


def test_write_text_atomic_creates_folders_and_replaces(tmp_path):
    path = tmp_path / "a" / "b.txt"
    write_text_atomic(path, "one\n")
    write_text_atomic(path, "two\n")
    assert path.read_text() == "two\n"


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_write_text_atomic_gives_the_mode_open_would(tmp_path, umask):
    """eval --out, --metrics-json and saved vocabularies came out -rw------- (mkstemp's 0600)
    where open(path, "w") gave 0o666 less the umask."""
    old = os.umask(umask)
    try:
        write_text_atomic(tmp_path / "out.txt", "x\n")
        Vocab.build([["a"]]).save(tmp_path / "vocab.json")
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x\n")
    finally:
        os.umask(old)
    for name in ("out.txt", "vocab.json", "plain.txt"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o666 & ~umask, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "plain.txt", "vocab.json"]


def test_write_text_atomic_refuses_unencodable_text_and_leaves_nothing(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, "a lone surrogate \udc80")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_download_into_a_file_is_refused(tmp_path):
    (tmp_path / "dest").write_text("x")
    with pytest.raises(ValueError, match=r"dest is a file, expected a folder"):
        download_multi30k(tmp_path / "dest", base_url=tmp_path.as_uri() + "/", progress=False)


def test_download_write_failure_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    served = tmp_path / "served"
    served.mkdir()
    (served / "val.de.gz").write_bytes(b"some bytes")
    dest = tmp_path / "dest"
    monkeypatch.setattr(download_module.os, "fsync", _no_space)
    with pytest.raises(OSError) as err:
        download_multi30k(dest, base_url=served.as_uri() + "/", progress=False,
                          files={"val.de.gz": sha256_file(served / "val.de.gz")})
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(dest / "val.de.gz")
    assert list(dest.iterdir()) == []


def test_read_lines_reads_gzip_and_every_line_end_and_read_parallel_checks_the_pairs(tmp_path):
    (tmp_path / "a.gz").write_bytes(gzip.compress("eins\r\nzwei\rdrei\n".encode("utf-8")))
    assert read_lines(tmp_path / "a.gz") == ["eins", "zwei", "drei"]
    with pytest.raises(ValueError, match=r"nope\.txt: no such file"):
        read_lines(tmp_path / "nope.txt")
    (tmp_path / "b.txt").write_text("one\ntwo\nthree\n", encoding="utf-8")
    assert read_parallel(tmp_path / "a.gz", tmp_path / "b.txt") == [
        ("eins", "one"), ("zwei", "two"), ("drei", "three")]
    (tmp_path / "c.txt").write_text("one\n \nthree\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"training data: line 2 is empty in .*c\.txt"):
        read_parallel(tmp_path / "a.gz", tmp_path / "c.txt", "training data")
    (tmp_path / "d.txt").write_text("one\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"data: .*a\.gz has 3 lines but .*d\.txt has 1"):
        read_parallel(tmp_path / "a.gz", tmp_path / "d.txt")
