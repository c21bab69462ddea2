"""Hostile and unlucky requests: every malformed request gets a 4xx JSON error before it joins a
batch (fuzzed), the body cap holds while the body streams in, a failure inside a merged batch
costs only the request that caused it, a large request lets others through between its slices,
and a garbled index (same size) is refused at start-up with its path named."""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from sections import search_settings

from spader.retrieval.app import create_app
from spader.retrieval.backend import Bm25RerankBackend
from spader.retrieval.errors import BadSearchRequestError, IndexUnavailableError
from spader.retrieval.payload import MAX_DEPTH, json_depth, parse_json, read_limited

GOOD = ["films directed by Ilse Varga", "river flowing into Lake Ørnes", "Saint-Malo Express album"]


@pytest.fixture(scope="module")
def backend(bm25_index, tiny_reranker):
    settings = search_settings(
        reranker=str(tiny_reranker),
        fp16=False,
        rerank_batch_size=4,
        initial_k=6,
        topk=3,
        max_queries_per_request=8,
        max_query_chars=200,
        slice_queries=2,
    )
    return Bm25RerankBackend(bm25_index, settings)


@pytest.fixture
def client(backend):
    with TestClient(create_app(lambda: backend)) as c:
        yield c


def _malformed(seed: int = 0) -> list[bytes]:
    """Bodies no valid request looks like: one per kind named in the issue, then mutations."""
    rng = random.Random(seed)
    valid = json.dumps({"queries": GOOD, "topk": 2}).encode()
    fixed = [
        b"",
        b"null",
        b"[]",
        b'"queries"',
        b"\xff\xfe\x00",
        b'{"queries": ["\\ud800"]}',  # lone high surrogate
        b'{"queries": ["films \\udfff by"]}',  # lone low surrogate
        b'{"queries": ["\\ud800\\ud800"]}',  # two highs, no pair
        b'{"queries": ["ok", "\\udbff"], "topk": 2}',
        b'{"queries": ["a"], "topk": "\\ud800"}',
        b'{"\\ud800": 1, "queries": ["a"]}',
        b'{"queries": ["\xed\xa0\x80 raw surrogate bytes"]}',
        b'{"queries": ["\xc0\xaf overlong"]}',
        b"[" * 5000 + b"]" * 5000,
        b'{"queries": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        b'{"queries": ["a"], "x": ' + b'{"a":' * 2000 + b"1" + b"}" * 2000 + b"}",
        b'{"queries": ["a"], "topk": ' + b"9" * 5000 + b"}",
        b'{"queries": ["a"], "topk": -' + b"1" * 300 + b"}",
        b'{"queries": ["a"], "topk": 1e999}',
        b'{"queries": ["a"], "topk": 0.' + b"5" * 100 + b"}",
        b'{"queries": ["a"], "topk": NaN}',
        b'{"queries": ["a"], "initial_k": Infinity}',
        b'{"queries": ["a"], "topk": 2.0}',
        b'{"queries": ["a"], "topk": null, "initial_k": 1001}',
        b'{"queries": ["a"], "return_scores": 1}',
        b'{"queries": [["nested"]]}',
        b'{"queries": {"0": "a"}}',
        b'{"queries": [true]}',
        b'{"queries": ["' + b"x" * 201 + b'"]}',
        json.dumps({"queries": ["a"] * 9}).encode(),
        json.dumps({"queries": ["a"], **{f"k{i}": i for i in range(50)}}).encode(),
        b'{"queries": ["a"]} trailing',
        b'{"queries": ["a"],}',
        b"{'queries': ['a']}",
        json.dumps({"queries": ["a" * 100] * 8}).encode() + b" " * 200_000,  # over the body cap
    ]
    mutated = []
    while len(mutated) < 300:
        body = bytearray(valid)
        kind = rng.randrange(4)
        if kind == 0:  # truncated
            body = body[: rng.randrange(1, len(body) - 1)]
        elif kind == 1:  # a structural byte replaced
            i = rng.randrange(len(body))
            body[i] = rng.choice(b'{}[]",:\\\x00\xff')
        elif kind == 2:  # random bytes
            body = bytearray(rng.randbytes(rng.randrange(1, 200)))
        else:  # a lone surrogate escape spliced into a query
            text = valid.decode()
            i = text.index("Ilse")
            body = bytearray((text[:i] + rf"\u{rng.randrange(0xD800, 0xE000):04x}" + text[i:]).encode())
        try:  # keep only what really is malformed
            parsed = json.loads(bytes(body))
            ok = (
                isinstance(parsed, dict)
                and set(parsed) <= {"queries", "topk"}
                and isinstance(parsed.get("queries"), list)
                and all(isinstance(q, str) and q.strip() for q in parsed["queries"])
                and all(q.encode("utf-8") for q in parsed["queries"])
                and parsed.get("topk", 2) in (1, 2, 3)
            )
        except (ValueError, UnicodeError, RecursionError):
            ok = False
        if not ok:
            mutated.append(bytes(body))
    return fixed + mutated


def test_fuzzed_malformed_requests_get_4xx_json_and_never_reach_a_batch(client, backend):
    before = client.get("/stats").json()
    statuses = {}
    for body in _malformed():
        r = client.post("/retrieve", content=body, headers={"content-type": "application/json"})
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert 400 <= r.status_code < 500, (body[:120], r.status_code, r.text[:300])
        assert r.headers["content-type"] == "application/json" and r.json()["error"], body[:120]
    after = client.get("/stats").json()
    assert after["requests"] == before["requests"]  # none of them joined a batch
    assert set(statuses) <= {400, 413, 422} and sum(statuses.values()) >= 300
    ok = client.post("/retrieve", json={"queries": GOOD[:1], "topk": 1})
    assert ok.status_code == 200
    assert ok.json()["result"][0][0]["id"] == backend.search(GOOD[:1], topk=1, initial_k=6)[0][0].id


@pytest.mark.parametrize(
    "body, status, message",
    [
        (
            b'{"queries": ["films", "\\ud800 by"]}',
            422,
            r"queries[1] cannot be encoded as UTF-8: surrogates not allowed ('\ud800' at character 0)",
        ),
        (b"[" * 1000 + b"]" * 1000, 400, f"JSON nested 1000 levels deep; the limit is {MAX_DEPTH}"),
        (
            b'{"queries": ["a"], "topk": ' + b"7" * 5000 + b"}",
            400,
            "a number of 5000 characters; the limit is 40",
        ),
        (b'{"queries": ["a"], "topk": NaN}', 400, "NaN is not a JSON number"),
        (b" " * 200_000, 413, "request body of 200000 bytes is larger than the limit of 84800 bytes"),
        # a key given twice: the last value would win silently
        (
            b'{"queries": ["films"], "queries": ["rivers"]}',
            400,
            "field 'queries' is given twice in one object",
        ),
        (b'{"queries": ["films"], "topk": 1, "topk": 5}', 400, "field 'topk' is given twice in one object"),
        (b'{"queries": ["films"], "x": {"a": 1, "a": 1}}', 400, "field 'a' is given twice in one object"),
        (b'{"queries": ["a"], "\u0071ueries": ["b"]}', 400, "field 'queries' is given twice in one object"),
    ],
    ids=[
        "surrogate",
        "nesting",
        "digits",
        "nan",
        "size",
        "key-twice",
        "topk-twice",
        "nested-twice",
        "escaped-twice",
    ],
)
def test_each_limit_is_named(client, body, status, message):
    r = client.post("/retrieve", content=body)
    assert r.status_code == status and message in r.json()["error"]


def test_json_depth_ignores_brackets_inside_strings():
    assert json_depth(b'{"queries": ["[[[[{{{{", "a\\"[[["]}') == 2
    assert json_depth(b'{"q": "\\\\", "r": [[1]]}') == 3  # an escaped backslash ends before the quote
    assert json_depth(b"") == 0 and json_depth(b"17") == 0
    assert parse_json(b'{"queries": ["[[[[[[[[[[[[[[[[[[[[[["]}') == {"queries": ["[" * 22]}


def test_body_cap_is_enforced_while_reading(client):
    """A chunked body without Content-Length: the app stops reading right after the cap."""
    limit = client.app.state.backend.settings.max_body_bytes
    consumed = []

    async def call() -> tuple[int, dict]:
        chunk = b" " * 65536
        sent = []

        async def receive():
            consumed.append(len(chunk))
            return {"type": "http.request", "body": chunk, "more_body": len(consumed) < 1000}

        async def send(message):
            sent.append(message)

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/retrieve", "raw_path": b"/retrieve", "query_string": b"",
            "root_path": "", "headers": [(b"transfer-encoding", b"chunked")], "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80), "state": {},
        }  # fmt: skip
        await client.app(scope, receive, send)
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return status, json.loads(body)

    status, body = client.portal.call(call)
    assert status == 413 and f"larger than the limit of {limit} bytes" in body["error"]
    assert sum(consumed) <= limit + 65536  # 1000 chunks (65 MB) offered, ~3 read


def test_read_limited_unit():
    import asyncio

    async def chunks(n):
        for _ in range(n):
            yield b"x" * 10

    assert asyncio.run(read_limited(chunks(3), 30)) == b"x" * 30
    with pytest.raises(BadSearchRequestError, match="larger than the limit of 29 bytes") as err:
        asyncio.run(read_limited(chunks(3), 29))
    assert err.value.status == 413
    with pytest.raises(BadSearchRequestError, match="Content-Length 'abc' is not a number"):
        asyncio.run(read_limited(chunks(1), 29, "abc"))


def _concurrently(client, bodies: list, delay: float = 0.01) -> list:
    answers = [None] * len(bodies)

    def send(i):
        answers[i] = client.post("/retrieve", content=bodies[i], headers={"content-type": "application/json"})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
        time.sleep(delay)
    for t in threads:
        t.join()
    return answers


def test_bad_requests_merged_with_good_ones_cost_only_themselves(client, backend, monkeypatch):
    """Lone-surrogate requests are refused up front; a query the backend fails on (a FAKE fault
    injected into BM25, as a Java error inside a batch search would be) fails only its request."""
    candidates = backend.candidates

    def faulty(queries, **kw):
        time.sleep(0.05)  # requests pile up and are merged
        if any("POISON" in q for q in queries):
            raise RuntimeError("batch search failed (fake fault)")
        return candidates(queries, **kw)

    monkeypatch.setattr(backend, "candidates", faulty)
    good = [json.dumps({"queries": [q, f"{q} {i}"]}).encode() for i, q in enumerate(GOOD * 4)]
    bodies = list(good)
    bodies.insert(3, b'{"queries": ["Lucene", "\\ud800"]}')
    bodies.insert(6, json.dumps({"queries": ["Winter Quay", "POISON pill", "Lucene"]}).encode())
    bodies.insert(9, b'{"queries": ["\\udc00 church"]}')
    answers = _concurrently(client, bodies)
    stats = client.get("/stats").json()
    monkeypatch.undo()
    by_body = dict(zip(bodies, answers, strict=True))
    for body in good:
        r = by_body[body]
        assert r.status_code == 200, r.text
        queries = json.loads(body)["queries"]
        expected = backend.search(queries, topk=3, initial_k=6)
        assert [[p["id"] for p in hits] for hits in r.json()["result"]] == [
            [p.id for p in h] for h in expected
        ]
    poisoned = by_body[bodies[6]]
    assert poisoned.status_code == 500
    assert (
        poisoned.json()["error"]
        == "search failed for queries[1]: RuntimeError: batch search failed (fake fault)"
    )
    assert by_body[bodies[3]].status_code == by_body[bodies[9]].status_code == 422
    assert stats["failed_queries"] == 1 and stats["isolation_runs"] >= 1


def test_query_with_more_terms_than_lucenes_default_limit_is_searched(bm25_index):
    """Lucene's default of 1,024 clauses made one long query fail its whole batch search."""
    wide = Bm25RerankBackend(bm25_index, search_settings(reranker=None, max_query_chars=20_000))
    query = " ".join(f"w{i}" for i in range(1500)) + " Lucene"
    got = wide.search([query, "Winter Quay"], topk=1, initial_k=1)
    assert [h[0].id for h in got] == ["5001__0", "1002__0"]


def test_large_request_lets_others_through_between_its_slices(client, backend, monkeypatch):
    calls = []
    candidates = backend.candidates

    def slow(queries, **kw):
        calls.append(list(queries))
        time.sleep(0.2)
        return candidates(queries, **kw)

    monkeypatch.setattr(backend, "candidates", slow)
    done = {}
    big = [f"{q} {i}" for i, q in enumerate(GOOD * 3)][:8]  # 4 slices of 2

    def send(name, queries):
        r = client.post("/retrieve", json={"queries": queries})
        assert r.status_code == 200
        done[name] = time.perf_counter()

    t_big = threading.Thread(target=send, args=("big", big))
    t_big.start()
    time.sleep(0.1)  # the big request's first slice is running
    send("small", ["Lucene index"])
    t_big.join()
    monkeypatch.undo()
    assert done["small"] < done["big"]
    where = next(i for i, c in enumerate(calls) if "Lucene index" in c)
    assert 0 < where < len(calls) - 1  # served between two slices of the big request
    assert all(len(c) <= 2 for c in calls)


def test_garbled_index_of_the_same_size_is_refused_with_its_path(bm25_index, tmp_path, capsys):
    from spader.retrieval.__main__ import main

    garbled = tmp_path / "garbled"
    shutil.copytree(bm25_index, garbled)
    stored = max(garbled.glob("*.fdt"), key=lambda p: p.stat().st_size)  # the stored documents
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x55
    stored.write_bytes(bytes(data))
    assert stored.stat().st_size == (bm25_index / stored.name).stat().st_size
    assert main(["serve", "--index", str(garbled), "--reranker", "none", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"BM25 index {garbled} is corrupt" in err and "checksum failed" in err


def test_probe_query_must_find_its_document(bm25_index, monkeypatch):
    plain = Bm25RerankBackend(bm25_index, search_settings(reranker=None))
    monkeypatch.setattr(
        plain.searcher, "search", lambda queries, k: [[] for _ in queries]
    )  # FAKE: finds nothing
    with pytest.raises(IndexUnavailableError, match=f"BM25 index {bm25_index}: the start-up probe query"):
        plain.warm_up()


def test_health_reports_settings_and_counters(client):
    health = client.get("/health").json()
    assert health["reranker_replicas"] == 1 and health["slice_queries"] == 2 and health["pid"] > 0
    assert set(health["stats"]) >= {"requests", "cache", "coalesced", "computed", "pairs_reranked"}
    assert set(health["stats"]["cache"]) >= {"hits", "misses", "evictions", "entries", "bytes"}
    assert client.get("/nope").status_code == 404 and client.get("/retrieve").status_code == 405


def test_settings_limits(backend):
    s = backend.settings
    assert s.max_body_bytes == 65536 + 8 * (12 * 200 + 8)
    for bad in ({"slice_queries": 0}, {"cache_entries": -1}):
        with pytest.raises(ValueError, match="must be"):
            replace(s, **bad)


def test_a_scheduler_fault_fails_the_open_requests_and_the_service_recovers(client, monkeypatch):
    batcher = client.app.state.batcher
    take = batcher._take_slice
    calls = []

    def broken_once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("scheduler bug (fake)")
        return take()

    monkeypatch.setattr(batcher, "_take_slice", broken_once)
    r = client.post("/retrieve", json={"queries": ["Winter Quay dock workers"]})
    assert r.status_code == 500 and "scheduler bug (fake)" in r.json()["error"]
    ok = client.post("/retrieve", json={"queries": ["Winter Quay dock workers"]})
    assert ok.status_code == 200 and ok.json()["result"][0][0]["id"] == "1002__0"


def test_a_large_body_is_parsed_off_the_event_loop(client, backend, monkeypatch):
    """While a body over 64 KiB is being decoded and checked (held there by a FAKE delay standing
    for the hundreds of milliseconds a 6 MB body takes), a small request is answered: the large one
    is parsed on the parse thread, not on the event loop that serves everyone."""
    check = backend.check_request
    inside, release, threads = threading.Event(), threading.Event(), {}

    def slow_check(queries, topk, initial_k):
        threads[queries[0]] = threading.current_thread().name
        if queries[0] == "LARGE":
            inside.set()
            release.wait(10)
        return check(queries, topk, initial_k)

    monkeypatch.setattr(backend, "check_request", slow_check)
    large = json.dumps({"queries": ["LARGE", "Winter Quay"]}).encode() + b" " * 70_000  # JSON whitespace
    answers = {}
    sender = threading.Thread(
        target=lambda: answers.setdefault("large", client.post("/retrieve", content=large))
    )
    sender.start()
    try:
        assert inside.wait(10)
        started = time.perf_counter()
        small = client.post("/retrieve", json={"queries": ["Winter Quay dock workers"], "topk": 1})
        took = time.perf_counter() - started
        assert small.status_code == 200 and not release.is_set() and took < 5
    finally:
        release.set()
        sender.join()
    assert answers["large"].status_code == 200 and len(answers["large"].json()["result"]) == 2
    assert threads["LARGE"].startswith("parse") and not threads["Winter Quay dock workers"].startswith(
        "parse"
    )


def test_numbers_that_overflow_to_infinity_are_refused():
    with pytest.raises(BadSearchRequestError, match="too large for a number"):
        parse_json(b'{"queries": ["a"], "topk": 1e999}')
    with pytest.raises(BadSearchRequestError, match="too large for a number"):
        parse_json(b'{"queries": ["a"], "x": -1E400}')
    assert parse_json(b'{"queries": ["a"], "x": 1e-400}')["x"] == 0.0  # underflow is a number


def _depth_reference(raw: bytes) -> int:
    """Byte-by-byte reference of json_depth: a quote opens or closes a string unless an odd run of
    backslashes precedes it (in valid JSON, backslashes occur only inside strings, where this is
    the parser's own reading); brackets count outside strings."""
    depth = best = run = 0
    inside = False
    for c in raw:
        if c == 0x5C:
            run += 1
            continue
        if c == 0x22 and run % 2 == 0:
            inside = not inside
        elif not inside and c in b"[{":
            depth += 1
            best = max(best, depth)
        elif not inside and c in b"]}":
            depth -= 1
        run = 0
    return best


def test_json_depth_matches_a_byte_by_byte_reference():
    rng = random.Random(3)
    bodies = [bytes(rng.choice(b'[]{}"\\a,:') for _ in range(rng.randrange(1, 80))) for _ in range(3000)]
    bodies += [b'{"q": "\\\\\\"[[[", "r": [[[["\\\\"]]]]}', b'["\\\\\\\\"]', b'"[' * 50]
    assert all(json_depth(b) == _depth_reference(b) for b in bodies)

    def nested(level: int):  # valid JSON: the depth is known from the object itself
        if level == 0 or rng.random() < 0.3:
            return "".join(rng.choice('[]{}"\\a') for _ in range(rng.randrange(6))), 0
        items = [nested(level - 1) for _ in range(rng.randrange(1, 4))]
        value = (
            [v for v, _ in items] if rng.random() < 0.5 else {f"k{i}": v for i, (v, _) in enumerate(items)}
        )
        return value, 1 + max(d for _, d in items)

    for _ in range(500):
        value, depth = nested(6)
        assert json_depth(json.dumps(value).encode()) == depth
