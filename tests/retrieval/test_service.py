"""The retrieval service: every bad input gets a 4xx with a message and the service
keeps serving; concurrent requests are merged; an HTTP round trip on 127.0.0.1 through
running_service and RetrievalClient; start-up refused for a missing index."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from fastapi.testclient import TestClient

from spader.config import resolved_config
from spader.retrieval.app import create_app
from spader.retrieval.backend import Bm25RerankBackend, SearchSettings
from spader.retrieval.client import RetrievalClient, RetrievalRequestError
from spader.retrieval.errors import ServiceError
from spader.retrieval.service import running_service

REPO = Path(__file__).resolve().parents[2]
QUERIES = ["films directed by Ilse Varga", "river flowing into Lake Ørnes", "Saint-Malo Express album"]


@pytest.fixture(scope="module")
def settings(tiny_reranker) -> dict:
    """config["retrieval"] as the rules pass it, with the tiny reranker and small limits."""
    cfg = resolved_config(REPO / "config" / "config.yaml")["retrieval"]
    cfg["reranker"].update(model="tiny:reranker", path=str(tiny_reranker), batch_size=8, fp16=False)
    cfg["initial_k"], cfg["topk"] = 6, 3
    cfg["service"].update(
        max_queries_per_request=4, max_query_chars=40, startup_timeout_s=120, retries=1, slice_queries=4
    )
    return cfg


@pytest.fixture(scope="module")
def backend(bm25_index, settings):
    return Bm25RerankBackend(bm25_index, SearchSettings.from_config(settings))


@pytest.fixture(scope="module")
def client(backend):
    with TestClient(create_app(lambda: backend)) as c:
        yield c


def test_settings_from_config_yaml(settings, tiny_reranker):
    s = SearchSettings.from_config(settings)
    assert (s.k1, s.b, s.initial_k, s.topk) == (0.9, 0.4, 6, 3)
    assert s.reranker == str(tiny_reranker)  # the resolved path wins over the model name
    assert (s.max_queries_per_request, s.max_query_chars, s.host) == (4, 40, "127.0.0.1")
    off = dict(settings, reranker={"model": None, "batch_size": 8, "max_length": 512, "fp16": True})
    assert SearchSettings.from_config(off).reranker is None
    with pytest.raises(ValueError, match=r"topk \(9\) <= initial_k \(6\)"):
        SearchSettings.from_config(dict(settings, topk=9))


def test_retrieve_and_health(client, backend):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["documents"] == 11 and health["reranker"].endswith("reranker")
    r = client.post("/retrieve", json={"queries": QUERIES, "return_scores": True})
    assert r.status_code == 200
    result = r.json()["result"]
    expected = backend.search(QUERIES, topk=3, initial_k=6)
    assert [[p["id"] for p in hits] for hits in result] == [[p.id for p in hits] for hits in expected]
    assert all(set(p) == {"id", "title", "text", "score"} for hits in result for p in hits)
    plain = client.post("/retrieve", json={"queries": QUERIES[:1], "topk": 1, "initial_k": 2}).json()[
        "result"
    ]
    assert len(plain) == 1 and len(plain[0]) == 1 and set(plain[0][0]) == {"id", "title", "text"}


BAD = [
    # (body, status, message) -- one row per bad input named in the issue
    (b'{"queries": ["a"', 400, "not valid JSON"),  # invalid JSON
    (b'["films"]', 400, "must be a JSON object"),  # not an object
    (b"\xff\xfe", 400, "not valid JSON"),  # not even UTF-8
    (b'{"topk": 3}', 422, "'queries' must be a non-empty list"),  # missing list
    (b'{"queries": []}', 422, "'queries' must be a non-empty list"),  # empty list
    (b'{"queries": "films"}', 422, "'queries' must be a non-empty list"),  # a string, not a list
    (b'{"queries": ["films", ""]}', 422, "queries[1] is empty"),  # empty query
    (b'{"queries": ["films", "   "]}', 422, "queries[1] is empty"),  # blank query
    (b'{"queries": ["films", 42]}', 422, "queries[1] must be a string, got int"),  # non-string query
    (b'{"queries": [null]}', 422, "queries[0] must be a string, got NoneType"),
    (
        json.dumps({"queries": ["x" * 41]}).encode(),
        413,
        "queries[0] has 41 characters; the limit is 40",
    ),  # oversized
    (
        json.dumps({"queries": ["a"] * 5}).encode(),
        413,
        "5 queries in one request; the limit is 4",
    ),  # batch too big
    (b'{"queries": ["films"], "topk": 0}', 422, "'topk' must be between 1 and initial_k (6), got 0"),
    (b'{"queries": ["films"], "topk": -2}', 422, "'topk' must be between 1 and initial_k (6), got -2"),
    (
        b'{"queries": ["films"], "topk": 7}',
        422,
        "'topk' must be between 1 and initial_k (6), got 7",
    ),  # > initial_k
    (b'{"queries": ["films"], "topk": 3, "initial_k": 2}', 422, "between 1 and initial_k (2), got 3"),
    (b'{"queries": ["films"], "initial_k": 0}', 422, "'initial_k' must be between 1 and 1000"),
    (b'{"queries": ["films"], "topk": "5"}', 422, "'topk' must be an integer"),
    (b'{"queries": ["films"], "topk": true}', 422, "'topk' must be an integer"),
    (b'{"queries": ["films"], "return_scores": "yes"}', 422, "'return_scores' must be true or false"),
    (
        b'{"queries": ["films"], "topk_retrieval": 10}',
        422,
        "unknown field(s) topk_retrieval",
    ),  # Search-R1 key
]


@pytest.mark.parametrize("body, status, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_gets_4xx_with_message_and_service_keeps_serving(client, body, status, message):
    r = client.post("/retrieve", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    assert message in r.json()["error"]
    assert client.get("/health").status_code == 200
    ok = client.post("/retrieve", json={"queries": ["Lucene index"], "topk": 1})
    assert ok.status_code == 200 and ok.json()["result"][0][0]["id"] == "5001__0"


def test_concurrent_requests_are_merged_into_few_searches(backend, monkeypatch):
    calls = []
    candidates = backend.candidates

    def slow_candidates(queries, **kw):
        calls.append(list(queries))
        time.sleep(0.3 if len(calls) == 1 else 0)  # requests arriving meanwhile queue up
        return candidates(queries, **kw)

    monkeypatch.setattr(backend, "candidates", slow_candidates)
    single = [[q] for q in ["Lucene", "Winter Quay", "Kvitelva river", "Halcyon album"] * 3]
    answers = [None] * len(single)
    with TestClient(create_app(lambda: backend)) as fresh:  # a new app: an empty result cache

        def send(i):
            answers[i] = fresh.post("/retrieve", json={"queries": single[i], "topk": 1}).json()["result"][0]

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(single))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = fresh.get("/stats").json()
    monkeypatch.undo()
    # 12 requests of 4 distinct queries: each computed once, in slices of at most 4 queries.
    assert sorted(q for c in calls for q in c if q != "warm up query") == sorted(
        {q for qs in single for q in qs}
    )
    assert all(len(c) <= 4 for c in calls)
    assert stats["computed"] == 4 and stats["cache"]["hits"] + stats["coalesced"] == 8
    for qs, got in zip(single, answers, strict=True):
        assert got[0]["id"] == backend.search(qs, topk=1, initial_k=6)[0][0].id


@pytest.mark.slow
def test_http_round_trip_through_running_service(bm25_index, settings, backend, tmp_path, caplog):
    caplog.set_level("INFO", logger="spader.retrieval.service")
    log = tmp_path / "service.log"
    with running_service(bm25_index, SearchSettings.from_config(settings), log_path=log, threads=2) as url:
        assert url.startswith("http://127.0.0.1:")
        with RetrievalClient(url, timeout=30, retries=1) as c:
            assert c.health()["documents"] == 11
            got = c.retrieve(QUERIES)
            assert (
                c.retrieve(QUERIES[:1], topk=1, initial_k=2)[0][0]["id"]
                == backend.search(QUERIES[:1], topk=1, initial_k=2)[0][0].id
            )
            with pytest.raises(RetrievalRequestError, match=r"HTTP 422.*queries\[0\] is empty") as err:
                c.retrieve([""])
            assert err.value.status == 422
        port = int(url.rsplit(":", 1)[1])
    expected = backend.search(QUERIES, topk=3, initial_k=6)
    assert [[p["id"] for p in hits] for hits in got] == [[p.id for p in hits] for hits in expected]
    assert [p["score"] for p in got[0]] == pytest.approx([p.score for p in expected[0]], abs=1e-5)
    with pytest.raises(OSError):  # stopped: nothing listens any more
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert "retrieval service ready" in log.read_text()
    # the job's log keeps the service's final counters (the 4xx request never reached a batch)
    assert "retrieval service stats: 2 requests, 4 queries, 0 (0.0%) answered from the cache" in caplog.text


def test_service_refuses_to_start_on_a_missing_index(settings, tmp_path):
    missing = tmp_path / "no_index"
    started = time.monotonic()
    with pytest.raises(
        ServiceError, match=f"index {missing} exited with code 2(.|\n)*{missing} does not exist"
    ):
        with running_service(missing, SearchSettings.from_config(settings)):
            pass
    assert time.monotonic() - started < 60


def test_service_is_stopped_when_the_job_fails(bm25_index, settings):
    settings = dict(
        settings, reranker=dict(settings["reranker"], model=None, path=None)
    )  # BM25 only: quick start
    with pytest.raises(RuntimeError, match="job failed"):
        with running_service(bm25_index, SearchSettings.from_config(settings)) as url:
            port = int(url.rsplit(":", 1)[1])
            raise RuntimeError("job failed")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_cli_serve_refuses_missing_index(tmp_path, capsys):
    from spader.retrieval.__main__ import main

    assert main(["serve", "--index", str(tmp_path / "gone"), "--reranker", "none", "--port", "0"]) == 2
    assert f"{tmp_path / 'gone'} does not exist" in capsys.readouterr().err


class _Flaky(BaseHTTPRequestHandler):
    script: ClassVar[list[int]] = []
    seen: ClassVar[list[int]] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        status = self.script.pop(0) if self.script else 200
        self.seen.append(status)
        body = json.dumps({"result": [[]]} if status == 200 else {"error": f"status {status}"}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def flaky():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Flaky.seen = []
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_client_retries_5xx_but_not_4xx(flaky):
    url = f"http://127.0.0.1:{flaky.server_address[1]}"
    _Flaky.script = [503, 500]
    assert RetrievalClient(url, timeout=5, retries=2, backoff=0.01).retrieve(["q"]) == [[]]
    assert _Flaky.seen == [503, 500, 200]
    _Flaky.seen, _Flaky.script = [], [503, 503, 503]
    with pytest.raises(ServiceError, match="failed after 2 attempts: HTTP 503: status 503"):
        RetrievalClient(url, timeout=5, retries=1, backoff=0.01).retrieve(["q"])
    _Flaky.seen, _Flaky.script = [], [422]
    with pytest.raises(RetrievalRequestError, match="HTTP 422.*status 422"):
        RetrievalClient(url, timeout=5, retries=3, backoff=0.01).retrieve(["q"])
    assert _Flaky.seen == [422]
    _Flaky.script = [200]
    with pytest.raises(ServiceError, match="answered 1 result lists for 2 queries"):
        RetrievalClient(url, timeout=5, retries=0).retrieve(["q", "r"])


def test_client_connection_refused_is_bounded():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ServiceError, match=r"failed after 3 attempts: ConnectError"):
        RetrievalClient(f"http://127.0.0.1:{port}", timeout=2, retries=2, backoff=0.01).health()
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {
            "devices": ["cpu", "cpu"],
            "cache_entries": 7,
            "cache_bytes": 9,
            "slice_queries": 3,
            "overlap": False,
            "rerank_max_batch_tokens": 4096,
        },
    ],
    ids=["defaults", "every-new-setting"],
)
def test_serve_command_carries_every_search_setting(settings, tmp_path, changes):
    from dataclasses import asdict, replace

    from spader.retrieval.__main__ import _parser, settings_from_args
    from spader.retrieval.service import serve_command

    s = replace(SearchSettings.from_config(dict(settings, bm25={"k1": 1.2, "b": 0.75})), **changes)
    cmd = serve_command(tmp_path / "idx", s, port=0, port_file=tmp_path / "port", threads=3, parent_pid=42)
    args = _parser().parse_args(cmd[3:])
    carried = {
        k: v for k, v in asdict(s).items() if k not in ("startup_timeout_s", "request_timeout_s", "retries")
    }
    assert {k: v for k, v in asdict(settings_from_args(args)).items() if k in carried} == carried
    assert (args.index, args.port, args.port_file, args.threads, args.parent_pid) == (
        str(tmp_path / "idx"),
        0,
        str(tmp_path / "port"),
        3,
        42,
    )


def test_watchdog_ends_a_service_whose_parent_is_not_the_expected_one():
    import subprocess
    import sys

    code = "from spader.retrieval.service import exit_with_parent; import time; exit_with_parent(1, poll_s=0.1); time.sleep(30)"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], timeout=30, capture_output=True, text=True)
    assert proc.returncode == -15 and time.monotonic() - started < 20  # SIGTERM from its own watchdog


class _Proxy:
    """A TCP listener standing in for an HTTP proxy set in the environment: records the request line
    of every connection (another process of the machine may connect to its port too)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.requests: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with contextlib.suppress(OSError):
                conn.settimeout(5)
                self.requests.append(conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1"))
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            conn.close()

    def seen(self, port: int) -> int:
        """Requests the proxy received for a server on ``port``."""
        return sum(f":{port}/" in line for line in self.requests)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"


def test_local_searches_never_go_through_a_proxy_from_the_environment(flaky, monkeypatch):
    import httpx

    from spader.retrieval.client import is_loopback
    from spader.retrieval.service import _healthy

    proxy = _Proxy()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    port = flaky.server_address[1]
    url = f"http://127.0.0.1:{port}"
    assert httpx.post(f"{url}/retrieve", json={}).status_code == 502 and proxy.seen(port) == 1  # it is used
    _Flaky.script = []
    assert RetrievalClient(url, timeout=5, retries=0).retrieve(["q"]) == [[]]
    assert RetrievalClient(f"http://localhost:{flaky.server_address[1]}", timeout=5, retries=0).retrieve(
        ["q"]
    )
    assert not _healthy(
        f"http://127.0.0.1:{flaky.server_address[1]}"
    )  # _Flaky has no GET: 501, not the proxy
    assert proxy.seen(port) == 1
    assert [
        is_loopback(u) for u in ("http://127.0.0.1:1", "http://[::1]:1", "http://10.1.2.3:1", "http://a.b")
    ] == [
        True,
        True,
        False,
        False,
    ]
    proxy.sock.close()


def test_client_retries_through_the_project_retry_policy(flaky, monkeypatch):
    from spader.infra import retry
    from spader.retrieval import client as client_module

    used = []

    def spy(**kwargs):
        used.append(kwargs)
        return retry.retrying(**kwargs)

    monkeypatch.setattr(client_module, "retrying", spy)
    _Flaky.script = [500]
    url = f"http://127.0.0.1:{flaky.server_address[1]}"
    assert RetrievalClient(url, timeout=5, retries=2, backoff=0.01).retrieve(["q"]) == [[]]
    assert used and used[0]["retries"] == 2 and used[0]["backoff"] == 0.01 and _Flaky.seen[-2:] == [500, 200]


_PARENT = """
import json, sys, time
from spader.retrieval.backend import SearchSettings
from spader.retrieval.service import running_service
with running_service(sys.argv[1], SearchSettings.from_config(json.loads(sys.argv[2]))) as url:
    print(url, flush=True)
    time.sleep(600)
"""


def _proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) from /proc, or None once the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


