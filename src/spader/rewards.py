"""Diversity-aware exploration rewards (method.md, "Entity normalisation and matching", "Rewards").

Pure Python over plain types; the verl adapters live in ``spader.integrations.verl``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spader.text import normalize

__all__ = ["find_hits"]


def _normalized_aliases(entities: Sequence[Sequence[str]]) -> list[list[str]]:
    return [[a for a in (normalize(x) for x in aliases) if a] for aliases in entities]


def find_hits(passages: Iterable[str], entities: Sequence[Sequence[str]]) -> set[int]:
    """Indices of ground-truth entities that occur in the passages as whole-word sequences.

    Passage text and every alias go through ``normalize`` (norm_v1); normalized text is a sequence
    of single-space-separated words, so a whole-word occurrence is a substring match with a space
    (or the text boundary) on both sides. Only passage text is searched, never the agent's queries.

    Args:
        passages: texts returned by the search tool at one step (title and body).
        entities: ground-truth entities, each a list of aliases.
    Returns:
        The set of entity indices hit.

    >>> sorted(find_hits(["Parish records of Paris, France"], [["Paris"], ["Paris, France"], ["Ari"]]))
    [0, 1]
    """
    # "|" is punctuation, so it never survives normalization: no alias can span two passages.
    text = " " + " | ".join(normalize(p) for p in passages) + " "
    hits: set[int] = set()
    for i, aliases in enumerate(_normalized_aliases(entities)):
        if any(f" {a} " in text for a in aliases):
            hits.add(i)
    return hits
