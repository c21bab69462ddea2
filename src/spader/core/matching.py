"""Entity matching: which ground-truth entities a search step's passages contain.

One matcher serves the rewards (an entity is *hit* at a step when one of its aliases occurs in the
passages returned at that step), evaluation (hits per search step for the efficiency and temporal
analyses) and the demo's checks. It is its own module so that a change to the reward formulas in
:mod:`spader.core.rewards` does not rerun the evaluation of the prompting baselines, which match
passages but never compute a reward.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spader.core.text import normalize, normalize_spader_compat

__all__ = ["DISCOVERY", "authors_text_hits", "find_hits", "passage_hits"]

#: How the training reward finds an entity at a search step (``training.divergences.discovery``):
#: in the passages shown (:func:`passage_hits`) or, as the authors' code, anywhere in the
#: observation text (:func:`authors_text_hits`).
DISCOVERY = ("passages", "substring")


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


def passage_hits(shown: Sequence[Sequence[dict]], entities: Sequence[Sequence[str]]) -> set[int]:
    """Entities hit by the passages one search step showed (``shown[q]``: passages of query q).

    Titles and texts are matched separately, so no alias spans the two; queries are never
    searched. Training's search tool and evaluation both call this on the passages that
    :func:`spader.core.prompt.fit_observation` kept in the observation.
    """
    texts = [s for passages in shown for p in passages for s in (p.get("title", ""), p.get("text", ""))]
    return find_hits(texts, entities) if texts and entities else set()


def authors_text_hits(text: str, entities: Sequence[Sequence[str]]) -> set[int]:
    """Entities hit as the authors' training reward finds them (``training.divergences.discovery:
    substring``): an alias, normalised by their ``normalize_answer``
    (:func:`spader.core.text.normalize_spader_compat`), occurs anywhere in the normalised
    observation text, word boundaries or not. The text is the whole observation, so the queries it
    echoes count: writing an entity into a query finds it.

    >>> sorted(authors_text_hits('Results for "Paris":\\nDoc 1 Aristotle', [["Paris"], ["Ari"], ["Nice"]]))
    [0, 1]
    """
    haystack = normalize_spader_compat(text)
    hits: set[int] = set()
    if not haystack:
        return hits
    for i, aliases in enumerate(entities):
        norms = (normalize_spader_compat(a) for a in ([aliases] if isinstance(aliases, str) else aliases))
        if any(a and a in haystack for a in norms):
            hits.add(i)
    return hits
