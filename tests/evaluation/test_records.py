"""Per-instance scoring and macro averages on hand-computed instances; evaluation-set checks."""

from __future__ import annotations

import contextlib
import json

import pytest
from sections import search_settings

from spader.agent.loop import Episode, Question, Step
from spader.core.parsing import parse_answer
from spader.evaluation.episodes import EvalSetError, episode_record, load_eval_set, summarize

GOLD = [["Paris", "Paname"], ["Lyon"], ["Marseille", "Massilia"]]


def finished(answer_text: str | None, status: str = "answered", gold=GOLD, steps=(), error=None) -> Episode:
    ep = Episode(
        question=Question("x", "Which cities?", gold),
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


def test_the_authors_metrics_count_two_aliases_of_one_entity_as_two_correct_predictions():
    """``evaluation.metrics: authors`` scores the record as their script does; the rest of the
    record is the same, and a metrics name that does not exist is refused."""
    ep = finished('<answer>["Paris", "Paname", "Nice"]</answer>')
    ours, theirs = episode_record(ep), episode_record(ep, metrics="authors")
    assert (ours["precision"], ours["recall"]) == pytest.approx((1 / 3, 1 / 3))
    assert (theirs["precision"], theirs["recall"]) == pytest.approx((2 / 3, 1 / 3))
    assert theirs["f1"] == pytest.approx(2 * (2 / 3) * (1 / 3) / (2 / 3 + 1 / 3))
    rest = {k for k in ours if k not in ("precision", "recall", "f1")}
    assert {k: ours[k] for k in rest} == {k: theirs[k] for k in rest}
    with pytest.raises(ValueError, match="evaluation.metrics"):
        episode_record(ep, metrics="micro")


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


def test_search_efficiency_is_the_authors_queries_per_correct_entity():
    """Per instance: every query the agent wrote (also those beyond the per-call cap or in a call
    the budget left unrun) over the gold entities it predicted correctly; 0 when none."""
    steps = [
        Step(text="", kind="search", queries=["a", "b"], skipped_queries=3),
        Step(text="", kind="search", queries=["c"]),
        Step(text="", kind="answer"),
    ]
    two = episode_record(finished('<answer>["Paris", "Paname", "Lyon", "Nice"]</answer>', steps=steps))
    assert (two["queries_written"], two["correct_entities"], two["search_efficiency"]) == (6, 2, 3.0)
    none = episode_record(finished('<answer>["Nice"]</answer>', steps=steps))
    assert (none["correct_entities"], none["search_efficiency"]) == (0, 0.0)
    silent = episode_record(finished('<answer>["Lyon"]</answer>'))
    assert (silent["queries_written"], silent["search_efficiency"]) == (0, 0.0)
    # the run's figure is the mean over instances, not a ratio of totals
    assert summarize([two, none, silent])["search_efficiency"] == pytest.approx(1.0)


def test_turns_cut_by_a_token_budget_are_recorded_and_summed():
    cut = episode_record(
        finished(None, status="no_action", steps=[Step(text="<think>long", kind="none", budget_cut=True)])
    )
    full = episode_record(finished(None, status="context_budget"))
    fine = episode_record(finished('<answer>["Lyon"]</answer>', steps=[Step(text="", kind="answer")]))
    assert [(r["budget_cut"], r["budget_cut_turns"]) for r in (cut, full, fine)] == [
        (True, 1),
        (True, 0),
        (False, 0),
    ]
    assert summarize([cut, full, fine])["budget_cut"] == 2


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


# --------------------------------------------------------------------------------------------
# An evaluation whose engine dies fails instead of writing its records
# --------------------------------------------------------------------------------------------
class StandInClient:
    """Stand-in for a client of the retrieval service (the real service needs a Lucene index and
    runs in tests/evaluation/test_rules.py): two passages per query."""

    @staticmethod
    @contextlib.contextmanager
    def connected(index_dir, search, log_path=None, threads=None):
        yield StandInClient()

    def retrieve(self, queries, topk=None):
        return [
            [{"id": f"p{i}", "title": "Lyon", "text": f"{q} is in Lyon."} for i in range(2)] for q in queries
        ]


class DyingSglang:
    """Stand-in for sglang's offline engine (it cannot be installed here) whose scheduler process
    dies after the first turn: the first batch answers with searches, every later request raises."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def generate(self, input_ids, sampling_params):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("sglang scheduler process died (exit code -9)")
        ids = self.tokenizer.encode('<tool_call>["Lyon"]</tool_call>', add_special_tokens=False)
        reply = {"text": "", "output_ids": ids, "meta_info": {"finish_reason": {"type": "stop"}}}
        return [dict(reply) for _ in input_ids]

    def shutdown(self):
        pass


def _dying_transformers(model_dir):
    """The real transformers engine, killed after its first batch (fault injection)."""
    from spader.agent.generation import TransformersEngine

    engine = TransformersEngine(model_dir, device="cpu", batch_size=1, threads=1)
    real, calls = engine._generate_batch, []

    def dies(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(*args, **kwargs)

    engine._generate_batch = dies
    return engine


def _dying_sglang(model_dir):
    from spader.agent.generation import load_tokenizer
    from spader.integrations.sglang import SglangEngine

    engine = object.__new__(SglangEngine)  # the project's wrapper around the stand-in
    engine.tokenizer = load_tokenizer(model_dir)
    engine._markers = ["<|im_end|>"]
    engine.engine = DyingSglang(engine.tokenizer)
    return engine


@pytest.mark.parametrize(
    ("name", "build"), [("transformers", _dying_transformers), ("sglang", _dying_sglang)]
)
def test_an_evaluation_whose_engine_dies_fails_and_writes_nothing(
    tiny_qwen3_dir, tmp_path, monkeypatch, name, build
):
    import spader.evaluation.evaluate as evaluate
    from spader.config import AgentConfig, EvaluationConfig

    monkeypatch.setattr(evaluate, "connected_client", StandInClient.connected)
    monkeypatch.setattr(evaluate, "build_engine", lambda engine, model_dir, **kw: build(model_dir))
    rows = [
        {"id": f"q{i}", "question_text": f"Which cities, part {i}?", "ground_truth": [["Lyon"]]}
        for i in range(3)
    ]
    records = _write(tmp_path, [json.dumps(r) for r in rows])
    out = tmp_path / "eval" / "react"
    job_log = tmp_path / "logs" / "evaluate_policy.log"
    with pytest.raises(evaluate.EvaluationFailed) as failure:
        evaluate.evaluate_policy(
            records,
            tmp_path / "index",
            tiny_qwen3_dir,
            out / "qampari.jsonl",
            out / "qampari.json",
            method="react",
            evaluation=EvaluationConfig(engine=name, max_context_tokens=2048, temperature=0.0, gpus=0),
            retrieval=search_settings(topk=2),
            agent=AgentConfig(max_turns=3, max_turn_tokens=16),
            job_log=job_log,
        )
    message = str(failure.value)
    assert f"engine {name!r}" in message and "lost to generation errors" in message
    assert "evaluation.max_error_share=0.02" in message and str(job_log) in message
    assert not out.exists()  # no records, no summary: nothing for the tables to read


def test_a_share_of_generation_errors_above_the_limit_fails_the_run():
    from spader.evaluation.evaluate import EvaluationFailed, check_generation_errors

    recs = [{"status": "answered"}] * 98 + [{"status": "generation_error"}] * 2
    check_generation_errors(recs, engine="sglang", max_error_share=0.02)  # 2 % is allowed
    with pytest.raises(EvaluationFailed, match=r"engine 'sglang': 3 of 101 episodes \(3.0%\).*see job.log"):
        check_generation_errors(
            [*recs, {"status": "generation_error"}], engine="sglang", max_error_share=0.02, log_path="job.log"
        )
