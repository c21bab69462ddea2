"""The agent's text protocol and the alias-aware metric shared by rewards and evaluation."""

import subprocess
import sys

import pytest

from spader.core.metrics import macro_average, prf
from spader.core.parsing import parse_answer, parse_tool_call, parse_turn


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
    # an answer ends the episode even next to a tool call
    assert parse_turn('<tool_call>["q"]</tool_call><answer>["A"]</answer>').kind == "answer"
    assert parse_turn("<think>a</think> nothing").kind == "none"
    assert parse_tool_call("no call") is None


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
        "import sys, spader.core.text, spader.core.rewards, spader.core.advantage, spader.core.densify, spader.core.metrics, "
        "spader.core.parsing, spader.core.prompt\n"
        "bad = [m for m in ('verl', 'ray', 'sglang', 'snakemake') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
