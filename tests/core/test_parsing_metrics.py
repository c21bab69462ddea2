"""The agent's text protocol and the alias-aware metric shared by rewards and evaluation."""

import subprocess
import sys
import time

import pytest

from spader.core.metrics import correct_count, macro_average, prf
from spader.core.parsing import final_answer, parse_answer, parse_tool_call, parse_turn


@pytest.mark.parametrize(
    "text, valid, answers, reason",
    [
        ('<think>ok</think><answer>["A", "B"]</answer>', True, ["A", "B"], ""),
        ("<answer>[]</answer>", True, [], ""),  # empty list is a valid answer (F1 0)
        ("<think>x</think> no answer", False, [], "no_answer"),
        ('<answer>["A"]', False, [], "unclosed_answer"),
        ('<think><think>x</think></think><answer>["A"]</answer>', False, [], "unbalanced_think"),  # nested
        ('<think>x<answer>["A"]</answer>', False, [], "unbalanced_think"),  # unclosed think
        ("<answer>A, B</answer>", False, [], "answer_not_json_list"),
        ('<answer>["A", 3]</answer>', False, [], "answer_not_json_list"),  # not all strings
        ('<answer>{"a": 1}</answer>', False, [], "answer_not_json_list"),
        ('<answer>["old"]</answer> then <answer>["new"]</answer>', True, ["new"], ""),  # last block wins
        ('<answer>["A"] <answer>["B"]</answer>', False, [], "unclosed_answer"),  # opened again first
        ('<answer>["A"] </answer><answer>["B"] <answer>["C"]</answer>', False, [], "unclosed_answer"),
        ('<answer>["A"]</answer> <answer>[</answer> <answer>["C"]</answer>', True, ["C"], ""),
    ],
)
def test_parse_answer_table(text, valid, answers, reason):
    got = parse_answer(text)
    assert (got.valid, got.answers, got.reason) == (valid, answers, reason)


@pytest.mark.parametrize(
    "text, queries, error",
    [
        ('<tool_call>["q1", "q2"]</tool_call>', ["q1", "q2"], None),
        ('<tool_call>[" q1 ", ""]</tool_call>', ["q1"], None),  # stripped, empties dropped
        ("<tool_call>q1</tool_call>", [], "JSON list"),
        ('<tool_call>["", " "]</tool_call>', [], "no non-empty query"),
    ],
)
def test_parse_tool_call_table(text, queries, error):
    got = parse_tool_call(text)
    assert got.queries == queries
    assert (got.error is None) if error is None else (error in got.error)


def test_parse_turn_kinds():
    assert parse_turn('<think>a</think><tool_call>["q"]</tool_call>').kind == "search"
    assert parse_turn('<think>a</think><answer>["A"]</answer>').kind == "answer"
    assert parse_turn("<think>a</think> nothing").kind == "none"
    assert parse_turn('<answer>["A"]').answer.reason == "unclosed_answer"  # cut by the token cap
    assert parse_tool_call("no call") is None


@pytest.mark.parametrize(
    "text, kind, queries, answers",
    [
        # the first closed action tag ends the turn: text after it never counts
        ('<tool_call>["q"]</tool_call><answer>["A"]</answer>', "search", ["q"], None),
        ('<tool_call>["q"]</tool_call> more <tool_call>["r"]</tool_call>', "search", ["q"], None),
        ('<answer>["A"]</answer><tool_call>["q"]</tool_call>', "answer", None, ["A"]),
        ('<answer>["A"]</answer> <answer>["B"]</answer>', "answer", None, ["A"]),
        # an answer opened but a tool call closed first: the call ends the turn
        ('<answer>["A" <tool_call>["q"]</tool_call>', "search", ["q"], None),
        # a stray closing tag with no call ends the turn without one
        ('<think>x</think></tool_call><answer>["A"]</answer>', "none", None, None),
    ],
)
def test_the_first_closed_action_tag_ends_the_turn(text, kind, queries, answers):
    turn = parse_turn(text)
    assert turn.kind == kind
    assert (turn.tool_call.queries if turn.tool_call else None) == queries
    if answers is not None:
        assert turn.answer.valid and turn.answer.answers == answers
    assert text.startswith(turn.text) and turn.text.endswith(("</tool_call>", "</answer>"))


def test_final_answer_of_a_turn_that_ends_with_a_call_is_invalid():
    assert final_answer('<tool_call>["q"]</tool_call><answer>["A"]</answer>').valid is False
    assert final_answer('<think>x</think><answer>["A"]</answer> trailing').answers == ["A"]


