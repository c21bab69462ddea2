"""Evaluation sets in, per-instance records and per-run summaries out (docs/method.md, "Evaluation").

Per instance: set precision / recall / F1 of the unique predicted answers against the gold
entities (``spader.core.metrics.prf``: alias-aware, norm_v1, each entity at most once). An instance whose
generation failed, or whose final step is not a valid answer, has no predictions and scores
P = R = F1 = 0; it is always kept. Run aggregates are macro averages over all instances, except
that the authors' evaluation loop (``evaluation.loop: authors``) leaves out the instances it
drops (``dropped``), as their script does.

Each record also carries the search efficiency as the authors' script counts it
(:func:`authors_counting`): queries read from every ``<tool_call>`` span of the whole
conversation text, per gold entity of the last ``<answer>``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from spader.agent.loop import Episode, Question
from spader.core.metrics import (
    authors_correct_count,
    authors_prf,
    authors_query_count,
    correct_count,
    macro_average,
    prf,
    search_efficiency,
)
from spader.core.parsing import authors_answers
from spader.infra.atomic import atomic_path

__all__ = [
    "METRICS",
    "EvalSetError",
    "authors_counting",
    "episode_record",
    "kept",
    "load_eval_set",
    "read_jsonl",
    "summarize",
    "write_jsonl",
]


#: How an instance's precision, recall and F1 are computed (``evaluation.metrics``).
METRICS = ("spader", "authors")


class EvalSetError(ValueError):
    """An evaluation-set line is malformed; the message names the file, line and field."""


def _check_gold(value: Any, where: str) -> list[list[str]]:
    if not isinstance(value, list) or not value:
        raise EvalSetError(f"{where}: field 'ground_truth' must be a non-empty list of alias lists")
    for i, aliases in enumerate(value):
        if not isinstance(aliases, list) or not aliases or not all(isinstance(a, str) for a in aliases):
            raise EvalSetError(
                f"{where}: field 'ground_truth[{i}]' must be a non-empty list of strings, got {aliases!r}"
            )
    return value


def load_eval_set(path: str | os.PathLike) -> list[tuple[Question, str]]:
    """Read ``results/{suite}/data/eval/{dataset}.jsonl`` (lines ``{"id", "question_text",
    "ground_truth": [[aliases...]], "data_source"}``).

    Returns:
        ``(question, data_source)`` pairs in file order.
    Raises:
        EvalSetError: naming the file, line and field of the first malformed line, a repeated id,
            or an empty set.
    """
    out: list[tuple[Question, str]] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise EvalSetError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise EvalSetError(f"{where}: expected a JSON object")
            for key in ("id", "question_text"):
                if not isinstance(row.get(key), str) or not row[key].strip():
                    raise EvalSetError(f"{where}: field '{key}' must be a non-empty string")
            if row["id"] in seen:
                raise EvalSetError(f"{where}: field 'id': {row['id']!r} appears twice")
            seen.add(row["id"])
            gold = _check_gold(row.get("ground_truth"), where)
            out.append((Question(row["id"], row["question_text"], gold), str(row.get("data_source", ""))))
    if not out:
        raise EvalSetError(f"{path}: the evaluation set has no instances")
    return out


def authors_counting(ep: Episode) -> tuple[int, int]:
    """``(queries, correct entities)`` of an episode as the authors' evaluation script counts them
    (``compute_score_qampari``): the queries of every ``<tool_call>`` span of the conversation's
    messages joined by newlines (the user prompt, every turn, every observation:
    :func:`spader.core.metrics.authors_query_count`, so the prompt's example call, a bare
    ``<tool_call>`` swallowing the first call, malformed calls and error messages count), and the
    gold entities named by the last ``<answer>`` of the turns, matched their way
    (:func:`spader.core.metrics.authors_correct_count`)."""
    messages = [ep.prompt_text]
    for step in ep.steps:
        messages.append(step.text)
        if step.observation is not None:
            messages.append(step.observation)
    predicted = authors_answers(ep.assistant_text())
    return authors_query_count("\n".join(messages)), authors_correct_count(predicted, ep.question.gold)


def episode_record(ep: Episode, data_source: str = "", metrics: str = "spader") -> dict[str, Any]:
    """The per-instance JSONL record of one finished episode; precision, recall and F1 as
    ``metrics`` (``evaluation.metrics``) computes them: ``spader`` (:func:`spader.core.metrics.prf`)
    or ``authors`` (:func:`spader.core.metrics.authors_prf`).

    Fields: question, predictions, gold, precision/recall/f1 and the number of gold entities
    predicted (``correct_entities``), format validity (and why not), searches issued (search
    steps that ran queries, the queries run, and every query the agent wrote, ``queries_written``:
    also those beyond the per-call cap or in a call the budget left unrun), the authors' search
    efficiency of the instance (``search_efficiency``: queries written per correct entity, 0 when
    none), whether a token budget cut the episode short (``budget_cut``) and how many turns were
    cut (``budget_cut_turns``), new valid entities per turn (counts; entity indices per step in
    ``steps``), the episode's status and error, whether the means leave it out (``dropped``: the
    authors' loop drops an episode that failed otherwise than by a generation error), and the
    authors' counting (``conversation_queries``, ``authors_correct_entities`` and their ratio
    ``conversation_queries_per_correct_entity``, 0 when either is 0: :func:`authors_counting`).
    """
    preds = ep.predictions
    if metrics not in METRICS:
        raise ValueError(f"evaluation.metrics must be one of {METRICS}, got {metrics!r}")
    p, r, f = (prf if metrics == "spader" else authors_prf)(preds, ep.question.gold)
    correct = correct_count(preds, ep.question.gold)
    written = sum(len(s.queries) + s.skipped_queries for s in ep.steps if s.kind != "retrieval")
    new_per_turn = [len(s.new_entities) for s in ep.steps]
    tag_queries, tag_correct = authors_counting(ep)
    return {
        "id": ep.question.id,
        "data_source": data_source,
        "question": ep.question.question,
        "gold": ep.question.gold,
        "predictions": preds,
        "precision": p,
        "recall": r,
        "f1": f,
        "correct_entities": correct,
        "format_valid": ep.format_valid,
        "invalid_reason": ep.invalid_reason,
        "status": ep.status,
        "error": ep.error,
        "dropped": ep.dropped,
        "budget_cut": ep.budget_cut,
        "budget_cut_turns": sum(1 for s in ep.steps if s.budget_cut),
        "turns": len(ep.steps),
        "search_calls": sum(1 for s in ep.steps if s.queries),
        "queries_issued": sum(len(s.queries) for s in ep.steps),
        "queries_written": written,
        "search_efficiency": search_efficiency(written, correct),
        "conversation_queries": tag_queries,
        "authors_correct_entities": tag_correct,
        "conversation_queries_per_correct_entity": search_efficiency(tag_queries, tag_correct),
        "new_entities_per_turn": new_per_turn,
        "entities_found": sum(new_per_turn),
        # the observation texts (up to agent.max_tool_response_chars per step) stay out of the record
        "steps": [{k: v for k, v in asdict(s).items() if k != "observation"} for s in ep.steps],
    }


def kept(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records the means are taken over: all but those the authors' loop drops."""
    return [rec for rec in records if not rec.get("dropped")]


