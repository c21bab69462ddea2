"""The service's result cache: LRU bounded by entries and bytes, shared across requests, in-flight
duplicates served by the first computation, identical results with and without it, counters in
/stats and /health; overlapping BM25 with reranking changes no result."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from sections import search_settings

from spader.retrieval.app import create_app
from spader.retrieval.backend import Bm25RerankBackend, SearchSettings
from spader.retrieval.cache import ResultCache, entry_nbytes, text_nbytes
from spader.retrieval.corpus import Passage

# A rollout-shaped stream: 4 "prompts", each repeated by several rollouts, later turns diverging.
STREAM = [
    ["films directed by Ilse Varga"],
    ["films directed by Ilse Varga", "Salt Orchard drama 1961"],
    ["river flowing into Lake Ørnes"],
    ["films directed by Ilse Varga"],
    ["river flowing into Lake Ørnes", "Kvitelva birch forest"],
    ["Saint-Malo Express album", "Halcyon & Rust debut"],
    ["films directed by Ilse Varga", "Winter Quay dock workers"],
    ["Saint-Malo Express album"],
    ["river flowing into Lake Ørnes"],
    ["Lucene BM25 inverted index", "Saint-Malo Express album"],
]


def _p(i: int, text: str = "x" * 100) -> Passage:
    return Passage(f"{i}__0", f"title {i}", text, float(i))


def test_lru_evicts_least_recently_used_by_entries():
    cache = ResultCache(max_entries=2, max_bytes=10**6, identity="idx")
    a, b, c = (cache.key(q, 5, 50) for q in "abc")
    cache.put(a, [_p(1)])
    cache.put(b, [_p(2)])
    assert cache.get(a)[0].id == "1__0"  # a is now the most recently used
    cache.put(c, [_p(3)])
    assert cache.get(b) is None and cache.get(a) is not None and cache.get(c) is not None
    s = cache.stats
    assert (s.hits, s.misses, s.evictions, s.entries) == (3, 1, 1, 2)
    assert s.bytes == entry_nbytes("a", [_p(1)]) + entry_nbytes("c", [_p(3)])


def test_lru_is_bounded_by_bytes_and_skips_oversized_results():
    one = entry_nbytes("0", [_p(0)])
    cache = ResultCache(max_entries=100, max_bytes=3 * one)
    for i in range(10):
        cache.put(cache.key(str(i), 5, 50), [_p(i)])
    assert len(cache) == 3 and cache.stats.bytes == 3 * one and cache.stats.evictions == 7
    assert [cache.get(cache.key(str(i), 5, 50)) is not None for i in (6, 7, 8, 9)] == [
        False,
        True,
        True,
        True,
    ]
    cache.put(cache.key("big", 5, 50), [_p(0, "y" * (4 * one))])  # larger than the whole cache
    assert cache.get(cache.key("big", 5, 50)) is None and len(cache) == 3


def test_bytes_are_counted_as_python_holds_them_keys_included():
    """A 1,000-character key of characters outside the Basic Multilingual Plane is 4 bytes per
    character in CPython (plus its UTF-8 copy), and passages' text is counted at its real width:
    the earlier estimate left the key out and counted one byte per character."""
    wide = "\U0001f600" * 1000
    assert text_nbytes(wide) >= 4000 and text_nbytes(wide, utf8_copy=True) >= 8000
    assert text_nbytes("a" * 1000, utf8_copy=True) == text_nbytes("a" * 1000) >= 1000
    assert text_nbytes("\u00e9" * 1000, utf8_copy=True) >= 3000  # Latin-1: 1 byte each, 2 in UTF-8
    passages = [_p(i, text="\u0416" * 600) for i in range(5)]  # Cyrillic: 2 bytes each in memory
    cache = ResultCache(10, 10**7, identity=("index", 1))
    cache.put(cache.key(wide, 5, 50), passages)
    counted = cache.stats.bytes
    assert counted == entry_nbytes(wide, passages)
    assert counted >= 8000 + 5 * 2 * 600  # key (UCS-4 + its UTF-8) and text (UCS-2)
    narrow = ResultCache(10, 10**7, identity=("index", 1))
    narrow.put(narrow.key("a", 5, 50), passages)
    assert counted - narrow.stats.bytes >= 8000  # the key is counted


def _as_utf8(text: str) -> None:
    """What a C extension does with a str it reads (PyO3, the tokenizer): CPython then keeps the
    UTF-8 bytes inside the str for its lifetime."""
    import ctypes

    as_utf8 = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
    as_utf8.restype, as_utf8.argtypes = ctypes.c_char_p, [ctypes.py_object, ctypes.c_void_p]
    as_utf8(text, None)


def _fill(cache: ResultCache, n: int, key_char: str, text_char: str) -> None:
    for i in range(n):
        query = f"{i} " + key_char * 998
        passages = [
            Passage(f"{i}__{j}", f"title {i} {j}", text_char * 700 + str(j), float(j)) for j in range(5)
        ]
        cache.put(cache.key(query, 5, 50), passages)


@pytest.mark.parametrize(
    ("key_char", "text_char"), [("a", "b"), ("\U0001f600", "\u0416"), ("\u00e9", "\U00010348")]
)
def test_counted_bytes_bound_what_the_process_holds(key_char, text_char):
    """tracemalloc's count of the memory a full cache holds (strings built as the service builds
    them, one per entry) is never above the cache's own count, and not far below it."""
    import gc
    import tracemalloc

    cache = ResultCache(100_000, 4 * 2**20, identity=("index", 1))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _fill(cache, 2000, key_char, text_char)  # well past the cap: evictions happened
        for key in cache._data:  # the reranker's tokenizer asked every query for its UTF-8
            _as_utf8(key[1])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    s = cache.stats
    assert s.evictions > 0 and s.bytes <= s.max_bytes
    assert held <= s.bytes, (held, s.bytes)
    assert held >= 0.8 * s.bytes, (held, s.bytes)


