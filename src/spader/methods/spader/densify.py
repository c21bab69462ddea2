"""Dense step rewards for a batch of rollouts (docs/method.md, "Rewards" + "Token mapping").

The search tool records, for each search step of a trajectory, which ground-truth entities the
returned passages contained (:class:`spader.methods.steps.StepRecord`, stored in the rollout's
extra fields). The rollout's scalar reward is the terminal reward (F1 or the invalid-format
reward). :func:`densify_rewards` turns both into token-level rewards for the whole batch:

* step t of a trajectory is its t-th assistant run (:func:`spader.core.advantage.segment_steps`);
  every run but the last is a search step, the last run is the answer step (or the turn where
  the episode was cut off);
* search-step rewards need the whole group (``N(e)`` counts the group's trajectories that found
  ``e``), so they are computed per prompt group with :func:`spader.core.rewards.search_step_rewards`;
* each step's reward goes on the last token of its assistant run.

Pure: torch and the core only; the verl trainer mode calls it on what it reads from
TransferQueue.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from spader.core.advantage import place_step_rewards, segment_steps
from spader.core.rewards import StepRewardWeights, _search_rewards
from spader.methods.steps import N_GOLD_KEY, StepRecord

__all__ = [
    "DensifyStats",
    "densify_rewards",
]

log = logging.getLogger(__name__)


@dataclass
class DensifyStats:
    """Bookkeeping of one batch, logged as training metrics (nothing is dropped silently).

    Attributes:
        trajectories: rows densified.
        search_steps: search steps rewarded.
        new_entities: entities newly found over all search steps.
        missing_records: search steps (assistant runs before the last) without a tool record;
            they are rewarded as finding nothing with zero queries.
        dropped_records: tool records without a search step to sit on (the episode was cut off
            right after the call, or the response was truncated), ignored.
        empty_responses: rows without any assistant token (their rewards cannot be placed).
        tool_errors: tool records of steps that returned an error observation (malformed call or
            search service failure).
        search_reward_sum: sum of all search-step rewards.
        search_reward_min, search_reward_max: the smallest and largest search-step reward (0 when
            there was no search step).
        terminal_reward_sum: sum of all terminal rewards placed.
    """

    trajectories: int = 0
    search_steps: int = 0
    new_entities: int = 0
    missing_records: int = 0
    dropped_records: int = 0
    empty_responses: int = 0
    tool_errors: int = 0
    search_reward_sum: float = 0.0
    search_reward_min: float = 0.0
    search_reward_max: float = 0.0
    terminal_reward_sum: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def metrics(self, prefix: str = "spader/") -> dict[str, float]:
        """Flat metric dict (means per trajectory / per search step)."""
        n = max(self.trajectories, 1)
        return {
            f"{prefix}search_steps/mean": self.search_steps / n,
            f"{prefix}new_entities/mean": self.new_entities / n,
            f"{prefix}search_reward/mean": self.search_reward_sum / max(self.search_steps, 1),
            f"{prefix}search_reward/min": self.search_reward_min,
            f"{prefix}search_reward/max": self.search_reward_max,
            f"{prefix}terminal_reward/mean": self.terminal_reward_sum / n,
            f"{prefix}missing_step_records": float(self.missing_records),
            f"{prefix}dropped_step_records": float(self.dropped_records),
            f"{prefix}empty_responses": float(self.empty_responses),
            f"{prefix}tool_errors": float(self.tool_errors),
            **{f"{prefix}{k}": v for k, v in self.extra.items()},
        }


_NOTHING: frozenset[int] = frozenset()


def _aligned_search_steps(
    records: Sequence[StepRecord], n_search: int
) -> tuple[list[frozenset[int]], list[int], int, int, int]:
    """Hits and query counts of the ``n_search`` search steps of one trajectory.

    Returns ``(hits, queries, missing, dropped, errors)``: a record sits on the search step of its
    turn; search steps without a record find nothing with zero queries (``missing``), records
    without a search step, or a second record for one step, are ignored (``dropped``).
    """
    hits = [_NOTHING] * n_search
    queries = [0] * n_search
    filled: set[int] = set()
    dropped = errors = 0
    for rec in records:
        if rec.error:
            errors += 1
        t = rec.turn - 1
        if t >= n_search or t in filled:
            dropped += 1
            continue
        filled.add(t)
        hits[t] = rec.hits
        queries[t] = rec.queries
    return hits, queries, n_search - len(filled), dropped, errors


def _groups(
    group_ids: Sequence[Any], counts: list[int], skip: list[bool], stats: DensifyStats
) -> dict[Any, list[int]]:
    """The rows of each prompt group, without skipped rows and empty responses (those counted)."""
    groups: dict[Any, list[int]] = defaultdict(list)
    for i in range(len(counts)):
        if skip[i]:
            continue
        if counts[i] == 0:
            stats.empty_responses += 1
            continue
        groups[group_ids[i]].append(i)
    return groups


def _group_search_rewards(
    uid: Any,
    members: list[int],
    records: Sequence[Sequence[StepRecord]],
    counts: list[int],
    n_gold: Sequence[int | None],
    weights: StepRewardWeights,
    stats: DensifyStats,
) -> tuple[list[list[float]], list[int]]:
    """The search-step rewards and new-entity counts of one group's rows (records counted in stats)."""
    hits, queries, n_gt_values = [], [], set()
    for i in members:
        h, q, missing, dropped, errors = _aligned_search_steps(records[i], counts[i] - 1)
        stats.missing_records += missing
        stats.dropped_records += dropped
        stats.tool_errors += errors
        hits.append(h)
        queries.append(q)
        if n_gold[i] is not None:
            n_gt_values.add(int(n_gold[i]))
    if len(n_gt_values) > 1:
        raise ValueError(
            f"group {uid!r}: its trajectories disagree on the number of gold entities {n_gt_values}"
        )
    if any(hits):  # at least one search step in the group
        if not n_gt_values or min(n_gt_values) < 1:
            raise ValueError(f"group {uid!r} has search steps but no trajectory recorded {N_GOLD_KEY} >= 1")
        return _search_rewards(hits, queries, n_gt_values.pop(), weights)
    return [[] for _ in members], [0] * len(members)


