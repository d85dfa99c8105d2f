"""Tests for npformer.data.multi30k: real Multi30k files (skipped if absent) and tmp files."""

import gzip
from pathlib import Path

import pytest

from npformer.data.multi30k import (
    SPLITS,
    MissingDataError,
    available_splits,
    load_split,
    read_lines,
    resolve_data_dir,
)

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


@pytest.fixture(scope="module")
def data_dir():
    if not (DATA_DIR / "val.de.gz").is_file():
        pytest.skip(f"Multi30k data not found at {DATA_DIR} (see ../shared/data/multi30k)")
    return DATA_DIR


def write_gz(path: Path, lines):
    path.write_bytes(gzip.compress("".join(l + "\n" for l in lines).encode("utf-8")))


# --- real data --------------------------------------------------------------------------

@pytest.mark.parametrize("split, size", [("train", 29000), ("val", 1014),
                                         ("test_2016_flickr", 1000)])
def test_split_sizes(data_dir, split, size):
    pairs = load_split(data_dir, split)
    assert len(pairs) == size
    assert all(isinstance(de, str) and isinstance(en, str) for de, en in pairs)
    assert all(de.strip() and en.strip() for de, en in pairs)


def test_first_val_pair_is_sane(data_dir):
    de, en = load_split(data_dir, "val")[0]
    assert de == "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen"
    assert en == "A group of men are loading cotton onto a truck"


def test_first_train_pair_is_german_then_english(data_dir):
    de, en = load_split(data_dir, "train")[0]
    assert "\n" not in de and "\n" not in en
    assert de.split()[0] in {"Zwei", "Ein", "Eine", "Mehrere"}
    assert en.split()[0] in {"Two", "A", "An", "Several"}


def test_en_de_is_swap_of_de_en(data_dir):
    de_en = load_split(data_dir, "val", "de", "en")
    en_de = load_split(data_dir, "val", src="en", tgt="de")
    assert en_de == [(en, de) for de, en in de_en]
    assert en_de != de_en


def test_available_splits_real(data_dir):
    assert set(SPLITS) <= set(available_splits(data_dir))


