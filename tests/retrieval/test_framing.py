"""HTTP framing, timeouts and the connection cap, against the real service (``running_service``:
the ``serve`` command line, uvicorn with the service's protocol, BM25 on the fixture index) over
raw sockets: every malformed request the HTTP layer refuses is answered with a JSON 4xx (never
uvicorn's plain text), headers and bodies that do not arrive in time get a JSON 408, a silent
connection is closed, a connection over the cap gets a JSON 503, and the service keeps serving."""

from __future__ import annotations

import json
import socket
import time

import pytest

from spader.retrieval.backend import SearchSettings
from spader.retrieval.service import running_service

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.5
MAX_CONNECTIONS = 6
GOOD = b'{"queries": ["Winter Quay dock workers"], "topk": 1}'
HEAD = b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n"


@pytest.fixture(scope="module")
def service(bm25_index, tmp_path_factory):
    settings = {
        "bm25": {"k1": 0.9, "b": 0.4},
        "initial_k": 5,
        "topk": 3,
        "reranker": {"model": None},
        "service": {
            "startup_timeout_s": 300,
            "header_timeout_s": HEADER_TIMEOUT_S,
            "body_timeout_s": BODY_TIMEOUT_S,
            "max_connections": MAX_CONNECTIONS,
        },
    }
    log = tmp_path_factory.mktemp("framing") / "service.log"
    with running_service(bm25_index, SearchSettings.from_config(settings), log_path=log) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        yield host, int(port), log


