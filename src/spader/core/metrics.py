"""Instance-level set precision / recall / F1 with aliases (docs/method.md, "Evaluation").

A gold entity is a list of aliases; it is matched by a prediction when one of its aliases and the
prediction normalize (``spader.core.text.normalize``) to the same string. Each gold entity counts at most
once and each distinct prediction can match at most one entity, so two aliases of one entity
predicted give one hit and one false positive. The matching is a maximum bipartite matching, which
also settles the rare case of one prediction equal to aliases of two entities.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

from spader.core.text import normalize, normalize_spader_compat

__all__ = [
    "alias_blind",
    "authors_correct_count",
    "authors_prf",
    "authors_query_count",
    "authors_reward_prf",
    "correct_count",
    "gold_alias_sets",
    "gold_count",
    "macro_average",
    "match_count",
    "prf",
    "search_efficiency",
    "unique_gold",
]


def _unique(gold: Iterable[Sequence[str]]) -> list[tuple[list[str], frozenset[str]]]:
    """``(aliases, normalized alias set)`` of each distinct gold entity, first occurrence kept."""
    seen: set[frozenset[str]] = set()
    out = []
    for aliases in gold:
        aliases = [aliases] if isinstance(aliases, str) else [str(a) for a in aliases]
        norm = frozenset(a for a in (normalize(x) for x in aliases) if a)
        if norm and norm not in seen:
            seen.add(norm)
            out.append((aliases, norm))
    return out


def gold_alias_sets(gold: Iterable[Sequence[str]]) -> list[frozenset[str]]:
    """Normalized alias sets of the gold entities, deduplicated, empty ones dropped."""
    return [norm for _, norm in _unique(gold)]


def unique_gold(gold: Iterable[Sequence[str]]) -> list[list[str]]:
    """The gold entities counted once, as alias lists in their original spelling.

    The same entities, in the same order, as :func:`gold_alias_sets`: an entity whose aliases
    normalize to the same set as an earlier one is a duplicate, one whose aliases all normalize
    to nothing is dropped. The search tool and evaluation match passages against this list, so
    entity indices and ``|E_GT|`` mean the same thing for rewards and for F1.

    >>> unique_gold([["Paris", "Paname"], ["paname", "PARIS"], ["!"], ["Lyon"]])
    [['Paris', 'Paname'], ['Lyon']]
    """
    return [aliases for aliases, _ in _unique(gold)]


def gold_count(gold: Iterable[Sequence[str]]) -> int:
    """``|E_GT|``: the number of distinct gold entities, the denominator of recall and of the
    search-step rewards (docs/method.md, "Rewards")."""
    return len(_unique(gold))


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
    """Size of a maximum matching between normalized predictions and gold alias sets.

    Kuhn's augmenting paths, searched with an explicit stack: entities that share aliases can
    chain into paths as long as the gold list (a thousand linked aliases need no recursion limit).
    """
    alias_to_entities: dict[str, list[int]] = {}
    for ei, aliases in enumerate(gold_sets):
        for a in aliases:
            alias_to_entities.setdefault(a, []).append(ei)
    owner: dict[int, int] = {}  # entity -> prediction index
    for pi, p in enumerate(preds):
        if p in alias_to_entities:
            _augment(pi, preds, alias_to_entities, owner)
    return len(owner)


def _augment(
    root: int, preds: Sequence[str], alias_to_entities: dict[str, list[int]], owner: dict[int, int]
) -> bool:
    """Find an augmenting path from prediction ``root`` (depth first, entities in alias order) and
    flip it into ``owner``; the same search as the recursive textbook version, without recursion."""
    visited: set[int] = set()
    stack = [(root, iter(alias_to_entities.get(preds[root], ())))]
    path: list[int] = []  # path[k]: the entity tried by the prediction at stack[k]
    while stack:
        _, entities = stack[-1]
        for ei in entities:
            if ei in visited:
                continue
            visited.add(ei)
            path.append(ei)
            if ei not in owner:
                for (pi, _), entity in zip(stack, path, strict=True):
                    owner[entity] = pi
                return True
            holder = owner[ei]
            stack.append((holder, iter(alias_to_entities.get(preds[holder], ()))))
            break
        else:
            stack.pop()
            if path:
                path.pop()
    return False


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


def correct_count(predicted: Sequence[str], gold: Sequence[Sequence[str]]) -> int:
    """How many gold entities the predictions name (the hits of :func:`prf`).

    >>> correct_count(["Paris", "Paname", "Lyon"], [["Paris", "Paname"], ["Lyon"], ["Nice"]])
    2
    """
    preds = _unique_predictions(predicted)
    gold_sets = gold_alias_sets(gold)
    return match_count(preds, gold_sets) if preds and gold_sets else 0


def search_efficiency(queries: int, correct: int) -> float:
    """The authors' search efficiency of one instance: queries issued per correctly predicted
    entity, 0 when either is 0 (averaged over instances by the efficiency table).

    >>> search_efficiency(6, 4), search_efficiency(3, 0), search_efficiency(0, 2)
    (1.5, 0.0, 0.0)
    """
    return queries / correct if queries > 0 and correct > 0 else 0.0


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


# ---------------------------------------------------------------------------------------------
# The authors' published counting and matching (docs/method.md, "Known divergences")
# ---------------------------------------------------------------------------------------------
_CALL_BLOCKS = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def authors_query_count(text: str) -> int:
    """Queries as the authors' evaluation counts them (``compute_tool_count``): over every
    ``<tool_call>...</tool_call>`` span of ``text`` (the whole conversation joined: prompt,
    turns and observations), the length of a JSON list, the length of an object's
    ``arguments.query_list``, and 1 for anything else, unparsable spans included. A span runs from
    an opening tag to the next closing one, so a bare ``<tool_call>`` in a prompt swallows the
    first real call (it then counts 1 whatever its size).

    >>> authors_query_count('<tool_call>["a", "b"]</tool_call> x <tool_call>oops</tool_call>')
    3
    """
    count = 0
    for span in _CALL_BLOCKS.findall(text):
        try:
            value = json.loads(span)
        except (ValueError, RecursionError):
            count += 1
            continue
        if isinstance(value, list):
            count += len(value)
        elif isinstance(value, dict) and "arguments" in value:
            arguments = value.get("arguments")
            queries = arguments.get("query_list", []) if isinstance(arguments, dict) else []
            count += len(queries) if hasattr(queries, "__len__") else 1
        else:
            count += 1
    return count


def _authors_sets(
    predicted: Sequence[str] | None, gold: Sequence[Sequence[str]]
) -> tuple[set[str], list[frozenset[str]]]:
    """The authors' normalised prediction set and gold alias sets (equal alias sets once)."""
    preds = {n for n in (normalize_spader_compat(p) for p in predicted or []) if n}
    entities: list[frozenset[str]] = []
    for aliases in gold:
        norm = frozenset(a for a in (normalize_spader_compat(x) for x in aliases) if a)
        if norm and norm not in entities:
            entities.append(norm)
    return preds, entities


