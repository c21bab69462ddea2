"""R3-RAG's dense token rewards for a batch of rollouts (docs/baselines.md, "R3-RAG").

Process scores of the search turns come from an injected scorer (the LLM judge or the reranker),
scaled by the trajectory's outcome (:mod:`spader.methods.r3rag.scoring`); each turn's reward goes
on the last token of its assistant run.

Pure: torch and the core only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from spader.methods.r3rag.scoring import r3rag_rewards
from spader.methods.steps import StepStats, TurnDetails, place_rows, records_by_turn, rows_with_steps

__all__ = ["TurnScorer", "r3rag_dense_rewards"]

#: ``score_turns(items) -> rho``: process scores in [0, 1] of ``(question, TurnDetails)`` items.
TurnScorer = Callable[[Sequence[tuple[str, TurnDetails]]], Sequence[float]]


def _score_turns(
    outcomes: Sequence[str],
    details: Sequence[Sequence[TurnDetails]],
    questions: Sequence[str],
    score_turns: TurnScorer,
    counts: list[int],
    rows: list[int],
    stats: StepStats,
) -> tuple[dict[int, list[float]], int]:
    """``(rho per row, turns judged)``: the process score of each run of each row of ``rows`` (0
    for a turn not scored: one whose reward does not depend on it, without a record, or an error)."""
    rho: dict[int, list[float]] = {}
    wanted: list[tuple[int, int]] = []
    items: list[tuple[str, TurnDetails]] = []
    for i in rows:
        placed = records_by_turn(details[i], counts[i], stats)
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
) -> tuple[Tensor, StepStats]:
    """Token rewards of R3-RAG for a batch.

    Only the turns whose reward depends on their score are scored (every run but the last, and the
    last one too when the outcome is ``no_answer``); a turn without a record or with an error
    observation scores 0 without being sent to the scorer.

    Args:
        response_mask: (B, L) 1 on assistant tokens.
        terminal: (B,) terminal reward of each row; the F1 for an ``answered`` row.
        outcomes: per row, :func:`spader.methods.r3rag.scoring.classify_final_turn` of its last turn.
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
    stats = StepStats()
    steps, counts, rows = rows_with_steps(response_mask, skip, stats)
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
    return place_rows(rewards, steps, length), stats
