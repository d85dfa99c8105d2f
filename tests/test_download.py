"""Tests for npformer.data.download against a local http.server on 127.0.0.1 (no internet)."""

import functools
import hashlib
import os
import http.server
import socket
import threading
import time
from pathlib import Path

import pytest

from npformer.cli.main import main
from npformer.data.download import (DATASETS, MULTI30K_FILES, download, download_multi30k,
                                    find_downloaded, sha256_file)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DATA_DIR = SHARED / "multi30k"
SHAKESPEARE_DIR = SHARED / "tinyshakespeare"               # char-rnn's input.txt, a local mirror
SHAKESPEARE = DATASETS["tinyshakespeare"]
MAX_REQUESTS = 20                                          # a test server answers no more


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    """Make sure urllib talks to 127.0.0.1 directly even if a proxy is configured."""
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


class Server:
    """A static file server for ``directory`` on 127.0.0.1 that counts GET requests. Bounded:
    it answers at most MAX_REQUESTS of them (then 503), and a client that sends nothing for 5 s
    is dropped."""

    def __init__(self, directory: Path):
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            timeout = 5

            def do_GET(self):
                server.requests.append(self.path)
                if len(server.requests) > MAX_REQUESTS:
                    self.send_error(503, "this test server has answered enough requests")
                    return
                super().do_GET()

            def log_message(self, *args):   # keep pytest output clean
                pass

        handler = functools.partial(Handler, directory=str(directory))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def serve():
    servers = []

    def start(directory):
        servers.append(Server(Path(directory)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def real_server(serve):
    if not all((DATA_DIR / name).is_file() for name in MULTI30K_FILES):
        pytest.skip(f"Multi30k data not found at {DATA_DIR} (see ../shared/data/multi30k)")
    return serve(DATA_DIR)


def shared_readme(folder: Path) -> str:
    """The text of the local mirror's README.md in ``folder`` (the tables' source); the test
    skips where the mirror is absent."""
    readme = folder / "README.md"
    if not readme.is_file():
        pytest.skip(f"{readme} not found")
    return readme.read_text(encoding="utf-8")


def test_table_matches_shared_readme():
    text = shared_readme(DATA_DIR)
    for name, digest in MULTI30K_FILES.items():
        assert f"{digest}  {name}" in text


def test_download_all_then_nothing(real_server, tmp_path):
    dest = tmp_path / "new" / "multi30k"                   # created on demand
    paths = download_multi30k(dest, base_url=real_server.url, progress=False)
    assert paths == [dest / name for name in MULTI30K_FILES]
    for name, digest in MULTI30K_FILES.items():
        assert sha256_file(dest / name) == digest
        assert (dest / name).read_bytes() == (DATA_DIR / name).read_bytes()
    assert sorted(real_server.requests) == sorted(f"/{name}" for name in MULTI30K_FILES)
    assert sorted(p.name for p in dest.iterdir()) == sorted(MULTI30K_FILES)  # no temp files

    real_server.requests.clear()
    again = download_multi30k(dest, base_url=real_server.url, progress=False)
    assert again == paths and real_server.requests == []


def test_subset_and_progress_bar(real_server, tmp_path, capsys):
    paths = download_multi30k(tmp_path, base_url=real_server.url.rstrip("/"),
                              files=["val.en.gz"], progress=True)
    assert paths == [tmp_path / "val.en.gz"]
    assert real_server.requests == ["/val.en.gz"]
    assert "val.en.gz" in capsys.readouterr().err          # tqdm writes to stderr


def test_wrong_existing_file_is_replaced(real_server, tmp_path):
    (tmp_path / "val.de.gz").write_bytes(b"stale")
    download_multi30k(tmp_path, base_url=real_server.url, files=["val.de.gz"], progress=False)
    assert sha256_file(tmp_path / "val.de.gz") == MULTI30K_FILES["val.de.gz"]
    assert real_server.requests == ["/val.de.gz"]


def test_wrong_bytes_raise_and_leave_nothing(serve, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "val.de.gz").write_bytes(b"these are not the Multi30k bytes")
    actual = hashlib.sha256(b"these are not the Multi30k bytes").hexdigest()
    server = serve(served)
    dest = tmp_path / "dest"
    with pytest.raises(ValueError) as info:
        download_multi30k(dest, base_url=server.url, files=["val.de.gz"], progress=False)
    msg = str(info.value)
    assert "val.de.gz" in msg and MULTI30K_FILES["val.de.gz"] in msg and actual in msg
    assert list(dest.iterdir()) == []


def test_missing_file_on_server_names_url(serve, tmp_path):
    (tmp_path / "empty").mkdir()
    server = serve(tmp_path / "empty")
    with pytest.raises(OSError, match=rf"{server.url}val.en.gz.*404"):
        download_multi30k(tmp_path / "dest", base_url=server.url, files=["val.en.gz"],
                          progress=False)
    assert list((tmp_path / "dest").iterdir()) == []


def test_unreachable_url_names_url(tmp_path):
    with socket.socket() as sock:                          # find a port, then close it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    with pytest.raises(OSError, match=rf"could not download {url}train.de.gz"):
        download_multi30k(tmp_path, base_url=url, files=["train.de.gz"], timeout=5,
                          progress=False)
    assert list(tmp_path.iterdir()) == []


def test_custom_files_mapping(serve, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "test_2017_flickr.de.gz").write_bytes(b"abc")
    server = serve(served)
    digest = hashlib.sha256(b"abc").hexdigest()
    paths = download_multi30k(tmp_path / "dest", base_url=server.url,
                              files={"test_2017_flickr.de.gz": digest}, progress=False)
    assert [p.read_bytes() for p in paths] == [b"abc"]
    umask = os.umask(0)
    os.umask(umask)
    assert paths[0].stat().st_mode & 0o777 == 0o666 & ~umask    # not mkstemp's 0600
    assert [p.name for p in (tmp_path / "dest").iterdir()] == ["test_2017_flickr.de.gz"]


@pytest.mark.parametrize("kwargs, match", [
    ({"files": ["nope.gz"]}, "unknown file 'nope.gz'"),
    ({"files": "val.de.gz"}, "files must be a list"),
    ({"files": {"../x": "0" * 64}}, "not a plain file name"),
    ({"files": {"x": "abc"}}, "sha256 of 'x'"),
    ({"base_url": "ftp://example.org/"}, "base_url"),
    ({"timeout": 0}, "timeout"),
])
def test_bad_arguments(tmp_path, kwargs, match):
    kwargs.setdefault("base_url", "http://127.0.0.1:9/")    # never the real host
    with pytest.raises(ValueError, match=match):
        download_multi30k(tmp_path, progress=False, **kwargs)


class Stalling:
    """A server on 127.0.0.1 that accepts connections and never answers, for at most 30 s.
    Closing a socket does not wake a thread blocked in ``accept``, so the thread waits in short
    turns (0.05 s) and looks at a stop flag between them: ``close`` returns at once."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.held = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()

    def _hold(self):
        deadline = time.monotonic() + 30
        while not self.stop.is_set() and len(self.held) < 4 and time.monotonic() < deadline:
            try:
                self.held.append(self.sock.accept()[0])
            except (socket.timeout, TimeoutError):
                continue

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def shakespeare_server(serve):
    if not (SHAKESPEARE_DIR / "input.txt").is_file():
        pytest.skip(f"tiny Shakespeare not found at {SHAKESPEARE_DIR} (see ../shared/data)")
    return serve(SHAKESPEARE_DIR)


def test_shakespeare_table_matches_shared_readme():
    (digest,) = SHAKESPEARE.files.values()
    assert f"| input.txt | 1,115,394 | 40,000 | {digest} |" in shared_readme(SHAKESPEARE_DIR)
    assert SHAKESPEARE.base_url + "input.txt" == (
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt")


def test_download_tinyshakespeare_into_the_data_folder(shakespeare_server, tmp_path, monkeypatch,
                                                       capsys):
    monkeypatch.setenv("NPFORMER_DATA", str(tmp_path / "data"))     # the default folder
    assert find_downloaded("tinyshakespeare") is None
    assert main(["download", "tinyshakespeare", "--quiet",
                 "--base-url", shakespeare_server.url]) == 0
    path = tmp_path / "data" / "tinyshakespeare.txt"
    assert capsys.readouterr().out == f"{path}\n"
    assert shakespeare_server.requests == ["/input.txt"]             # char-rnn's file name
    assert path.read_bytes() == (SHAKESPEARE_DIR / "input.txt").read_bytes()
    assert [p.name for p in path.parent.iterdir()] == ["tinyshakespeare.txt"]   # no temp file
    assert find_downloaded("tinyshakespeare") == path
    assert download("tinyshakespeare", base_url=shakespeare_server.url, progress=False) == [path]
    assert shakespeare_server.requests == ["/input.txt"]             # present: not fetched again


@pytest.mark.parametrize("stale", [False, True], ids=["fresh", "over-a-wrong-file"])
@pytest.mark.parametrize("served", [b"First Citizen:\nBefore we proceed", None],
                         ids=["truncated", "tampered"])
def test_a_wrong_download_is_removed_and_names_both_digests(serve, tmp_path, served, stale):
    if served is None:
        served = b"x" * 1_115_394                                    # the right size, wrong bytes
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "input.txt").write_bytes(served)
    server = serve(tmp_path / "served")
    dest = tmp_path / "dest"
    if stale:                                    # a wrong file already there goes too
        dest.mkdir()
        (dest / "tinyshakespeare.txt").write_text("an old, wrong copy")
    with pytest.raises(ValueError) as info:
        download("tinyshakespeare", dest, base_url=server.url, progress=False)
    msg = str(info.value)
    (expected,) = SHAKESPEARE.files.values()
    assert str(dest / "tinyshakespeare.txt") in msg
    assert expected in msg and hashlib.sha256(served).hexdigest() in msg
    assert list(dest.iterdir()) == []                                # no file, no .partial


def test_a_wrong_file_in_the_data_folder_is_named(tmp_path):
    (tmp_path / "tinyshakespeare.txt").write_text("not Shakespeare")
    with pytest.raises(ValueError, match=r"tinyshakespeare.txt has the wrong sha256.*"
                                         r"npformer download tinyshakespeare"):
        find_downloaded("tinyshakespeare", tmp_path)


def test_a_stalling_server_times_out_with_a_clear_message(tmp_path, capsys):
    server = Stalling()
    try:
        assert main(["download", "tinyshakespeare", "--quiet", "--dest", str(tmp_path),
                     "--base-url", server.url, "--timeout", "0.5"]) == 1
    finally:
        server.close()
    err = capsys.readouterr().err
    assert f"could not download {server.url}input.txt" in err
    assert "sent nothing for 0.5 s" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_data_set_lists_the_known_ones(tmp_path, capsys):
    with pytest.raises(ValueError,
                       match="expected one of multi30k, tinyshakespeare, got 'shakespeare'"):
        download("shakespeare", tmp_path, progress=False)
    with pytest.raises(SystemExit) as exit_:
        main(["download", "shakespeare"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "'shakespeare'" in err and "multi30k" in err and "tinyshakespeare" in err


# -- npformer lm --data tinyshakespeare: the download, by name ------------------------------------

LM_TINY = ["--layers", "1", "--d-model", "16", "--n-heads", "2", "--context", "16",
           "--batch-size", "4", "--warmup-steps", "1", "--max-steps", "1", "--sample-tokens", "0",
           "--quiet"]
TEXT = "".join(f"{w} the quick brown fox.\n" for w in ["ROMEO:", "JULIET:", "Nurse:"] * 20)


@pytest.fixture
def downloaded(tmp_path, monkeypatch):
    """A data folder ($NPFORMER_DATA) holding a stand-in tinyshakespeare.txt (the table's digest
    made its own, so that no test trains on the whole text), and an empty working folder."""
    import dataclasses
    data = tmp_path / "data"
    data.mkdir()
    (data / "tinyshakespeare.txt").write_text(TEXT, encoding="utf-8")
    digest = sha256_file(data / "tinyshakespeare.txt")
    monkeypatch.setitem(DATASETS, "tinyshakespeare", dataclasses.replace(
        SHAKESPEARE, files={"tinyshakespeare.txt": digest}))
    monkeypatch.setenv("NPFORMER_DATA", str(data))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return data / "tinyshakespeare.txt"


def test_lm_data_by_name_reads_the_download(downloaded, capsys):
    assert main(["lm", "--data", "tinyshakespeare", "--out", "run", *LM_TINY]) == 0
    out = capsys.readouterr().out
    assert f"--data tinyshakespeare: read the download {downloaded}\n" in out
    assert f"\n{downloaded}: " in out                                 # the summary line


def test_lm_data_by_name_not_downloaded_says_the_command(downloaded, capsys):
    downloaded.unlink()
    assert main(["lm", "--data", "tinyshakespeare", "--out", "run", *LM_TINY]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not downloaded yet" in err
    assert "fetch it with `npformer download tinyshakespeare`" in err
    assert not (downloaded.parent.parent / "work" / "run").exists()


def test_lm_data_a_file_of_that_name_wins_and_is_named(downloaded, capsys):
    local = downloaded.parent.parent / "work" / "tinyshakespeare"
    local.write_text(TEXT.upper(), encoding="utf-8")
    assert main(["lm", "--data", "tinyshakespeare", "--out", "run", *LM_TINY]) == 0
    out = capsys.readouterr().out
    assert f"--data tinyshakespeare: read the file {local} in the working folder" in out
    assert "read the download" not in out


def test_lm_data_a_folder_of_that_name_does_not_hide_the_download(downloaded, capsys):
    (downloaded.parent.parent / "work" / "tinyshakespeare").mkdir()  # char-rnn's data/ layout
    assert main(["lm", "--data", "tinyshakespeare", "--out", "run", *LM_TINY]) == 0
    out = capsys.readouterr().out
    assert f"--data tinyshakespeare: read the download {downloaded}\n" in out
    assert "in the working folder" not in out