def authors_correct_count(predicted: Sequence[str] | None, gold: Sequence[Sequence[str]]) -> int:
    """Gold entities named by the predictions as the authors' evaluation matches them: their
    ``normalize_answer`` (:func:`spader.core.text.normalize_spader_compat`), an entity counted
    when any of its aliases equals a prediction (entities with equal alias sets once).

    >>> authors_correct_count(["Paris", "Paname"], [["Paris", "Paname"], ["Lyon"]])
    1
    """
    preds, entities = _authors_sets(predicted, gold)
    return sum(bool(norm & preds) for norm in entities)


def authors_prf(predicted: Sequence[str] | None, gold: Sequence[Sequence[str]]) -> tuple[float, float, float]:
    """Precision, recall and F1 of one instance as the authors' evaluation computes them
    (``compute_score_qampari``; ``evaluation.metrics: authors``): a prediction is correct when it
    equals any alias of any gold entity, so two aliases of one entity are two correct predictions
    in precision; an entity is recalled when any of its aliases is predicted. Their
    ``normalize_answer`` throughout.

    >>> authors_prf(["Paris", "Paname", "Rome"], [["Paris", "Paname"], ["Lyon"]])
    (0.6666666666666666, 0.5, 0.5714285714285715)
    """
    preds, entities = _authors_sets(predicted, gold)
    if not preds or not entities:
        return 0.0, 0.0, 0.0
    every_alias = frozenset().union(*entities)
    precision = len(preds & every_alias) / len(preds)
    recall = sum(bool(norm & preds) for norm in entities) / len(entities)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def alias_blind(gold: Iterable[Sequence[str]]) -> list[list[str]]:
    """Gold entities as the authors' training reward sees them: each alias list becomes one string
    (Python's ``str`` of the list), so an entity with two or more aliases is matched only by that
    whole string (normalised: its aliases joined by spaces), never by one of its aliases.

    >>> alias_blind([["Paris", "Paname"], ["Lyon"]])
    [["['Paris', 'Paname']"], ["['Lyon']"]]
    """
    return [[str([str(a) for a in ([aliases] if isinstance(aliases, str) else aliases)])] for aliases in gold]


def authors_reward_prf(predicted: Sequence[str] | None, targets: Sequence[str]) -> tuple[float, float, float]:
    """Precision, recall and F1 as the authors' training reward computes them
    (``training.divergences.aliases: blind``; their reward's ``compute_score_qampari``): the set of
    predictions against the set of gold strings, both through their ``normalize_answer``
    (:func:`spader.core.text.normalize_spader_compat`), empty strings left out. Their gold strings
    are one per entity, the ``str`` of its alias list (:func:`alias_blind`): an entity with two or
    more aliases is matched only by that whole string.

    >>> authors_reward_prf(["Paris", "Lyon", "Rome"], ["['Paris', 'Paname']", "['Lyon']"])
    (0.3333333333333333, 0.5, 0.4)
    """
    preds = {n for n in (normalize_spader_compat(p) for p in predicted or []) if n}
    gold = {n for n in (normalize_spader_compat(t) for t in targets) if n}
    if not preds or not gold:
        return 0.0, 0.0, 0.0
    matched = len(preds & gold)
    precision, recall = matched / len(preds), matched / len(gold)
    f1 = 2 * (precision * recall) / (precision + recall) if precision + recall > 0 else 0.0
    return precision, recall, f1
