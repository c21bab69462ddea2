"""Fixtures for the agent loop tests.

Fakes, named as such: ``ScriptedEngine`` stands in for a trained model (a real one cannot run
here), returning scripted turns so each protocol case (including hostile output) is exercised
deterministically; ``FakeSearch`` stands in for the retrieval service with a word-overlap ranking
over a handful of passages (the real service is exercised in tests/evaluation/test_rules.py).
The tokenizer and its chat template are the real tiny Qwen3's.
"""

from __future__ import annotations

import re

import pytest

from spader.agent.generation import Generation

PASSAGES = [
    {
        "id": "p1",
        "title": "The Salt Orchard",
        "text": "The Salt Orchard is a 1961 drama film directed by Ilse Varga.",
    },
    {
        "id": "p2",
        "title": "Winter Quay",
        "text": "Winter Quay (1964) was the second film directed by Ilse Varga.",
    },
    {
        "id": "p3",
        "title": "Ilse Varga",
        "text": "Ilse Varga directed The Salt Orchard, Winter Quay and Glass Harbour.",
    },
    {"id": "p4", "title": "Lake Morrow", "text": "The rivers Tam and Oure flow into Lake Morrow."},
    {"id": "p5", "title": "Glass Harbour", "text": "Glass Harbour is a 1970 film."},
]


class FakeSearch:
    """Fake retrieval: top-k passages by word overlap with the query; records every call."""

    def __init__(self, topk: int = 2):
        self.topk = topk
        self.calls: list[list[str]] = []

    def __call__(self, queries):
        self.calls.append(list(queries))
        out = []
        for q in queries:
            words = set(re.findall(r"\w+", q.lower()))
            scored = sorted(
                PASSAGES,
                key=lambda p: -len(words & set(re.findall(r"\w+", (p["title"] + " " + p["text"]).lower()))),
            )
            out.append([dict(p, score=1.0) for p in scored[: self.topk]])
        return out


class ScriptedEngine:
    """Fake engine: the n-th assistant turn of the episode whose question is in the prompt gets
    ``scripts[question][n]`` as token ids, cut at the request's budget as an engine cuts it
    (``Exception`` instances become generation errors; a list of ints is returned as ids)."""

    name = "scripted"

    def __init__(self, tokenizer, scripts: dict[str, list]):
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.calls: list[int] = []  # prompts per generate call
        self.turns: dict[str, int] = {}  # turns generated so far per question
        self.requests: list[tuple[list[int], int, int | None]] = []  # (prompt, budget, seed)

    def generate(self, prompts, max_new_tokens, sampling, seeds=None):
        self.calls.append(len(prompts))
        seeds = list(seeds) if seeds is not None else [None] * len(prompts)
        out = []
        for ids, budget, seed in zip(prompts, max_new_tokens, seeds, strict=True):
            self.requests.append((list(ids), int(budget), seed))
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            question = next(q for q in self.scripts if f"Question: {q}" in text)
            turn = self.turns.get(question, 0)
            self.turns[question] = turn + 1
            item = self.scripts[question][turn]
            if isinstance(item, Exception):
                out.append(Generation("", finish="error", error=str(item)))
                continue
            tokens = (
                list(item)
                if isinstance(item, list)
                else self.tokenizer.encode(item, add_special_tokens=False)
            )
            cut = tokens[:budget]
            out.append(
                Generation(
                    self.tokenizer.decode(cut, skip_special_tokens=False),
                    completion_tokens=len(cut),
                    finish="length" if len(tokens) > budget else "stop",
                    token_ids=tuple(cut),
                )
            )
        return out

    def close(self):
        pass


@pytest.fixture
def passages() -> list[dict]:
    return [dict(p) for p in PASSAGES]


@pytest.fixture
def fake_search():
    return FakeSearch()


@pytest.fixture
def scripted(tokenizer):
    return lambda scripts: ScriptedEngine(tokenizer, scripts)