@pytest.mark.parametrize(
    "content",
    [
        '["\\ud800"]',  # a lone surrogate: no UTF-8 encoder downstream accepts it
        '["ok", "\\udfff tail"]',
        "[1" + "0" * 5000 + "]",  # beyond Python's integer digit limit
        "[" * 5000 + "]" * 5000,  # nesting deeper than the JSON decoder recurses
        '[["nested"]]',
        "[1e999]",
    ],
)
def test_unusable_queries_are_a_call_error_never_an_exception(content):
    call = parse_tool_call(f"<tool_call>{content}</tool_call>")
    assert call is not None and call.queries == [] and "JSON list of query strings" in call.error
    answer = parse_answer(f"<answer>{content}</answer>")
    assert (answer.valid, answer.reason) == (False, "answer_not_json_list")


@pytest.mark.timeout(60)
def test_parser_is_linear_on_adversarial_tag_soup():
    """1,000,000 characters of unclosed calls and unbalanced/nested think tags; the quadratic
    regex took 12 s for 16,000 repeats. The guard is generous (a linear scan takes milliseconds)."""
    soups = [
        "<tool_call>" * (1_000_000 // 11),
        "<think>" * 70_000 + "</think>" * 30_000 + "<answer>[" * 20_000,
        ('<tool_call>["a"' + "<think>") * 45_000 + "</tool_call" * 10_000,
    ]
    for soup in soups:
        start = time.perf_counter()
        turn = parse_turn(soup)
        final_answer(soup)
        parse_tool_call(soup)
        assert time.perf_counter() - start < 2.0, len(soup)
        assert turn.kind in ("none", "answer") and not (turn.answer and turn.answer.valid)


@pytest.mark.parametrize(
    "predicted, gold, expected",
    [
        (["Paris", "Lyon"], [["Paris"], ["Lyon"]], (1.0, 1.0, 1.0)),
        (["paris", "Paris!"], [["Paris"], ["Lyon"]], (1.0, 0.5, 2 / 3)),  # duplicates after normalization
        (["Paris", "Paname"], [["Paris", "Paname"], ["Lyon"]], (0.5, 0.5, 0.5)),  # two aliases, one hit
        ([], [["Paris"]], (0.0, 0.0, 0.0)),
        (["Nice"], [["Paris"]], (0.0, 0.0, 0.0)),
        (["X"], [["X", "Y"], ["X"]], (1.0, 0.5, 2 / 3)),  # one prediction matches one entity only
    ],
)
def test_prf_table(predicted, gold, expected):
    assert prf(predicted, gold) == pytest.approx(expected)


def test_macro_average():
    assert macro_average([(1.0, 0.5, 0.6), (0.0, 0.0, 0.0)]) == (0.5, 0.25, 0.3, 2)
    assert macro_average([]) == (0.0, 0.0, 0.0, 0)


def test_pure_core_imports_no_framework():
    code = (
        "import sys, spader.core.text, spader.core.rewards, spader.core.advantage, spader.methods.steps, spader.core.metrics, "
        "spader.core.parsing, spader.core.prompt\n"
        "bad = [m for m in ('verl', 'ray', 'sglang', 'snakemake') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("n, reverse", [(1000, False), (5000, True)])
def test_matching_over_a_chain_of_linked_aliases_needs_no_recursion(n, reverse):
    """Entity i is named by aliases a_i and a_{i+1}: each prediction takes the entity the previous
    one held, so the augmenting path is as long as the chain (the recursive search raised
    RecursionError at 1,000). The held-out variant: a longer chain, predictions in reverse order."""
    gold = [[f"a{i}", f"a{i + 1}"] for i in range(n)]
    preds = [f"a{i}" for i in range(1, n + 1)] + ["a0"]
    if reverse:
        preds.reverse()
    assert correct_count(preds, gold) == n
    assert prf(preds, gold) == pytest.approx((n / (n + 1), 1.0, 2 * n / (2 * n + 1)))


def test_matching_is_maximum_on_random_alias_graphs():
    """Against networkx's bipartite maximum matching, on 300 random graphs with shared aliases."""
    import random

    import networkx as nx

    from spader.core.metrics import gold_alias_sets, match_count

    rng = random.Random(7)
    for _ in range(300):
        names = [f"n{i}" for i in range(rng.randint(1, 12))]
        gold = [rng.sample(names, rng.randint(1, min(3, len(names)))) for _ in range(rng.randint(1, 10))]
        preds = list(dict.fromkeys(rng.choice(names) for _ in range(rng.randint(1, 12))))
        sets = gold_alias_sets(gold)
        graph = nx.Graph()
        graph.add_nodes_from((("p", i) for i in range(len(preds))), bipartite=0)
        graph.add_nodes_from((("e", j) for j in range(len(sets))), bipartite=1)
        graph.add_edges_from(
            (("p", i), ("e", j)) for i, p in enumerate(preds) for j, s in enumerate(sets) if p in s
        )
        top = [("p", i) for i in range(len(preds))]
        expected = len(nx.bipartite.maximum_matching(graph, top_nodes=top)) // 2
        assert match_count(preds, sets) == expected, (preds, gold)
