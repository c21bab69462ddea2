"""spader.infra.download: atomic, resumable, retried fetches (file: URLs, paths, a local HTTP server)."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spader.infra.download import DownloadError, anchor_source, fetch, resolve_source

DATA = random.Random(0).randbytes(3 * 1024 * 1024 + 17)
SHA = hashlib.sha256(DATA).hexdigest()


class _Server:
    """A local HTTP server for DATA with Range support and scripted failures."""

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list[str] = []  # one action per request: "truncate", "503", "ignore_range", "ok"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                action = outer.script.pop(0) if outer.script else "ok"
                outer.requests.append(
                    {"path": self.path, "range": self.headers.get("Range"), "action": action}
                )
                if self.path != "/dump.tar.gz":
                    self.send_error(404, "Not Found")
                    return
                if action == "503":
                    self.send_error(503, "busy")
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and action != "ignore_range":
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(DATA):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(DATA)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(DATA) - 1}/{len(DATA)}")
                else:
                    self.send_response(200)
                body = DATA[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if action == "truncate":  # announce everything, send a third, hang up
                    self.wfile.write(body[: len(body) // 3])
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def test_anchor_source_makes_only_relative_local_paths_absolute(tmp_path):
    assert anchor_source("file:resources/demo/a.zip", tmp_path) == str(tmp_path / "resources/demo/a.zip")
    assert anchor_source("resources/demo/a.zip", tmp_path) == str(tmp_path / "resources/demo/a.zip")
    assert anchor_source("file:///abs/a.zip", tmp_path) == "file:///abs/a.zip"
    assert anchor_source("/abs/a.zip", tmp_path) == "/abs/a.zip"
    assert anchor_source("https://x.org/a.zip", tmp_path) == "https://x.org/a.zip"
    (tmp_path / "src.bin").write_bytes(b"abc")  # found from any working directory once anchored
    fetch(anchor_source("file:src.bin", tmp_path), tmp_path / "out" / "dest.bin")
    assert (tmp_path / "out" / "dest.bin").read_bytes() == b"abc"


def test_resolve_source_kinds(tmp_path):
    assert resolve_source("https://x.org/a.tar.gz") == "https://x.org/a.tar.gz"
    assert str(resolve_source("file:///abs/a.zip")) == "/abs/a.zip"
    assert str(resolve_source("file:resources/demo/a.zip")) == "resources/demo/a.zip"
    assert str(resolve_source("resources/demo/a.zip")) == "resources/demo/a.zip"
    with pytest.raises(DownloadError, match="unsupported URL scheme 'ftp'"):
        resolve_source("ftp://x.org/a")


@pytest.mark.parametrize("form", ["file_url_abs", "file_url_rel", "path"])
def test_local_sources(tmp_path, monkeypatch, form):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(DATA)
    monkeypatch.chdir(tmp_path)
    source = {
        "file_url_abs": f"file://{tmp_path}/src/a.bin",
        "file_url_rel": "file:src/a.bin",
        "path": "src/a.bin",
    }[form]
    out = fetch(source, tmp_path / "out" / "a.bin", sha256=SHA, size=len(DATA))
    assert out.read_bytes() == DATA
    assert not (tmp_path / "out" / "a.bin.part").exists()


def test_local_copy_resumes_from_part_file(tmp_path):
    (tmp_path / "a.bin").write_bytes(DATA)
    dest = tmp_path / "out.bin"
    # An interrupted earlier run left a third of the file behind.
    dest.with_name("out.bin.part").write_bytes(DATA[: len(DATA) // 3])
    fetch(str(tmp_path / "a.bin"), dest, sha256=SHA)
    assert dest.read_bytes() == DATA


def test_missing_local_source(tmp_path):
    with pytest.raises(DownloadError, match="nope.bin does not exist"):
        fetch(str(tmp_path / "nope.bin"), tmp_path / "out.bin")


def test_http_interrupted_download_resumes_with_range(server, tmp_path):
    server.script = ["truncate", "truncate", "ok"]
    dest = fetch(f"{server.url}/dump.tar.gz", tmp_path / "d.tar.gz", sha256=SHA, backoff=0.01, timeout=10)
    assert dest.read_bytes() == DATA
    assert [r["action"] for r in server.requests] == ["truncate", "truncate", "ok"]
    assert server.requests[0]["range"] is None
    # Each retry asks for the bytes after what is already on disk, so the offsets grow.
    starts = [int(r["range"].split("=")[1].rstrip("-")) for r in server.requests[1:]]
    assert 0 < starts[0] <= len(DATA) // 3 < starts[1] < len(DATA)
    assert not (tmp_path / "d.tar.gz.part").exists()


def test_http_resume_of_a_part_file_from_an_earlier_run(server, tmp_path):
    dest = tmp_path / "d.tar.gz"
    dest.with_name("d.tar.gz.part").write_bytes(DATA[:1000])
    # no record of its first response: resumable because the checksum will verify the result
    fetch(f"{server.url}/dump.tar.gz", dest, sha256=SHA)
    assert dest.read_bytes() == DATA
    assert server.requests[0]["range"] == "bytes=1000-"


def test_http_complete_part_file_gets_416(server, tmp_path):
    dest = tmp_path / "d.tar.gz"
    dest.with_name("d.tar.gz.part").write_bytes(DATA)
    fetch(f"{server.url}/dump.tar.gz", dest, sha256=SHA)
    assert dest.read_bytes() == DATA and [r["range"] for r in server.requests] == [f"bytes={len(DATA)}-"]


def test_http_server_ignoring_range_restarts_cleanly(server, tmp_path):
    dest = tmp_path / "d.tar.gz"
    dest.with_name("d.tar.gz.part").write_bytes(b"garbage" * 10)
    server.script = ["ignore_range"]
    fetch(f"{server.url}/dump.tar.gz", dest, sha256=SHA)
    assert dest.read_bytes() == DATA


def test_http_transient_errors_are_retried_then_given_up(server, tmp_path):
    server.script = ["503", "ok"]
    fetch(f"{server.url}/dump.tar.gz", tmp_path / "a", backoff=0.01)
    assert [r["action"] for r in server.requests] == ["503", "ok"]
    server.requests.clear()
    server.script = ["503"] * 3
    with pytest.raises(DownloadError, match="giving up after 3 attempts"):
        fetch(f"{server.url}/dump.tar.gz", tmp_path / "b", retries=2, backoff=0.01)
    assert len(server.requests) == 3 and not (tmp_path / "b").exists()


def test_http_404_is_not_retried(server, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(f"{server.url}/missing", tmp_path / "a", backoff=0.01)
    assert len(server.requests) == 1


def test_connection_refused_is_retried_and_reported(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DownloadError, match=r"giving up after 2 attempts \(ConnectError"):
        fetch(f"http://127.0.0.1:{port}/x", tmp_path / "x", retries=1, backoff=0.01, timeout=2)


def test_checksum_and_size_mismatch_leave_nothing(server, tmp_path):
    with pytest.raises(DownloadError, match="sha256 of .* is .*, expected 0000"):
        fetch(f"{server.url}/dump.tar.gz", tmp_path / "a", sha256="0" * 64)
    with pytest.raises(DownloadError, match=f"downloaded {len(DATA)} bytes .* expected 5 \\(size_bytes\\)"):
        fetch(f"{server.url}/dump.tar.gz", tmp_path / "a", size=5)
    assert os.listdir(tmp_path) == []


def test_existing_destination_is_kept_when_it_verifies(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    dest = tmp_path / "dest.bin"
    dest.write_bytes(DATA)
    before = dest.stat().st_mtime_ns
    fetch(str(src), dest, sha256=SHA)
    assert dest.stat().st_mtime_ns == before
    dest.write_bytes(b"stale")  # does not verify: fetched again
    fetch(str(src), dest, sha256=SHA)
    assert dest.read_bytes() == DATA
