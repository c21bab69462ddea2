"""Instance-level set precision / recall / F1 with aliases (method.md, "Evaluation").

A gold entity is a list of aliases; it is matched by a prediction when one of its aliases and the
prediction normalize (``spader.core.text.normalize``) to the same string. Each gold entity counts at most
once and each distinct prediction can match at most one entity, so two aliases of one entity
predicted give one hit and one false positive. The matching is a maximum bipartite matching, which
also settles the rare case of one prediction equal to aliases of two entities.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spader.core.text import normalize

__all__ = ["gold_alias_sets", "macro_average", "match_count", "prf"]


def gold_alias_sets(gold: Iterable[Sequence[str]]) -> list[frozenset[str]]:
    """Normalized alias sets of the gold entities, deduplicated, empty ones dropped."""
    seen: set[frozenset[str]] = set()
    out: list[frozenset[str]] = []
    for aliases in gold:
        norm = frozenset(a for a in (normalize(x) for x in aliases) if a)
        if norm and norm not in seen:
            seen.add(norm)
            out.append(norm)
    return out


def _unique_predictions(predicted: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for p in predicted:
        n = normalize(p)
        if n and n not in seen:
            seen.add(n)
            out.append(n)
    return out


def match_count(preds: Sequence[str], gold_sets: Sequence[frozenset[str]]) -> int:
    """Size of a maximum matching between normalized predictions and gold alias sets."""
    alias_to_entities: dict[str, list[int]] = {}
    for ei, aliases in enumerate(gold_sets):
        for a in aliases:
            alias_to_entities.setdefault(a, []).append(ei)
    owner: dict[int, int] = {}  # entity -> prediction index

    def augment(pi: int, visited: set[int]) -> bool:
        for ei in alias_to_entities.get(preds[pi], ()):
            if ei in visited:
                continue
            visited.add(ei)
            if ei not in owner or augment(owner[ei], visited):
                owner[ei] = pi
                return True
        return False

    for pi, p in enumerate(preds):
        if p in alias_to_entities:
            augment(pi, set())
    return len(owner)


def prf(predicted: Sequence[str], gold: Sequence[Sequence[str]]) -> tuple[float, float, float]:
    """Alias-aware set precision, recall and F1 of one instance.

    Args:
        predicted: raw predicted answer strings (duplicates after normalization count once).
        gold: gold entities, each a list of aliases.
    Returns:
        ``(precision, recall, f1)``; all 0.0 when there is no prediction or no gold entity.

    >>> prf(["Paris", "paris", "Lyon"], [["Paris", "Paname"], ["Marseille"]])
    (0.5, 0.5, 0.5)
    """
    preds = _unique_predictions(predicted)
    gold_sets = gold_alias_sets(gold)
    if not preds or not gold_sets:
        return 0.0, 0.0, 0.0
    hits = match_count(preds, gold_sets)
    precision = hits / len(preds)
    recall = hits / len(gold_sets)
    f1 = 0.0 if hits == 0 else 2 * precision * recall / (precision + recall)
    return precision, recall, f1


def macro_average(rows: Iterable[tuple[float, float, float]]) -> tuple[float, float, float, int]:
    """Macro average of per-instance ``(p, r, f1)``; returns ``(p, r, f1, n)`` (zeros for n = 0)."""
    sp = sr = sf = 0.0
    n = 0
    for p, r, f in rows:
        sp += p
        sr += r
        sf += f
        n += 1
    if n == 0:
        return 0.0, 0.0, 0.0, 0
    return sp / n, sr / n, sf / n, n
