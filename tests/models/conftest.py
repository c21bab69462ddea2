"""Fixtures of the model tests: for the unit tests of the trajectory scripting, a fake search engine
(the tiny Qwen3 comes from the suite's root conftest).

``FakeSearch`` is a fake, named as such: it stands in for the retrieval service with a word-overlap
ranking over a handful of passages, so each scripting case is deterministic. The real service,
index and demo world are used by ``test_warmstart_demo.py``.
"""

from __future__ import annotations

import re

import pytest

PASSAGES = [
    {"id": "1__0", "title": "The Salt Orchard", "text": "The Salt Orchard is a 1961 drama film directed by Ilse Varga."},
    {"id": "2__0", "title": "Winter Quay", "text": "Winter Quay is a 1964 film directed by Ilse Varga."},
    {"id": "3__0", "title": "Ilse Varga", "text": "Ilse Varga directed The Salt Orchard and Winter Quay."},
    {"id": "4__0", "title": "Kesvik harbour", "text": "The harbour of Kesvik froze in the winter of 1901."},
    {"id": "5__0", "title": "Lake Morrow", "text": "The rivers Tamsen and Ourel flow into Lake Morrow."},
    {"id": "6__0", "title": "Tamsen", "text": "The Tamsen is a river of Altmere that flows into Lake Morrow."},
]  # fmt: skip


class FakeSearch:
    """Fake retrieval: the ``topk`` passages sharing most words with the query (ties: list order);
    records every call. ``blind`` queries get the unrelated passage only."""

    def __init__(self, topk: int = 2, blind: tuple[str, ...] = ()):
        self.topk = topk
        self.blind = blind
        self.calls: list[list[str]] = []

    def __call__(self, queries):
        self.calls.append(list(queries))
        out = []
        for q in queries:
            if q in self.blind:
                out.append([dict(PASSAGES[3], score=0.1)])
                continue
            words = set(re.findall(r"\w+", q.lower()))
            ranked = sorted(
                PASSAGES,
                key=lambda p: -len(words & set(re.findall(r"\w+", f"{p['title']} {p['text']}".lower()))),
            )
            out.append([dict(p, score=1.0) for p in ranked[: self.topk]])
        return out


@pytest.fixture
def fake_search():
    return FakeSearch
