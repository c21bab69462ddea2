"""StepSearch's dense token rewards for a batch of rollouts (docs/baselines.md, "StepSearch").

Every assistant run but the last is a search turn rewarded with ``lambda_s * (G^t - P^t)``
(:mod:`spader.methods.stepsearch.gain`); the last run gets the terminal reward (F1 or the
invalid-format reward, as computed by the reward function). As in StepSearch's code, a trajectory
whose final answer is invalid gets no step rewards (only the terminal one), nor does a question
without evidence (``n = 0``: no gain and no redundancy penalty).

Pure: torch, numpy and the core only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor

from torch import Tensor

from spader.methods.steps import StepStats, TurnDetails, place_rows, records_by_turn, rows_with_steps
from spader.methods.stepsearch.gain import SearchTurn, batch_match_degrees, information_gains, redundancy

__all__ = ["stepsearch_dense_rewards"]


def _search_turns(
    details: Sequence[Sequence[TurnDetails]], counts: list[int], rows: list[int], stats: StepStats
) -> list[list[SearchTurn]]:
    """Per row of ``rows``, its search turns (an empty one where a turn has no record)."""
    turns: list[list[SearchTurn]] = []
    for i in rows:
        placed = records_by_turn(details[i], counts[i] - 1, stats)  # the last run is the answer turn
        turns.append([SearchTurn(d.passage_ids, d.passage_texts) if d else SearchTurn() for d in placed])
    return turns


def _stepsearch_search_rewards(
    gains: list[float],
    repeats: list[float],
    lambda_s: float,
    has_evidence: bool,
    valid: bool,
    stats: StepStats,
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
) -> tuple[Tensor, StepStats]:
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
    stats = StepStats()
    steps, counts, rows = rows_with_steps(response_mask, skip, stats)
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
    return place_rows(rewards, steps, length), stats
