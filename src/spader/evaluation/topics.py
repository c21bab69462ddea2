"""Which evaluation questions are not independent: the topics they ask about (``evaluation.topics``).

A topics file is a TSV with the header ``id<TAB>topic`` and one line per question and topic: the
question's id as the evaluation sets write it (``qampari:...``, ``mintaka:...``: ids are unique
across datasets) and a topic it asks about; a question about two topics (QUEST's "films by A or
films by B") has two lines. Questions that share a topic, directly or through other questions,
form one *cluster* (:func:`topic_clusters`), the unit the tables' ``avg`` rows resample
(:mod:`spader.evaluation.stats`): the CPU demo asks about one topic in several datasets, and
treating those questions as independent would make its intervals too narrow and its tests too
eager. The paper's four datasets carry no topic that links them (without a file every question is
its own unit); the demo's file is written with its releases (``resources/demo/topics.tsv``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

__all__ = ["HEADER", "TopicsError", "read_topics", "topic_clusters"]

HEADER = ("id", "topic")


class TopicsError(ValueError):
    """A malformed topics file, or a question it names no topic for; the message says which."""


def read_topics(path: str | os.PathLike) -> dict[str, tuple[str, ...]]:
    """``{question id: its topics}`` from a topics file (see the module docstring).

    Raises:
        TopicsError: naming the file and line of a wrong header, a line without exactly two
            fields or with an empty one; or the file when it names no question.
    """
    topics: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.rstrip("\n").rstrip("\r").split("\t")
            if lineno == 1:
                if tuple(fields) != HEADER:
                    raise TopicsError(f"{path}:1: expected the header 'id<TAB>topic', got {line.strip()!r}")
                continue
            if not line.strip():
                continue
            if len(fields) != 2 or not all(x.strip() for x in fields):
                raise TopicsError(
                    f"{path}:{lineno}: expected two non-empty fields 'id<TAB>topic', got {line!r}"
                )
            qid, topic = (x.strip() for x in fields)
            if topic not in topics.setdefault(qid, []):
                topics[qid].append(topic)
    if not topics:
        raise TopicsError(f"{path}: names no question (a header 'id<TAB>topic' and lines 'id<TAB>topic')")
    return {q: tuple(t) for q, t in topics.items()}


def topic_clusters(
    ids: Sequence[Sequence[str]], topics: Mapping[str, Sequence[str]], source: str = "evaluation.topics"
) -> list[list[int]]:
    """The cluster of every question: questions linked by a shared topic, directly or through
    other questions (connected components over questions and topics), numbered in first-seen order.

    Args:
        ids: question ids per group (per dataset), in the order of their scores.
        topics: ``{question id: topics}`` (:func:`read_topics`).
        source: what to name in an error (the configured file).
    Returns:
        Per group, one cluster number per question.
    Raises:
        TopicsError: a question without a topic (naming it and ``source``).

    >>> topic_clusters([["q1", "q2"], ["m1", "m2"]], {"q1": ["A"], "q2": ["B"], "m1": ["B", "C"], "m2": ["D"]})
    [[0, 1], [1, 2]]
    """
    root: dict[str, str] = {}

    def find(t: str) -> str:
        while root.setdefault(t, t) != t:
            root[t] = root[root[t]]
            t = root[t]
        return t

    for group in ids:
        for qid in group:
            named = topics.get(qid)
            if not named:
                raise TopicsError(f"{source} names no topic for evaluation question {qid!r}")
            for t in named[1:]:
                root[find(t)] = find(named[0])
    number: dict[str, int] = {}
    return [[number.setdefault(find(topics[q][0]), len(number)) for q in group] for group in ids]
