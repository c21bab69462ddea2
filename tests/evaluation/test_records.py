"""Per-instance scoring and macro averages on hand-computed instances; evaluation-set checks."""

from __future__ import annotations

import json

import pytest

from spader.agent.loop import Episode, Question, Step
from spader.core.parsing import parse_answer
from spader.evaluation.episodes import EvalSetError, episode_record, load_eval_set, summarize

GOLD = [["Paris", "Paname"], ["Lyon"], ["Marseille", "Massilia"]]


def finished(answer_text: str | None, status: str = "answered", gold=GOLD, steps=(), error=None) -> Episode:
    ep = Episode(
        question=Question("x", "Which cities?", gold),
        messages=[],
        steps=list(steps),
        status=status,
        error=error,
    )
    ep.answer = parse_answer(answer_text) if answer_text is not None else None
    return ep


@pytest.mark.parametrize(
    ("answer", "p", "r"),
    [
        ('["Paris", "Lyon", "Marseille"]', 1.0, 1.0),  # all found
        ('["paname", "LYON"]', 1.0, 2 / 3),  # an alias and a case variant
        ('["Paris", "Paname"]', 0.5, 1 / 3),  # two aliases of one entity: one hit, one false positive
        ('["Lyon", "Lyon", "lyon!"]', 1.0, 1 / 3),  # duplicates after normalization count once
        ('["Nice", "Lyon"]', 0.5, 1 / 3),  # one wrong
        ("[]", 0.0, 0.0),  # empty prediction: valid format, F1 = 0
    ],
)
def test_instance_scores(answer, p, r):
    rec = episode_record(finished(f"<answer>{answer}</answer>"))
    f = 0.0 if p + r == 0 else 2 * p * r / (p + r)
    assert rec["format_valid"]
    assert (rec["precision"], rec["recall"], rec["f1"]) == pytest.approx((p, r, f))


def test_failures_and_invalid_formats_are_zeros_and_kept_in_the_macro_average():
    good = episode_record(finished('<answer>["Paris", "Lyon", "Marseille"]</answer>'))  # F1 1
    half = episode_record(finished('<answer>["Paris", "Nice"]</answer>'))  # P 1/2, R 1/3, F1 0.4
    failed = episode_record(finished(None, status="generation_error", error="CUDA error"))
    invalid = episode_record(finished('<answer>["Paris"'))  # unclosed
    budget = episode_record(finished(None, status="turn_budget"))
    for rec in (failed, invalid, budget):
        assert (rec["precision"], rec["recall"], rec["f1"], rec["format_valid"]) == (0.0, 0.0, 0.0, False)
    assert failed["error"] == "CUDA error" and invalid["invalid_reason"] == "unclosed_answer"
    summary = summarize([good, half, failed, invalid, budget], method="react", dataset="qampari")
    assert summary["n"] == 5 and summary["failed"] == 1
    assert summary["f1"] == pytest.approx((1.0 + 0.4) / 5)
    assert summary["precision"] == pytest.approx((1.0 + 0.5) / 5)
    assert summary["recall"] == pytest.approx((1.0 + 1 / 3) / 5)
    assert summary["format_valid_rate"] == pytest.approx(2 / 5)
    assert summary["statuses"] == {"answered": 3, "generation_error": 1, "turn_budget": 1}
    assert summary["method"] == "react" and summary["dataset"] == "qampari"


def test_search_counts_and_discovery_per_turn():
    steps = [
        Step(text="", kind="search", queries=["a", "b"], new_entities=[0, 2]),
        Step(text="", kind="search", tool_error="bad call"),
        Step(text="", kind="search", queries=["c"], new_entities=[1]),
        Step(text="", kind="answer"),
    ]
    rec = episode_record(finished('<answer>["Paris"]</answer>', steps=steps), "qampari")
    assert rec["new_entities_per_turn"] == [2, 0, 1, 0] and rec["entities_found"] == 3
    assert (rec["search_calls"], rec["queries_issued"], rec["turns"]) == (2, 3, 4)
    assert rec["data_source"] == "qampari"


def _write(tmp_path, lines):
    path = tmp_path / "qampari.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_eval_set_is_read_in_order(tmp_path):
    rows = [
        {
            "id": "a",
            "question_text": "Q1?",
            "ground_truth": [["A", "Alias"], ["B"]],
            "data_source": "qampari",
        },
        {"id": "b", "question_text": "Q2?", "ground_truth": [["C"]], "data_source": "qampari"},
    ]
    items = load_eval_set(_write(tmp_path, [json.dumps(r) for r in rows] + [""]))
    assert [(q.id, q.question, q.gold, src) for q, src in items] == [
        ("a", "Q1?", [["A", "Alias"], ["B"]], "qampari"),
        ("b", "Q2?", [["C"]], "qampari"),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"qampari.jsonl:2: not valid JSON"),
        ('{"id": "b", "ground_truth": [["x"]]}', r"qampari.jsonl:2: field 'question_text'"),
        (
            '{"id": "b", "question_text": "Q", "ground_truth": ["x"]}',
            r"qampari.jsonl:2: field 'ground_truth\[0\]'",
        ),
        ('{"id": "b", "question_text": "Q", "ground_truth": []}', r"qampari.jsonl:2: field 'ground_truth'"),
        (
            '{"id": "a", "question_text": "Q", "ground_truth": [["x"]]}',
            r"qampari.jsonl:2: field 'id': 'a' appears twice",
        ),
        ("[1, 2]", r"qampari.jsonl:2: expected a JSON object"),
    ],
)
def test_malformed_eval_lines_name_file_line_and_field(tmp_path, line, message):
    first = json.dumps({"id": "a", "question_text": "Q1?", "ground_truth": [["A"]]})
    with pytest.raises(EvalSetError, match=message):
        load_eval_set(_write(tmp_path, [first, line]))


def test_an_empty_eval_set_is_an_error(tmp_path):
    with pytest.raises(EvalSetError, match="qampari.jsonl: the evaluation set has no instances"):
        load_eval_set(_write(tmp_path, [""]))