@pytest.mark.slow
def test_service_exits_when_the_job_that_started_it_is_killed(bm25_index, settings, tmp_path):
    import subprocess
    import sys

    import httpx

    bm25_only = dict(settings, reranker=dict(settings["reranker"], model=None, path=None))
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(bm25_index), json.dumps(bm25_only)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = parent.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        pid = httpx.get(f"{url}/health", timeout=10, trust_env=False).json()["pid"]
        assert _proc_state(pid)[1] == parent.pid
        parent.kill()  # SIGKILL: no handler, no context manager exit
        parent.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = _proc_state(pid)
            if state is None or state[0] in "ZX":  # gone, or a zombie its new parent has not reaped
                break
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"retrieval service {pid} still runs 30 s after its parent was killed")
    finally:
        if parent.poll() is None:
            parent.kill()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()


def _nodelay_of_accepted(sock: socket.socket) -> int:
    """Serve ``sock`` with asyncio (as uvicorn does) and return TCP_NODELAY of the connection it accepts."""
    import asyncio

    async def main() -> int:
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        async def handle(reader, writer):
            seen.set_result(
                writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            )
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        value = await asyncio.wait_for(seen, 10)
        writer.close()
        server.close()
        await server.wait_closed()
        return value

    return asyncio.run(main())


def test_service_socket_turns_nagle_off_on_every_connection():
    # With Nagle on, an answer written as header then body waits for the client's delayed ACK
    # (~40 ms a request). asyncio turns it off only for sockets made with protocol IPPROTO_TCP:
    # the control (protocol 0, what the service used to bind) shows the trap is real.
    from spader.retrieval.service import _bind

    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    plain.bind(("127.0.0.1", 0))
    assert _nodelay_of_accepted(plain) == 0
    assert _nodelay_of_accepted(_bind("127.0.0.1", 0)) != 0
