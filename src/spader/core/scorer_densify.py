"""Dense token rewards of the step-level baselines StepSearch and R3-RAG for a batch of rollouts.

The same search-tool records as SPADER's (:data:`spader.core.spader_densify.STEPS_KEY`, one per search
turn), with the details these baselines need added by the tool (:class:`TurnDetails`: the
passages shown with their ids, texts and search scores, the queries, the turn's reasoning and the
start of its observation). Turn t of a trajectory is its t-th assistant run
(:func:`spader.core.advantage.segment_steps`); each turn's reward goes on the last token of its run
(:func:`spader.core.advantage.place_step_rewards`), never on an observation token.

* :func:`stepsearch_dense_rewards`: every run but the last is a search turn rewarded with
  ``lambda_s * (G^t - P^t)`` (:mod:`spader.core.stepsearch`); the last run gets the terminal
  reward (F1 or the invalid-format reward, as computed by the reward function). As in
  StepSearch's code, a trajectory whose final answer is invalid gets no step rewards (only the
  terminal one), nor does a question without evidence (``n = 0``: no gain and no redundancy
  penalty).
* :func:`r3rag_dense_rewards`: process scores of the search turns from an injected scorer (the LLM
  judge or the reranker), scaled by the trajectory's outcome (:mod:`spader.core.r3rag`).

Pure: torch, numpy and the core only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from spader.core.advantage import place_step_rewards, segment_steps
from spader.core.r3rag import OBSERVATION_CHARS, r3rag_rewards
from spader.core.spader_densify import STEPS_KEY
from spader.core.stepsearch import SearchTurn, batch_match_degrees, information_gains, redundancy

__all__ = [
    "ScorerStats",
    "TurnDetails",
    "parse_turn_details",
    "r3rag_dense_rewards",
    "stepsearch_dense_rewards",
]

log = logging.getLogger(__name__)

# Keys the search tool adds to a step record when it records details (see TurnDetails.fields).
_DETAIL_KEYS = ("passages", "query_texts", "reasoning", "observation")


@dataclass(frozen=True)
class TurnDetails:
    """What one search turn showed, as the step-level baselines need it.

    Attributes:
        turn: 1-based assistant turn that issued the search.
        passage_ids, passage_texts, scores: the passages shown (all queries, rank order, repeats
            kept), their text (title and body) and search score (the reranker's, when reranking).
        queries: the queries run.
        reasoning: the turn's reasoning (:func:`spader.core.r3rag.turn_reasoning`).
        observation: the start of the observation text (what an LLM judge reads).
        error: why the turn returned an error instead of passages (None if it did not).
    """

    turn: int
    passage_ids: tuple[str, ...] = ()
    passage_texts: tuple[str, ...] = ()
    scores: tuple[float, ...] = ()
    queries: tuple[str, ...] = ()
    reasoning: str = ""
    observation: str = ""
    error: str | None = None

    @staticmethod
    def fields(
        shown: Sequence[Sequence[Mapping[str, Any]]], queries: Sequence[str], reasoning: str, observation: str
    ) -> dict[str, Any]:
        """The keys the search tool adds to its step record (plain types, for the extra fields).

        Args:
            shown: per query, the passages the observation shows (``id``, ``title``, ``text``,
                ``score``).
            queries: the queries run.
            reasoning: the turn's reasoning.
            observation: the observation text (cut here to what a judge reads).
        """
        passages = [
            {
                "id": str(p.get("id", "")),
                "text": f"{p.get('title', '')} {p.get('text', '')}".strip(),
                "score": float(p.get("score", 0.0) or 0.0),
            }
            for per_query in shown
            for p in per_query
        ]
        return {
            "passages": passages,
            "query_texts": [str(q) for q in queries],
            "reasoning": str(reasoning),
            "observation": str(observation)[:OBSERVATION_CHARS],
        }

    @classmethod
    def from_record(cls, d: Mapping[str, Any], where: str = "") -> TurnDetails:
        """Validate one stored step record with details; errors name the record and the field."""
        missing = [k for k in ("turn", *_DETAIL_KEYS) if k not in d]
        if missing:
            raise ValueError(
                f"step record {where} lacks {missing}: the step-level baselines need the search tool to "
                "record turn details (tool config 'record_turns: true')"
            )
        try:
            passages = list(d["passages"] or ())
            return cls(
                turn=int(d["turn"]),
                passage_ids=tuple(str(p["id"]) for p in passages),
                passage_texts=tuple(str(p["text"]) for p in passages),
                scores=tuple(float(p.get("score", 0.0)) for p in passages),
                queries=tuple(str(q) for q in (d["query_texts"] or ())),
                reasoning=str(d["reasoning"] or ""),
                observation=str(d["observation"] or ""),
                error=d.get("error"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"invalid step record {where}: {type(exc).__name__}: {exc}") from exc


def parse_turn_details(extra_fields: Mapping[str, Any] | None, where: str = "") -> list[TurnDetails]:
    """The :class:`TurnDetails` of one rollout's extra fields (empty when it never searched)."""
    raw = (extra_fields or {}).get(STEPS_KEY) or []
    return [TurnDetails.from_record(r, where=f"{where}[{j}]") for j, r in enumerate(raw)]


@dataclass
class ScorerStats:
    """Bookkeeping of one batch, logged as training metrics under ``<prefix>``.

    Attributes:
        trajectories: rows rewarded.
        search_turns: search turns rewarded.
        dropped_records: records without an assistant turn to sit on (ignored).
        empty_responses: rows without any assistant token.
        sums: named sums (divided by ``trajectories`` or ``search_turns`` in :meth:`metrics`).
        counts: named counts, logged as they are.
    """

    trajectories: int = 0
    search_turns: int = 0
    dropped_records: int = 0
    empty_responses: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float(value)

    def count(self, name: str, value: float = 1.0) -> None:
        self.counts[name] = self.counts.get(name, 0.0) + float(value)

    def metrics(self, prefix: str) -> dict[str, float]:
        """Flat metric dict: per-turn means for ``turn_*`` sums, per-trajectory means otherwise."""
        out = {
            f"{prefix}search_turns/mean": self.search_turns / max(self.trajectories, 1),
            f"{prefix}dropped_step_records": float(self.dropped_records),
            f"{prefix}empty_responses": float(self.empty_responses),
        }
        for name, total in self.sums.items():
            per = self.search_turns if name.startswith("turn_") else self.trajectories
            out[f"{prefix}{name}/mean"] = total / max(per, 1)
        out.update({f"{prefix}{k}": v for k, v in self.counts.items()})
        return out


def _rows(response_mask: Tensor, skip: Sequence[bool] | None, stats: ScorerStats):
    steps = segment_steps(response_mask)
    counts = steps.count.tolist()
    skip = list(skip) if skip is not None else [False] * len(counts)
    rows = []
    for i, c in enumerate(counts):
        if skip[i]:
            continue
        if c == 0:
            stats.empty_responses += 1
            continue
        rows.append(i)
    return steps, counts, rows


def _by_turn(details: Sequence[TurnDetails], n_turns: int, stats: ScorerStats) -> list[TurnDetails | None]:
    """Each record on the run of its turn; records beyond the runs, or a second one, are dropped."""
    out: list[TurnDetails | None] = [None] * n_turns
    for d in details:
        t = d.turn - 1
        if not 0 <= t < n_turns or out[t] is not None:
            stats.dropped_records += 1
            continue
        out[t] = d
    return out


def _place(rewards: list[list[float]], steps, length: int) -> Tensor:
    width = max((len(r) for r in rewards), default=1) or 1
    table = torch.tensor([r + [0.0] * (width - len(r)) for r in rewards], dtype=torch.float32)
    return place_step_rewards(table.reshape(len(rewards), width), steps, length)


def _search_turns(
    details: Sequence[Sequence[TurnDetails]], counts: list[int], rows: list[int], stats: ScorerStats
) -> list[list[SearchTurn]]:
    """Per row of ``rows``, its search turns (an empty one where a turn has no record)."""
    turns: list[list[SearchTurn]] = []
    for i in rows:
        placed = _by_turn(details[i], counts[i] - 1, stats)  # the last run is the answer turn
        turns.append([SearchTurn(d.passage_ids, d.passage_texts) if d else SearchTurn() for d in placed])
    return turns


def _stepsearch_search_rewards(
    gains: list[float],
    repeats: list[float],
    lambda_s: float,
    has_evidence: bool,
    valid: bool,
    stats: ScorerStats,
) -> list[float]:
    """One row's search-turn rewards ``lambda_s * (gain - redundancy)``; zeros (counted) for a row
    without evidence or with an invalid answer."""
    search = [lambda_s * (g - r) for g, r in zip(gains, repeats, strict=True)]
    if not has_evidence:
        stats.count("rows_without_evidence")
        search = [0.0] * len(search)
    elif not valid:
        stats.count("rows_invalid_no_step_reward")
        search = [0.0] * len(search)
    return search


def stepsearch_dense_rewards(
    response_mask: Tensor,
    terminal: Tensor,
    details: Sequence[Sequence[TurnDetails]],
    question_keys: Sequence[str],
    evidence: Mapping[str, Sequence[str]],
    *,
    lambda_s: float,
    valid: Sequence[bool] | None = None,
    skip: Sequence[bool] | None = None,
    pool: Executor | None = None,
) -> tuple[Tensor, ScorerStats]:
    """Token rewards of StepSearch for a batch.

    Args:
        response_mask: (B, L) 1 on assistant tokens.
        terminal: (B,) terminal reward of each row (F1, or the invalid-format reward).
        details: per row, the search tool's :class:`TurnDetails`.
        question_keys: per row, the key of its question in ``evidence``.
        evidence: question key -> evidence texts (a question without any has ``n = 0``).
        lambda_s: step-reward scale.
        valid: optional (B,) whether each row's final answer is valid; a row with an invalid one
            gets no step rewards (all rows valid when not given).
        skip: optional (B,) True for rows to leave at 0 (verl's padding rows).
        pool: optional executor for the TF-IDF of each question.
    Returns:
        ``(dense (B, L) float32, stats)``.
    """
    b, length = response_mask.shape
    if not (len(details) == len(question_keys) == terminal.numel() == b):
        raise ValueError(
            f"batch of {b} responses but {len(details)} record lists, {len(question_keys)} question keys "
            f"and {terminal.numel()} terminal rewards"
        )
    valid = list(valid) if valid is not None else [True] * b
    if len(valid) != b:
        raise ValueError(f"batch of {b} responses but {len(valid)} format verdicts")
    stats = ScorerStats()
    steps, counts, rows = _rows(response_mask, skip, stats)
    turns = _search_turns(details, counts, rows, stats)
    ids = [[t.ids for t in row] for row in turns]
    keys = [str(question_keys[i]) for i in rows]
    degrees = batch_match_degrees(list(zip(keys, turns, strict=True)), evidence, pool=pool)
    rewards = [[0.0] for _ in range(b)]
    values = terminal.tolist()
    for k, i in enumerate(rows):
        gains, repeats = information_gains(degrees[k]), redundancy(ids[k])
        search = _stepsearch_search_rewards(
            gains, repeats, lambda_s, bool(evidence.get(keys[k])), valid[i], stats
        )
        rewards[i] = [*search, values[i]]
        stats.trajectories += 1
        stats.search_turns += len(search)
        stats.add("turn_gain", sum(gains))
        stats.add("turn_redundancy", sum(repeats))
        stats.add("turn_reward", sum(search))
        stats.add("terminal_reward", values[i])
        stats.add("info_gain_total", sum(gains))
    return _place(rewards, steps, length), stats


#: ``score_turns(items) -> rho``: process scores in [0, 1] of ``(question, TurnDetails)`` items.
TurnScorer = Callable[[Sequence[tuple[str, TurnDetails]]], Sequence[float]]


def _score_turns(
    outcomes: Sequence[str],
    details: Sequence[Sequence[TurnDetails]],
    questions: Sequence[str],
    score_turns: TurnScorer,
    counts: list[int],
    rows: list[int],
    stats: ScorerStats,
) -> tuple[dict[int, list[float]], int]:
    """``(rho per row, turns judged)``: the process score of each run of each row of ``rows`` (0
    for a turn not scored: one whose reward does not depend on it, without a record, or an error)."""
    rho: dict[int, list[float]] = {}
    wanted: list[tuple[int, int]] = []
    items: list[tuple[str, TurnDetails]] = []
    for i in rows:
        placed = _by_turn(details[i], counts[i], stats)
        rho[i] = [0.0] * counts[i]
        scored = counts[i] if outcomes[i] == "no_answer" else counts[i] - 1
        for t in range(scored):
            d = placed[t]
            if d is not None and d.error is None and d.passage_ids:
                wanted.append((i, t))
                items.append((str(questions[i]), d))
    scores = list(score_turns(items)) if items else []
    if len(scores) != len(items):
        raise ValueError(f"the turn scorer returned {len(scores)} scores for {len(items)} turns")
    for (i, t), s in zip(wanted, scores, strict=True):
        rho[i][t] = float(s)
    return rho, len(items)


def r3rag_dense_rewards(
    response_mask: Tensor,
    terminal: Tensor,
    outcomes: Sequence[str],
    details: Sequence[Sequence[TurnDetails]],
    questions: Sequence[str],
    score_turns: TurnScorer,
    *,
    skip: Sequence[bool] | None = None,
) -> tuple[Tensor, ScorerStats]:
    """Token rewards of R3-RAG for a batch.

    Only the turns whose reward depends on their score are scored (every run but the last, and the
    last one too when the outcome is ``no_answer``); a turn without a record or with an error
    observation scores 0 without being sent to the scorer.

    Args:
        response_mask: (B, L) 1 on assistant tokens.
        terminal: (B,) terminal reward of each row; the F1 for an ``answered`` row.
        outcomes: per row, :func:`spader.core.r3rag.classify_final_turn` of its last turn.
        details: per row, the search tool's :class:`TurnDetails`.
        questions: per row, the question text (the judge reads it).
        score_turns: the process scorer (LLM judge or reranker).
        skip: optional (B,) True for rows to leave at 0.
    Returns:
        ``(dense (B, L) float32, stats)``.
    """
    b, length = response_mask.shape
    if not (len(outcomes) == len(details) == len(questions) == terminal.numel() == b):
        raise ValueError(
            f"batch of {b} responses but {len(outcomes)} outcomes, {len(details)} record lists, "
            f"{len(questions)} questions and {terminal.numel()} terminal rewards"
        )
    stats = ScorerStats()
    steps, counts, rows = _rows(response_mask, skip, stats)
    rho, judged = _score_turns(outcomes, details, questions, score_turns, counts, rows, stats)
    rewards = [[0.0] for _ in range(b)]
    values = terminal.tolist()
    for i in rows:
        f1 = values[i] if outcomes[i] == "answered" else None
        rewards[i] = r3rag_rewards(rho[i], outcomes[i], f1)
        stats.trajectories += 1
        stats.search_turns += counts[i] - 1
        stats.add("turn_rho", sum(rho[i][: counts[i] - 1]))
        stats.add("reward_sum", sum(rewards[i]))
        stats.count(f"outcome_{outcomes[i]}")
    stats.count("judged_turns", judged)
    return _place(rewards, steps, length), stats
