"""Tests for npformer.data.download against a local http.server on 127.0.0.1 (no internet)."""

import functools
import hashlib
import os
import http.server
import socket
import threading
from pathlib import Path

import pytest

from npformer.data.download import MULTI30K_FILES, download_multi30k, sha256_file

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    """Make sure urllib talks to 127.0.0.1 directly even if a proxy is configured."""
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


class Server:
    """A static file server for ``directory`` on 127.0.0.1 that counts GET requests."""

    def __init__(self, directory: Path):
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
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


def test_table_matches_shared_readme():
    readme = DATA_DIR / "README.md"
    if not readme.is_file():
        pytest.skip(f"{readme} not found")
    text = readme.read_text(encoding="utf-8")
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