def summarize(records: Sequence[Mapping[str, Any]], **meta: Any) -> dict[str, Any]:
    """Macro-averaged P/R/F1 and counts of one method on one dataset, plus ``meta``. ``n`` counts
    the records; the means leave out those the authors' loop drops (``dropped`` counts them)."""
    total = len(records)
    dropped = total - len(kept(records))
    records = kept(records)
    p, r, f, n = macro_average((rec["precision"], rec["recall"], rec["f1"]) for rec in records)
    return {
        **meta,
        "n": total,
        "dropped": dropped,
        "precision": p,
        "recall": r,
        "f1": f,
        "format_valid_rate": (sum(bool(rec["format_valid"]) for rec in records) / n) if n else 0.0,
        "failed": sum(rec["status"] in ("generation_error", "episode_error") for rec in records),
        "generation_errors": sum(rec["status"] == "generation_error" for rec in records),
        "statuses": dict(sorted(Counter(rec["status"] for rec in records).items())),
        "budget_cut": sum(bool(rec.get("budget_cut")) for rec in records),
        "search_calls": sum(rec["search_calls"] for rec in records),
        "queries_issued": sum(rec["queries_issued"] for rec in records),
        "entities_found": sum(rec["entities_found"] for rec in records),
        "search_efficiency": (sum(rec["search_efficiency"] for rec in records) / n) if n else 0.0,
        "mean_turns": (sum(rec["turns"] for rec in records) / n) if n else 0.0,
    }


def write_jsonl(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> None:
    """Write rows atomically (a crash never leaves a half-written file under the final name)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a JSONL file; a malformed line raises naming the file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return rows
