"""build_entities and the QUEST title rule (docs/data.md, "build_entities" and QUEST's "How answers
are taken"), case by case."""

from __future__ import annotations

import pytest

from spader.data import build_entities, strip_parenthetical


@pytest.mark.parametrize(
    ("groups", "answers", "answers_norm"),
    [
        # primary first, aliases kept raw, normalized aliases deduplicated
        (
            [["The Salt Orchard", "Salt Orchard", "A sós gyümölcsös"]],
            [["The Salt Orchard", "Salt Orchard", "A sós gyümölcsös"]],
            [["salt orchard", "sos gyumolcsos"]],
        ),
        # a later group whose normalized primary is equal is merged (case/punctuation duplicates)
        (
            [["Winter Quay"], ["winter quay!"], ["WINTER-QUAY"]],
            [["Winter Quay", "winter quay!"], ["WINTER-QUAY"]],  # the hyphen joins: "winterquay" differs
            [["winter quay"], ["winterquay"]],
        ),
        # merge is on the primary only: equal aliases of different primaries stay two entities
        (
            [["Heat", "The Film"], ["Warmth", "The Film"]],
            [["Heat", "The Film"], ["Warmth", "The Film"]],
            [["heat", "film"], ["warmth", "film"]],
        ),
        # clean_text: whitespace runs and no-break spaces collapse; exact duplicates dropped
        ([["Port\u00a0Hollin", "Port Hollin", "  Port   Hollin "]], [["Port Hollin"]], [["port hollin"]]),
        # strings that normalize to "" are dropped, then the group is skipped if empty
        ([["?", "", None], ["...", "Łowicz Górny"]], [["Łowicz Górny"]], [["łowicz gorny"]]),
        # an empty primary does not block the aliases: the first surviving alias becomes primary
        ([["", "Ørnes", "Ornes"]], [["Ørnes", "Ornes"]], [["ørnes", "ornes"]]),
        # nothing left at all
        ([[""], ["  "], []], [], []),
        ([], [], []),
        # merge keeps the first entity's position and appends only unseen raw aliases
        (
            [
                ["A Map of Small Rivers"],
                ["Lamps of the North Coast"],
                ["Map of Small Rivers", "A Map of Small Rivers"],
            ],
            [["A Map of Small Rivers", "Map of Small Rivers"], ["Lamps of the North Coast"]],
            [["map of small rivers"], ["lamps of north coast"]],
        ),
    ],
)
def test_build_entities(groups, answers, answers_norm):
    assert build_entities(groups) == (answers, answers_norm)


@pytest.mark.parametrize(
    ("title", "stripped"),
    [
        ("Saltglass (novel)", "Saltglass"),
        ("Oliver Twist (1912 British film)", "Oliver Twist"),
        ("High Profile", "High Profile"),
        ("Heat (1995 film) ", "Heat"),
        ("Foo (bar) baz", "Foo (bar) baz"),  # only a trailing parenthetical
        ("Foo (bar (baz))", "Foo (bar (baz))"),  # nested: not a simple disambiguator, kept
        ("(Untitled)", ""),  # all parenthetical: the full title stays as the only alias
    ],
)
def test_strip_parenthetical(title, stripped):
    assert strip_parenthetical(title) == stripped


@pytest.mark.parametrize("module", ["spader.core.text", "spader.data.records", "spader.data.layout"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


class _CountingStr(str):
    """A string that counts the equality tests made on it (list membership makes one per element)."""

    comparisons = 0

    def __eq__(self, other):
        type(self).comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


@pytest.mark.parametrize(
    "shape",
    [
        "one group of n aliases",  # the quadratic case the issue measured: 100,000 aliases, 150 s
        "n groups merged into one entity",  # held out: every later group merges into the first
    ],
)
def test_building_entities_is_linear_in_the_number_of_aliases(monkeypatch, shape):
    """Counted, not timed: equality tests between aliases stay proportional to their number
    (membership in lists made them n^2 / 2: 2,000,000 for these 2,000 aliases)."""
    import spader.data.records as records

    monkeypatch.setattr(records, "clean_text", lambda s: _CountingStr(" ".join(str(s).split())))
    n = 2000
    if shape == "one group of n aliases":
        groups = [[f"Heat alias {i}" for i in range(n)]]
    else:
        groups = [["Heat", f"Heat alias {i}"] for i in range(n)]
    _CountingStr.comparisons = 0
    answers, _ = build_entities(groups)
    assert len(answers) == 1 and len(answers[0]) == n + (shape != "one group of n aliases")
    assert _CountingStr.comparisons < 10 * n, _CountingStr.comparisons
