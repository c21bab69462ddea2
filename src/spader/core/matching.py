"""Entity matching: which ground-truth entities a search step's passages contain.

One matcher serves the rewards (an entity is *hit* at a step when one of its aliases occurs in the
passages returned at that step), evaluation (hits per search step for the efficiency and temporal
analyses) and the demo's checks. It is its own module so that a change to the reward formulas in
:mod:`spader.core.rewards` does not rerun the evaluation of the prompting baselines, which match
passages but never compute a reward.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spader.core.metrics import gold_count, unique_gold
from spader.core.text import normalize, normalize_spader_compat

__all__ = [
    "DENOMINATORS",
    "DISCOVERY",
    "authors_entries",
    "authors_text_hits",
    "discovery_gold",
    "find_hits",
    "listed_count",
    "passage_hits",
]

#: How the training reward finds an entity at a search step (``training.divergences.discovery``):
#: in the passages shown (:func:`passage_hits`) or, as the authors' code, anywhere in the
#: observation text (:func:`authors_text_hits`).
DISCOVERY = ("passages", "substring")
#: ``|E_GT|`` of the search-step rewards (``training.divergences.denominator``): ``distinct`` (each
#: gold entity once, as recall counts them) or ``entries`` (every entry of the gold list,
#: duplicates included, as the authors' reward divides).
DENOMINATORS = ("distinct", "entries")


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


def _aliases(entry) -> list[str]:
    return [entry] if isinstance(entry, str) else [str(a) for a in entry]


def authors_entries(entities: Sequence[Sequence[str]]) -> list[list[str]]:
    """The gold entries as the authors' step reward keys them: each non-blank entry once by its
    exact text (their reward keeps the entries it found in a set of strings), first occurrence
    kept, with no normalisation: two entries that differ in case or accents are two entities to it.

    >>> authors_entries([["Paris"], ["paris"], ["Paris"], [" "], ["Café"], ["Cafe"]])
    [['Paris'], ['paris'], ['Café'], ['Cafe']]
    """
    seen: set[tuple[str, ...]] = set()
    out = []
    for entry in entities:
        aliases = _aliases(entry)
        if any(a.strip() for a in aliases) and tuple(aliases) not in seen:
            seen.add(tuple(aliases))
            out.append(aliases)
    return out


def listed_count(entities: Sequence[Sequence[str]]) -> int:
    """Entries of the gold list, duplicates included, blank ones not (the authors' ``|GT|``, the
    length of their list of non-blank entries).

    >>> listed_count([["Paris"], ["Paris"], [" "], ["Lyon", "Lugdunum"]])
    3
    """
    return sum(1 for entry in entities if any(a.strip() for a in _aliases(entry)))


def discovery_gold(
    entities: Sequence[Sequence[str]], discovery: str = "passages", denominator: str = "distinct"
) -> tuple[list[list[str]], int]:
    """The entities step discovery finds, by index, and ``|E_GT|`` of the search-step rewards.

    ``passages`` (paper) indexes the distinct gold entities (:func:`spader.core.metrics.unique_gold`,
    norm_v1), the ones F1 counts; ``substring`` (the authors' code) the distinct entries by their
    exact text (:func:`authors_entries`), matched through their normaliser
    (:func:`authors_text_hits`). ``|E_GT|`` is the number of those entities (``distinct``), or every
    non-blank entry of the list, duplicates included (``entries``, the authors' reward).

    >>> gold = [["Paris"], ["paris"], ["Paris"], ["Lyon"]]
    >>> [discovery_gold(gold, d, n)[1] for d in DISCOVERY for n in DENOMINATORS]
    [2, 4, 3, 4]
    """
    if discovery not in DISCOVERY:
        raise ValueError(f"discovery must be one of {DISCOVERY}, got {discovery!r}")
    if denominator not in DENOMINATORS:
        raise ValueError(f"denominator must be one of {DENOMINATORS}, got {denominator!r}")
    if discovery == "substring":
        found = authors_entries(entities)
        distinct = len(found)
    else:
        found = unique_gold(entities)
        distinct = gold_count(entities)
    return found, distinct if denominator == "distinct" else listed_count(entities)