def _count_row(stats: DensifyStats, r: list[float], n_new: int, terminal_value: float) -> None:
    """Add one trajectory's search-step rewards ``r`` and terminal reward to ``stats``."""
    stats.trajectories += 1
    stats.search_steps += len(r)
    stats.new_entities += n_new
    if r:
        low, high = min(r), max(r)
        first = stats.search_steps == len(r)  # this row's are the batch's first search steps
        stats.search_reward_min = low if first else min(stats.search_reward_min, low)
        stats.search_reward_max = high if first else max(stats.search_reward_max, high)
    stats.search_reward_sum += sum(r)
    stats.terminal_reward_sum += terminal_value


def densify_rewards(
    response_mask: Tensor,
    terminal: Tensor,
    group_ids: Sequence[Any],
    records: Sequence[Sequence[StepRecord]],
    n_gold: Sequence[int | None],
    weights: StepRewardWeights,
    *,
    skip: Sequence[bool] | None = None,
) -> tuple[Tensor, DensifyStats]:
    """Token-level rewards of a batch: search-step rewards and the terminal reward on step ends.

    Args:
        response_mask: (B, L) 1 on assistant tokens, 0 on observation and padding tokens.
        terminal: (B,) terminal reward of each trajectory (F1 or the invalid-format reward).
        group_ids: (B,) prompt group (uid) of each trajectory, any hashable.
        records: per trajectory, the tool's :class:`StepRecord` list.
        n_gold: per trajectory, ``|E_GT|`` of its question (None when it never searched).
        weights: the search-step reward's hyperparameters at this training step.
        skip: optional (B,) True for rows to leave at 0 (verl's synthetic padding rows).
    Returns:
        ``(dense (B, L) float32, stats)``.
    """
    b, length = response_mask.shape
    if not (len(group_ids) == len(records) == len(n_gold) == terminal.numel() == b):
        raise ValueError(
            f"batch of {b} responses but {len(group_ids)} group ids, {len(records)} record lists, "
            f"{len(n_gold)} n_gold values and {terminal.numel()} terminal rewards"
        )
    skip = list(skip) if skip is not None else [False] * b
    steps = segment_steps(response_mask)
    counts = steps.count.tolist()
    stats = DensifyStats()
    step_rewards = [[0.0] * max(c, 1) for c in counts]
    terminal_values = terminal.tolist()
    for uid, members in _groups(group_ids, counts, skip, stats).items():
        rewards, new_counts = _group_search_rewards(uid, members, records, counts, n_gold, weights, stats)
        for i, r, n_new in zip(members, rewards, new_counts, strict=False):
            row = step_rewards[i]
            row[: len(r)] = r
            row[counts[i] - 1] = terminal_values[i]
            _count_row(stats, r, n_new, terminal_values[i])
    width = max(len(r) for r in step_rewards) if step_rewards else 1
    table = torch.tensor([r + [0.0] * (width - len(r)) for r in step_rewards], dtype=torch.float32).reshape(
        b, width
    )
    dense = place_step_rewards(table, steps, length)
    if stats.dropped_records or stats.missing_records:
        log.info(
            "step records: %d without a search step to sit on (ignored), %d search steps without a record",
            stats.dropped_records,
            stats.missing_records,
        )
    return dense, stats