def _connect(service) -> socket.socket:
    sock = socket.create_connection(service[:2], timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response (status, headers, body by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


def _exchange(service, *parts: bytes, pause: float = 0.0) -> tuple[int, dict[str, str], dict]:
    with _connect(service) as sock:
        for part in parts:
            sock.sendall(part)
            time.sleep(pause)
        status, headers, body = _read_response(sock)
    assert headers["content-type"] == "application/json", (status, headers, body)
    return status, headers, json.loads(body)


def _ok(service) -> None:
    status, _, body = _exchange(service, HEAD + b"Content-Length: %d\r\n\r\n" % len(GOOD) + GOOD)
    assert status == 200 and body["result"][0][0]["id"] == "1002__0"


FRAMING = [
    (
        "bad-chunk-size",
        HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        400,
        "illegal chunk header",
    ),
    (
        "negative-chunk-size",
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n-2\r\n{}\r\n0\r\n\r\n",
        400,
        "chunk header",
    ),
    (
        "bad-chunk-footer",
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
        400,
        "malformed chunk footer",
    ),
    ("negative-content-length", HEAD + b"Content-Length: -5\r\n\r\n{}", 400, "bad Content-Length"),
    ("non-numeric-content-length", HEAD + b"Content-Length: 1e3\r\n\r\n{}", 400, "bad Content-Length"),
    (
        "duplicate-content-length",
        HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        400,
        "conflicting Content-Length headers",
    ),
    ("nul-in-a-header", HEAD + b"X-Trace: a\x00b\r\nContent-Length: 2\r\n\r\n{}", 400, "illegal header line"),
    (
        "bare-cr-in-a-header",
        HEAD + b"X-Trace: a\rb\r\nContent-Length: 2\r\n\r\n{}",
        400,
        "illegal header line",
    ),
    ("header-without-colon", HEAD + b"Content-Length 2\r\n\r\n{}", 400, "illegal header line"),
    ("space-before-colon", HEAD + b"Content-Length : 2\r\n\r\n{}", 400, "illegal header line"),
    (
        "gzip-transfer-encoding",
        HEAD + b"Transfer-Encoding: gzip\r\n\r\n{}",
        400,
        "Only Transfer-Encoding: chunked",
    ),
    ("garbage-request-line", b"GARBAGE\r\n\r\n", 400, "illegal request line"),
    (
        "control-char-in-target",
        b"POST /re\x01trieve HTTP/1.1\r\nHost: x\r\n\r\n",
        400,
        "illegal request line",
    ),
    ("non-ascii-target", "POST /réponse HTTP/1.1\r\nHost: x\r\n\r\n".encode(), 400, "illegal request line"),
    ("tls-client-hello", bytes.fromhex("16030100c8010000c40303") + b"\x00" * 40, 400, "illegal request line"),
    (
        "no-host-header",
        b"POST /retrieve HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        400,
        "Missing mandatory Host",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("cid", "raw", "status", "fragment"), FRAMING, ids=[c[0] for c in FRAMING])
def test_malformed_framing_gets_a_json_4xx(service, cid, raw, status, fragment):
    got, headers, body = _exchange(service, raw)
    assert got == status and fragment in body["error"], body
    assert body["error"].startswith("malformed HTTP request: ") and headers["connection"] == "close"


@pytest.mark.slow
def test_headers_over_the_size_limit_arriving_in_pieces_get_431(service):
    status, _, body = _exchange(service, HEAD + b"X-Big: " + b"a" * 12000, b"a" * 12000, pause=0.2)
    assert status == 431 and "malformed HTTP request" in body["error"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("parts", "what", "limit"),
    [
        ((HEAD + b"Content-Le",), "headers", HEADER_TIMEOUT_S),
        ((HEAD + b"Content-Length: 40\r\n\r\n" + GOOD[:10],), "body", BODY_TIMEOUT_S),
        ((HEAD + b'Transfer-Encoding: chunked\r\n\r\n4\r\n{"qu\r\n',), "body", BODY_TIMEOUT_S),
    ],
    ids=["half-sent-headers", "half-sent-body", "unfinished-chunked-body"],
)
def test_requests_that_do_not_arrive_in_time_get_a_json_408(service, parts, what, limit):
    started = time.monotonic()
    status, _, body = _exchange(service, *parts)
    took = time.monotonic() - started
    assert status == 408 and f"retrieval.service.{what[:-1] if what == 'headers' else what}" in body["error"]
    assert limit * 0.9 <= took < limit + 5


@pytest.mark.slow
def test_a_slow_trickle_of_header_bytes_is_cut_at_the_deadline(service):
    """A byte every 0.25 s (slowloris): the deadline counts from the first byte, not the last."""
    started = time.monotonic()
    with _connect(service) as sock:
        sock.settimeout(10)
        status = None
        for byte in HEAD + b"X-Slow: " + b"z" * 40:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.25)
            if time.monotonic() - started > HEADER_TIMEOUT_S + 1:
                status = _read_response(sock)[0]
                break
    assert status == 408 and time.monotonic() - started < HEADER_TIMEOUT_S + 3


@pytest.mark.slow
def test_a_connection_that_sends_nothing_is_closed(service):
    started = time.monotonic()
    with _connect(service) as sock:
        assert sock.recv(100) == b""  # closed by the service, without an answer
    assert HEADER_TIMEOUT_S * 0.9 <= time.monotonic() - started < HEADER_TIMEOUT_S + 5


@pytest.mark.slow
def test_connections_over_the_cap_get_a_json_503_and_the_service_recovers(service):
    held = [_connect(service) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)
        status, _, body = _exchange(service, HEAD + b"Content-Length: %d\r\n\r\n" % len(GOOD) + GOOD)
        assert status == 503 and f"max_connections: {MAX_CONNECTIONS}" in body["error"]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    _ok(service)


@pytest.mark.slow
def test_unknown_paths_and_methods_answer_json_and_the_service_keeps_serving(service):
    assert _exchange(service, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")[0:3:2] == (
        404,
        {"error": "Not Found: GET /nope"},
    )
    status, _, body = _exchange(service, b"GET /retrieve HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and body["error"].startswith("Method Not Allowed")
    upgrade = b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    status, _, body = _exchange(service, b"GET /health HTTP/1.1\r\nHost: x\r\n" + upgrade + b"\r\n")
    assert status == 200 and body["status"] == "ok"  # the upgrade is ignored: plain HTTP
    _ok(service)
    log = service[2].read_text()
    assert "Traceback" not in log


def test_absolute_form_request_targets_are_routed_by_their_path(service):
    """HTTP/1.1 servers must accept ``GET http://host:port/path`` (what a client talking to a proxy
    sends); it was answered 404. Held out: an upper-case scheme with a query string, an unknown path."""
    host, port, _ = service
    authority = f"{host}:{port}".encode()
    status, _, body = _exchange(
        service, b"GET http://%s/health HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority)
    )
    assert status == 200 and body["status"] == "ok"
    target = b"http://%s/retrieve" % authority
    request = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        target,
        authority,
        len(GOOD),
        GOOD,
    )
    status, _, body = _exchange(service, request)
    assert status == 200 and body["result"][0][0]["id"] == "1002__0"
    status, _, body = _exchange(
        service, b"GET HTTP://%s/stats?x=1 HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority)
    )
    assert status == 200 and "requests" in body
    status, _, body = _exchange(
        service, b"GET http://%s/search HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority)
    )
    assert status == 404 and body["error"] == "Not Found: GET /search"
