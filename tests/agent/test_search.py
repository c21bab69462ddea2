"""The loop's search function over the retrieval client. ``RecordingClient`` is a fake client
(it answers from the query text and records requests); the real client and service are used in
tests/evaluation/test_rules.py."""

from __future__ import annotations

import pytest

from spader.agent.search import RetrievalSearch


class RecordingClient:
    def __init__(self, drop_one: bool = False):
        self.requests: list[tuple[list[str], int | None]] = []
        self.drop_one = drop_one

    def retrieve(self, queries, topk=None, initial_k=None):
        self.requests.append((list(queries), topk))
        out = [
            [{"id": f"{q[:8]}-{k}", "title": q[:8], "text": q, "score": 1.0} for k in range(topk)]
            for q in queries
        ]
        return out[:-1] if self.drop_one else out


def test_hostile_long_queries_are_cut_to_the_service_limit():
    client = RecordingClient()
    search = RetrievalSearch(client, topk=2, max_query_chars=20)
    long = "x" * 10_000
    (res,) = search([long])
    assert client.requests == [(["x" * 20], 2)] and len(res) == 2


def test_repeated_queries_are_sent_once_and_answers_follow_the_input_order():
    client = RecordingClient()
    search = RetrievalSearch(client, topk=1)
    res = search(["b", "a", "b", "c", "a"])
    assert client.requests == [(["b", "a", "c"], 1)]
    assert [r[0]["text"] for r in res] == ["b", "a", "b", "c", "a"]
    assert search.queries_sent == 3 and search.requests == 1


def test_blank_queries_get_no_passages_and_no_request():
    client = RecordingClient()
    search = RetrievalSearch(client, topk=1)
    assert search(["  ", ""]) == [[], []] and client.requests == []
    res = search([" a ", "\t"])
    assert client.requests == [(["a"], 1)] and res[1] == [] and res[0][0]["text"] == "a"


def test_large_turns_are_split_into_requests_the_service_accepts():
    client = RecordingClient()
    search = RetrievalSearch(client, topk=1, max_queries_per_request=4)
    res = search([f"q{i}" for i in range(10)])
    assert [len(q) for q, _ in client.requests] == [4, 4, 2]
    assert [r[0]["text"] for r in res] == [f"q{i}" for i in range(10)]


def test_a_short_answer_from_the_service_is_an_error():
    with pytest.raises(RuntimeError, match="returned 1 result lists for 2 queries"):
        RetrievalSearch(RecordingClient(drop_one=True), topk=1)(["a", "b"])