def test_key_holds_query_topk_initial_k_and_identity():
    cache = ResultCache(10, 10**6, identity=("index A", "reranker A"))
    other = ResultCache(10, 10**6, identity=("index B", "reranker A"))
    keys = {cache.key("q", 5, 50), cache.key("q ", 5, 50), cache.key("q", 3, 50), cache.key("q", 5, 20)}
    assert len(keys) == 4 and cache.key("q", 5, 50) != other.key("q", 5, 50)


def test_disabled_cache_keeps_nothing():
    cache = ResultCache(0, 10**6)
    cache.put(cache.key("q", 5, 50), [_p(1)])
    assert not cache.enabled and cache.get(cache.key("q", 5, 50)) is None and len(cache) == 0
    with pytest.raises(ValueError, match=">= 0"):
        ResultCache(-1, 10)


@pytest.fixture(scope="module")
def backend(bm25_index, tiny_reranker):
    settings = search_settings(
        reranker=str(tiny_reranker), fp16=False, rerank_batch_size=4, initial_k=6, topk=3, slice_queries=3
    )
    return Bm25RerankBackend(bm25_index, settings)


def _run_stream(backend, settings: SearchSettings, monkeypatch, concurrent: bool) -> tuple[list, dict]:
    monkeypatch.setattr(backend, "settings", settings)
    results = [None] * len(STREAM)
    with TestClient(create_app(lambda: backend)) as client:
        before = client.get("/stats").json()["pairs_reranked"]

        def send(i):
            r = client.post("/retrieve", json={"queries": STREAM[i], "return_scores": True})
            assert r.status_code == 200, r.text
            results[i] = r.json()["result"]

        if concurrent:
            threads = [threading.Thread(target=send, args=(i,)) for i in range(len(STREAM))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for i in range(len(STREAM)):
                send(i)
        stats = client.get("/stats").json()
        health = client.get("/health").json()
    stats["pairs"] = stats["pairs_reranked"] - before
    assert health["stats"]["cache"] == stats["cache"]
    return results, stats


@pytest.mark.parametrize("concurrent", [False, True], ids=["sequential", "concurrent"])
def test_identical_results_with_and_without_cache(backend, monkeypatch, concurrent):
    on = replace(backend.settings, cache_entries=1000)
    off = replace(backend.settings, cache_entries=0)
    cached, stats_on = _run_stream(backend, on, monkeypatch, concurrent)
    plain, stats_off = _run_stream(backend, off, monkeypatch, concurrent)
    ids = [[[p["id"] for p in hits] for hits in r] for r in cached]
    assert ids == [[[p["id"] for p in hits] for hits in r] for r in plain]
    scores_on = [p["score"] for r in cached for hits in r for p in hits]
    assert scores_on == pytest.approx([p["score"] for r in plain for hits in r for p in hits], abs=1e-5)
    distinct = len({q for qs in STREAM for q in qs})
    assert stats_on["computed"] == distinct  # each distinct query computed once in all
    assert stats_on["cache"]["hits"] + stats_on["coalesced"] == sum(map(len, STREAM)) - distinct
    assert stats_on["cache"]["misses"] >= distinct and stats_on["cache"]["entries"] == distinct
    assert stats_off["cache"]["hits"] == 0 and stats_off["cache"]["entries"] == 0
    assert stats_off["pairs"] > stats_on["pairs"] > 0  # fewer reranker pairs with the cache
    for stats in (stats_on, stats_off):  # where the time went, as the service measured it
        assert stats["latency_ms"]["count"] == len(STREAM)
        assert 0 < stats["latency_ms"]["p50_ms"] <= stats["latency_ms"]["max_ms"]
        assert stats["bm25_s"] > 0 and stats["rerank_s"] > 0
        assert stats["loop_lag_ms"]["max_ms"] >= 0


def test_in_flight_duplicates_wait_for_the_first_computation(backend, monkeypatch):
    calls = []
    candidates = backend.candidates

    def slow(queries, **kw):
        calls.append(list(queries))
        time.sleep(0.4)
        return candidates(queries, **kw)

    with TestClient(create_app(lambda: backend)) as client:
        monkeypatch.setattr(backend, "candidates", slow)
        answers = []

        def send():
            answers.append(client.post("/retrieve", json={"queries": ["Winter Quay harbour"]}).json())

        threads = [threading.Thread(target=send) for _ in range(6)]
        for t in threads:
            t.start()
            time.sleep(0.02)
        for t in threads:
            t.join()
        stats = client.get("/stats").json()
        again = client.post("/retrieve", json={"queries": ["Winter Quay harbour"]}).json()
    assert calls == [["Winter Quay harbour"]]  # searched once for 7 requests
    assert stats["coalesced"] == 5 and stats["computed"] == 1
    assert all(a == answers[0] for a in answers) and again == answers[0]
    assert stats["cache"]["hits"] == 0 and client.app.state.batcher.cache.stats.hits == 1


def test_overlap_changes_no_result(backend, monkeypatch):
    overlapped, _ = _run_stream(
        backend, replace(backend.settings, cache_entries=0, overlap=True), monkeypatch, True
    )
    serial, _ = _run_stream(
        backend, replace(backend.settings, cache_entries=0, overlap=False), monkeypatch, True
    )
    assert [[[p["id"] for p in h] for h in r] for r in overlapped] == [
        [[p["id"] for p in h] for h in r] for r in serial
    ]


@pytest.mark.parametrize("overlap", [True, False])
def test_bm25_of_the_next_slice_runs_while_the_current_one_reranks(backend, monkeypatch, overlap):
    spans = []
    candidates, rerank = backend.candidates, backend.rerank

    def timed(stage, fn):
        def run(*args, **kw):
            start = time.perf_counter()
            time.sleep(0.15)  # both stages take a while, so overlapping them is visible
            out = fn(*args, **kw)
            spans.append((stage, start, time.perf_counter()))
            return out

        return run

    monkeypatch.setattr(backend, "settings", replace(backend.settings, cache_entries=0, overlap=overlap))
    with TestClient(create_app(lambda: backend)) as client:
        monkeypatch.setattr(backend, "candidates", timed("bm25", candidates))
        monkeypatch.setattr(backend, "rerank", timed("rerank", rerank))
        queries = list(dict.fromkeys(q for qs in STREAM for q in qs))[:8]
        r = client.post("/retrieve", json={"queries": queries[:4]})  # slices of 3 and 1
        r2 = client.post("/retrieve", json={"queries": queries[4:8]})
    assert r.status_code == r2.status_code == 200
    bm25 = [s for s in spans if s[0] == "bm25"]
    rr = [s for s in spans if s[0] == "rerank"]
    overlapping = any(b[1] < r[2] and r[1] < b[2] for b in bm25 for r in rr)
    assert len(bm25) == len(rr) >= 4 and overlapping is overlap