def test_resolve_data_dir(monkeypatch, tmp_path):
    assert resolve_data_dir(tmp_path) == tmp_path
    assert resolve_data_dir(str(tmp_path)) == tmp_path
    monkeypatch.setenv("NPFORMER_DATA", str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"   # the argument wins
    monkeypatch.delenv("NPFORMER_DATA")
    assert resolve_data_dir() == Path.home() / ".cache" / "npformer" / "multi30k"
    with pytest.raises(ValueError, match="data_dir"):
        resolve_data_dir("")
    with pytest.raises(ValueError, match="data_dir"):
        resolve_data_dir(42)


def test_load_split_uses_env_var(monkeypatch, tmp_path):
    write_gz(tmp_path / "mini.de.gz", ["ein Hund"])
    write_gz(tmp_path / "mini.en.gz", ["a dog"])
    monkeypatch.setenv("NPFORMER_DATA", str(tmp_path))
    assert load_split(None, "mini") == [("ein Hund", "a dog")]


# --- read_lines -------------------------------------------------------------------------

def test_read_lines_keeps_inner_and_edge_spaces(tmp_path):
    lines = ["a  b ", " c", "", "ä ß"]
    write_gz(tmp_path / "x.gz", lines)
    (tmp_path / "x.txt").write_bytes("a  b \r\n c\n\nä ß".encode("utf-8"))  # no final newline
    assert read_lines(tmp_path / "x.gz") == lines
    assert read_lines(tmp_path / "x.txt") == lines


def test_read_lines_does_not_split_on_unicode_line_separators(tmp_path):
    (tmp_path / "x").write_text("a\u2028b\x85c\n", encoding="utf-8")
    assert read_lines(tmp_path / "x") == ["a\u2028b\x85c"]


def test_read_lines_empty_file(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    assert read_lines(tmp_path / "empty") == []


def test_corrupt_gzip(tmp_path):
    good = gzip.compress(b"one\ntwo\n" * 100)
    (tmp_path / "bad.de.gz").write_bytes(b"not gzip at all")
    (tmp_path / "cut.de.gz").write_bytes(good[: len(good) // 2])
    for name in ("bad.de.gz", "cut.de.gz"):
        with pytest.raises(ValueError, match=rf"{name}.*gzip"):
            read_lines(tmp_path / name)


@pytest.mark.parametrize("compressed", [True, False])
def test_invalid_utf8_names_file_and_line(tmp_path, compressed):
    raw = "erste Zeile\nzweite Zeile\n".encode() + b"dritte \xff Zeile\n"
    path = tmp_path / ("latin.de.gz" if compressed else "latin.de")
    path.write_bytes(gzip.compress(raw) if compressed else raw)
    with pytest.raises(ValueError, match=rf"{path.name}, line 3: not valid UTF-8"):
        read_lines(path)


# --- load_split errors and fallbacks --------------------------------------------------

def test_mismatched_line_counts(tmp_path):
    write_gz(tmp_path / "train.de.gz", ["eins", "zwei", "drei"])
    write_gz(tmp_path / "train.en.gz", ["one", "two"])
    with pytest.raises(ValueError) as info:
        load_split(tmp_path, "train")
    msg = str(info.value)
    assert "train.de.gz has 3 lines" in msg and "train.en.gz has 2" in msg


def test_missing_split_lists_files_and_present_splits(tmp_path):
    write_gz(tmp_path / "val.de.gz", ["x"])
    write_gz(tmp_path / "val.en.gz", ["x"])
    write_gz(tmp_path / "half.de.gz", ["x"])          # no English side: not a split
    with pytest.raises(MissingDataError) as info:
        load_split(tmp_path, "test_2017_flickr")
    msg = str(info.value)
    assert "test_2017_flickr.de.gz" in msg and "test_2017_flickr.de" in msg
    assert "splits present: val" in msg and "half" not in msg
    assert isinstance(info.value, ValueError) and isinstance(info.value, FileNotFoundError)
    with pytest.raises(MissingDataError, match="half.en.gz"):
        load_split(tmp_path, "half")


def test_missing_data_dir(tmp_path):
    with pytest.raises(MissingDataError, match="does not exist.*npformer download multi30k"):
        load_split(tmp_path / "nowhere", "train")


def test_uncompressed_fallback_and_any_split_name(tmp_path):
    (tmp_path / "test_2018_flickr.de").write_text("ein Hund\nzwei Katzen\n", encoding="utf-8")
    write_gz(tmp_path / "test_2018_flickr.en.gz", ["a dog", "two cats"])
    assert load_split(tmp_path, "test_2018_flickr") == [("ein Hund", "a dog"),
                                                       ("zwei Katzen", "two cats")]
    assert available_splits(tmp_path) == ["test_2018_flickr"]


def test_gz_preferred_over_uncompressed(tmp_path):
    write_gz(tmp_path / "val.de.gz", ["aus gz"])
    (tmp_path / "val.de").write_text("aus text\n", encoding="utf-8")
    write_gz(tmp_path / "val.en.gz", ["from gz"])
    assert load_split(tmp_path, "val") == [("aus gz", "from gz")]


@pytest.mark.parametrize("src, tgt, bad", [("fr", "en", "src"), ("de", "xx", "tgt"),
                                           ("de", "de", "differ")])
def test_bad_languages(tmp_path, src, tgt, bad):
    with pytest.raises(ValueError, match=bad):
        load_split(tmp_path, "train", src, tgt)


@pytest.mark.parametrize("split", ["", "../train", None])
def test_bad_split_name(tmp_path, split):
    with pytest.raises(ValueError, match="split"):
        load_split(tmp_path, split)
