"""Downloads served wrong, against a local HTTP server: bodies cut short (declared and
close-delimited), remote content that changes between attempts (with ETag and with
Last-Modified), a server that ignores Range; the record of the first complete download and the
verified copy that survives Snakemake deleting an output it marked incomplete."""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spader.infra import integrity
from spader.infra.download import DownloadError, fetch, keep_path

V1 = random.Random(1).randbytes(2 * 1024 * 1024 + 5)
V2 = random.Random(2).randbytes(2 * 1024 * 1024 + 5)  # same size: only validators or a checksum tell


class Server:
    """Serves ``content`` at /f with Range and If-Range like a real server.

    ``validator`` is ``"etag"``, ``"last_modified"`` or ``"none"``; ``script`` holds one action
    per request: ``ok``, ``cut`` (declares the length, sends a third, hangs up), ``close`` (no
    length, sends a third, closes: indistinguishable from a complete body), ``ignore_range``.
    """

    def __init__(self, validator: str = "etag"):
        self.content, self.version = V1, 1
        self.validator = validator
        self.script: list[str] = []
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _validators(self) -> dict[str, str]:
                if outer.validator == "etag":
                    return {"ETag": f'"v{outer.version}"'}
                if outer.validator == "last_modified":
                    return {"Last-Modified": formatdate(1_700_000_000 + outer.version, usegmt=True)}
                return {}

            def do_GET(self):
                action = outer.script.pop(0) if outer.script else "ok"
                rng, if_range = self.headers.get("Range"), self.headers.get("If-Range")
                outer.requests.append({"range": rng, "if_range": if_range, "action": action})
                data, validators = outer.content, self._validators()
                start = 0
                # If-Range: the range only while the validator still matches, else the whole file
                honour = (
                    rng and action != "ignore_range" and (if_range is None or if_range in validators.values())
                )
                if honour:
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                for k, v in validators.items():
                    self.send_header(k, v)
                if action == "close":  # HTTP/1.0-style body delimited by closing the connection
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 3])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if action == "cut":
                    self.wfile.write(body[: len(body) // 3])
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/f"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def change(self) -> None:
        """The remote file is replaced by another of the same size."""
        self.content, self.version = V2, 2

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(params=["etag", "last_modified"])
def server(request):
    s = Server(request.param)
    yield s
    s.close()


def _fetch(url, dest, **kw):
    sleeps: list[float] = []
    kw.setdefault("backoff", 0.01)
    return fetch(url, dest, sleep=sleeps.append, timeout=10, **kw), sleeps


def _if_range(server) -> str:
    """The validator of the first version, as the resume must send it."""
    return '"v1"' if server.validator == "etag" else formatdate(1_700_000_001, usegmt=True)


def test_resume_sends_the_validator_of_the_first_response(server, tmp_path):
    server.script = ["cut"]
    out, sleeps = _fetch(server.url, tmp_path / "d.bin", retries=3)
    assert out.read_bytes() == V1
    first, second = server.requests
    assert first["range"] is None and first["if_range"] is None
    assert second["range"] == f"bytes={len(V1) // 3}-" and second["if_range"] == _if_range(server)
    assert len(sleeps) == 1  # one retry, through the project's retry policy


def test_changed_content_between_attempts_restarts_from_zero(server, tmp_path):
    """The remote file changes between the cut attempt and the resume: the server answers the
    If-Range with the whole new file, and the result is that file, not V1's head + V2's tail."""
    server.script = ["cut"]
    dest = tmp_path / "d.bin"
    fetch(server.url, dest, retries=3, backoff=0.01, timeout=10, sleep=lambda _: server.change())
    assert server.requests[1]["if_range"] == _if_range(server)
    assert dest.read_bytes() == V2
    assert integrity.read_record(dest).sha256 == hashlib.sha256(V2).hexdigest()


def test_close_delimited_short_body_is_refused_when_a_size_is_expected(tmp_path):
    s = Server("etag")
    try:
        s.script = ["close", "close"]
        out, sleeps = _fetch(s.url, tmp_path / "d.bin", size=len(V1), retries=3)
        assert out.read_bytes() == V1 and len(sleeps) == 2
        assert [r["action"] for r in s.requests] == ["close", "close", "ok"]
        # every attempt short: refused, nothing placed, the bytes kept for a later resume
        s.requests.clear()
        s.script = ["close"] * 3
        with pytest.raises(DownloadError, match=r"giving up after 3 attempts \(connection closed at byte"):
            _fetch(s.url, tmp_path / "x.bin", size=len(V1), retries=2)
        assert not (tmp_path / "x.bin").exists() and (tmp_path / "x.bin.part").exists()
    finally:
        s.close()


def test_declared_length_short_body_resumes(server, tmp_path):
    server.script = ["cut", "cut"]
    out, sleeps = _fetch(server.url, tmp_path / "d.bin", retries=3)
    assert out.read_bytes() == V1 and len(sleeps) == 2
    starts = [int(r["range"].split("=")[1].rstrip("-")) for r in server.requests[1:]]
    assert 0 < starts[0] < starts[1] < len(V1)


def test_server_ignoring_range_restarts_cleanly(server, tmp_path):
    server.script = ["cut", "ignore_range"]
    out, _ = _fetch(server.url, tmp_path / "d.bin", retries=3)
    assert out.read_bytes() == V1


def test_part_of_unknown_origin_is_not_resumed_without_a_checksum(tmp_path):
    s = Server("none")  # no validator: a resume could splice two versions undetected
    try:
        s.script = ["cut"]
        out, _ = _fetch(s.url, tmp_path / "d.bin", retries=3)
        assert out.read_bytes() == V1
        assert s.requests[1]["range"] is None  # started again from zero
    finally:
        s.close()


def test_first_download_is_recorded_and_later_runs_verify_against_it(server, tmp_path, caplog):
    dest = tmp_path / "d.bin"
    _fetch(server.url, dest)
    rec = integrity.read_record(dest)
    assert (rec.size, rec.sha256) == (len(V1), hashlib.sha256(V1).hexdigest())
    assert rec.extra["source"] == server.url

    # a same-size garbled copy is caught by the recorded sha256 and downloaded again
    dest.unlink()
    keep_path(dest).unlink()
    dest.write_bytes(V2)
    caplog.set_level(logging.WARNING)
    _fetch(server.url, dest)
    assert dest.read_bytes() == V1 and "does not verify" in caplog.text

    # the remote file changed: a new transfer that differs from the record is refused
    dest.unlink()
    keep_path(dest).unlink()
    server.change()
    with pytest.raises(DownloadError, match="changed since its first download") as err:
        _fetch(server.url, dest)
    assert str(integrity.record_path(dest)) in str(err.value)
    assert not dest.exists() and not (tmp_path / "d.bin.part").exists()


def test_deleted_output_is_relinked_from_the_verified_copy(server, tmp_path):
    """What ``snakemake --rerun-incomplete`` does to a finished download: delete it, run again."""
    dest = tmp_path / "d.bin"
    _fetch(server.url, dest)
    n = len(server.requests)
    dest.unlink()
    _fetch(server.url, dest)
    assert dest.read_bytes() == V1 and len(server.requests) == n  # not transferred again
    # a damaged verified copy is not trusted
    dest.unlink()
    keep_path(dest).write_bytes(V2)
    _fetch(server.url, dest)
    assert dest.read_bytes() == V1 and len(server.requests) == n + 1


def test_configured_checksum_wins_over_the_record(server, tmp_path):
    dest = tmp_path / "d.bin"
    _fetch(server.url, dest)
    with pytest.raises(DownloadError, match=r"sha256 of .* expected 0{64} \(sha256\)"):
        dest.unlink()
        keep_path(dest).unlink()
        _fetch(server.url, dest, sha256="0" * 64)


def test_a_file_from_another_source_is_replaced(server, tmp_path):
    dest = tmp_path / "d.bin"
    _fetch(server.url, dest)
    other = tmp_path / "other.bin"
    other.write_bytes(V2)
    _fetch(str(other), dest)  # the config now names another source (no checksum either time)
    assert dest.read_bytes() == V2
    assert integrity.read_record(dest).extra["source"] == str(other)
