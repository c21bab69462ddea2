"""Diversity-aware exploration rewards (docs/method.md, "Entity normalisation and matching", "Rewards").

Pure Python over plain types; the verl adapters live in ``spader.integrations.verl``.

For one group of G trajectories sampled for the same prompt:

* step discovery: entity ``e`` is *hit* at step t when one of its aliases occurs in the passages
  returned at t (:func:`spader.core.matching.find_hits`); the *new* entities at t are the hits not hit earlier in the
  same trajectory;
* ``N(e)`` is the number of trajectories of the group that hit ``e`` at any step;
* a search step earns ``(sum over new e of R(e) - Cost(a_t)) / |E_GT|`` with
  ``R(e) = alpha + beta * novelty(N(e))`` and ``Cost(a_t) = c`` for a search call (the paper), or
  ``c * q_t`` with ``q_t`` the queries the call issued (``cost_per="query"``, the authors' code)
  (:func:`search_step_rewards`);
* the answer step earns the F1 of the final answer, or the invalid-format reward
  (:func:`terminal_reward`).

The options ``novelty="exp_decay"``, ``cost_per="query"``, ``invalid_format_reward=0.0`` and ``cost_scale`` (with
:func:`cost_warmup_scale`) reproduce the authors' published code (docs/method.md, "Known divergences");
the defaults are the paper's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from spader.core.matching import find_hits, passage_hits  # re-exported: the rewards' hit definition

__all__ = [
    "COST_PER",
    "NOVELTY",
    "StepRewardWeights",
    "cost_warmup_scale",
    "find_hits",
    "group_step_rewards",
    "novelty_premium",
    "passage_hits",
    "search_step_rewards",
    "terminal_reward",
]

#: Novelty premium shapes: ``inverse`` is the paper's ``1 / N``, ``exp_decay`` the authors' code
#: ``exp(-(N - 1))``.
NOVELTY = ("inverse", "exp_decay")
#: What the tool cost counts: ``call`` is the paper's ``Cost(a_t) = c`` per search call (a step
#: that issued at least one query), ``query`` the authors' code, ``c`` per query issued.
COST_PER = ("call", "query")


@dataclass(frozen=True)
class StepRewardWeights:
    """The search-step reward's hyperparameters at one training step.

    Attributes:
        alpha: reward of a new entity; beta: weight of its novelty premium; cost: ``c``, the cost
            of one search call (``cost_per="call"``, paper) or of one query (``"query"``, authors'
            code); novelty: ``"inverse"`` (paper) or ``"exp_decay"`` (authors' code);
            cost_scale: the tool-cost warm-up's multiplier of ``cost`` (:func:`cost_warmup_scale`).

    >>> StepRewardWeights(alpha=1.0, beta=4.0, cost=0.01, cost_scale=0.5).step_cost
    0.005
    >>> w = StepRewardWeights(1.0, 4.0, 0.01)
    >>> w.charge(3), w.charge(0), StepRewardWeights(1.0, 4.0, 0.01, cost_per="query").charge(3)
    (0.01, 0.0, 0.03)
    """

    alpha: float
    beta: float
    cost: float
    novelty: str = "inverse"
    cost_scale: float = 1.0
    cost_per: str = "call"

    def __post_init__(self):
        if self.novelty not in NOVELTY:
            raise ValueError(f"novelty must be one of {NOVELTY}, got {self.novelty!r}")
        if self.cost_per not in COST_PER:
            raise ValueError(f"cost_per must be one of {COST_PER}, got {self.cost_per!r}")

    @property
    def step_cost(self) -> float:
        """The cost of one call (or one query) at this step, ``cost_scale * cost``."""
        return self.cost * self.cost_scale

    def charge(self, queries: int) -> float:
        """``Cost(a_t)`` of a search step that issued ``queries`` queries: ``step_cost`` for a
        call that issued any (``cost_per="call"``; a malformed call issues none and costs nothing),
        ``step_cost * queries`` per query."""
        if self.cost_per == "query":
            return self.step_cost * queries
        return self.step_cost if queries > 0 else 0.0


def novelty_premium(n_found: int, *, novelty: str = "inverse") -> float:
    """Novelty factor of an entity found by ``n_found >= 1`` trajectories of the group.

    ``inverse``: ``1 / N`` (paper); ``exp_decay``: ``exp(-(N - 1))`` (authors' code). Both are 1 for
    a unique find.

    >>> novelty_premium(4), round(novelty_premium(2, novelty="exp_decay"), 4)
    (0.25, 0.3679)
    """
    if n_found < 1:
        raise ValueError(
            f"an entity counted for a reward must be found by at least one trajectory, got {n_found}"
        )
    if novelty == "inverse":
        return 1.0 / n_found
    if novelty == "exp_decay":
        return math.exp(-(n_found - 1))
    raise ValueError(f"novelty must be one of {NOVELTY}, got {novelty!r}")


def cost_warmup_scale(step: int, *, free_steps: int, ramp_steps: int) -> float:
    """Multiplier of the tool cost at training step ``step`` (1-based) under the authors' warm-up.

    The cost is free for the first ``free_steps`` steps, then grows linearly and reaches the full
    cost after ``ramp_steps`` more steps (a step function when ``ramp_steps`` is 0).

    >>> [cost_warmup_scale(s, free_steps=2, ramp_steps=4) for s in (1, 2, 3, 4, 6, 9)]
    [0.0, 0.0, 0.25, 0.5, 1.0, 1.0]
    """
    if free_steps < 0 or ramp_steps < 0:
        raise ValueError(f"free_steps and ramp_steps must be >= 0, got {free_steps}, {ramp_steps}")
    if step <= free_steps:
        return 0.0
    if ramp_steps == 0:
        return 1.0
    return min(1.0, (step - free_steps) / ramp_steps)


def terminal_reward(final_f1: float | None, *, invalid_format_reward: float = -1.0) -> float:
    """Reward of the answer step: the F1 of the final answer, ``invalid_format_reward`` when the
    format is invalid (``final_f1 is None``; paper -1, authors' code 0)."""
    if final_f1 is None:
        return float(invalid_format_reward)
    if not 0.0 <= final_f1 <= 1.0:
        raise ValueError(f"final F1 must lie in [0, 1], got {final_f1}")
    return float(final_f1)


def _check_shapes(
    hits: Sequence[Sequence[Iterable[int]]], queries: Sequence[Sequence[int]], n_gt: int
) -> None:
    if n_gt < 1:
        raise ValueError(f"n_gt (number of ground-truth entities) must be >= 1, got {n_gt}")
    if len(hits) != len(queries):
        raise ValueError(f"hits has {len(hits)} trajectories but queries has {len(queries)}")
    for i, (h, q) in enumerate(zip(hits, queries, strict=False)):
        if len(h) != len(q):
            raise ValueError(f"trajectory {i}: {len(h)} steps of hits but {len(q)} steps of query counts")
        if any(n < 0 for n in q):
            raise ValueError(f"trajectory {i}: query counts must be >= 0, got {list(q)}")


def search_step_rewards(
    hits: Sequence[Sequence[Iterable[int]]],
    queries: Sequence[Sequence[int]],
    n_gt: int,
    *,
    alpha: float,
    beta: float,
    cost: float,
    novelty: str = "inverse",
    cost_scale: float = 1.0,
    cost_per: str = "call",
) -> list[list[float]]:
    """Rewards of the search steps of one group of trajectories (same prompt).

    ``r_t = (sum over new e at t of (alpha + beta * novelty(N(e))) - Cost(a_t)) / n_gt`` where
    *new* means not hit at an earlier step of the same trajectory, ``N(e)`` counts the
    trajectories of the group that hit ``e`` at any step, and ``Cost(a_t)`` is ``cost_scale * cost``
    for a step that issued queries (``cost_per="call"``), or that times ``q_t`` (``"query"``).

    Args:
        hits: ``hits[i][t]`` entity indices (in ``[0, n_gt)``) hit at search step t of trajectory i.
        queries: ``queries[i][t]`` number of queries issued at that step.
        n_gt: number of (deduplicated) ground-truth entities, ``|E_GT|``.
        alpha: information-gain weight.
        beta: novelty-premium weight.
        cost: tool cost ``c`` per search call, or per query.
        novelty: ``inverse`` (``1/N``, paper) or ``exp_decay`` (``exp(-(N-1))``, authors' code).
        cost_scale: multiplier of ``cost`` (the warm-up of the authors' code, see
            :func:`cost_warmup_scale`).
        cost_per: ``call`` (paper) or ``query`` (authors' code), see :data:`COST_PER`.
    Returns:
        ``rewards[i][t]``, the same ragged shape as ``queries``.

    >>> search_step_rewards([[{0}], [{0, 1}]], [[1], [2]], 2, alpha=1.0, beta=4.0, cost=0.0)
    [[1.5], [4.0]]
    """
    _check_shapes(hits, queries, n_gt)
    rewards, _ = _search_rewards(
        hits, queries, n_gt, StepRewardWeights(alpha, beta, cost, novelty, cost_scale, cost_per)
    )
    return rewards


def _search_rewards(
    hits: Sequence[Sequence[Iterable[int]]],
    queries: Sequence[Sequence[int]],
    n_gt: int,
    weights: StepRewardWeights,
) -> tuple[list[list[float]], list[int]]:
    """:func:`search_step_rewards` after the shape checks; also returns the number of new entities
    per trajectory (the trainer logs it). Runs once per training batch on every search step, so
    set operations and one dictionary lookup per new entity, nothing more."""
    new_per_step: list[list[set[int]]] = []
    found_by: dict[int, int] = {}
    for i, steps in enumerate(hits):
        seen: set[int] = set()
        new_steps = []
        for step_hits in steps:
            step_set = step_hits if isinstance(step_hits, set | frozenset) else set(step_hits)
            new_steps.append(step_set - seen)
            seen |= step_set
        if seen and (min(seen) < 0 or max(seen) >= n_gt):
            bad = sorted(e for e in seen if not 0 <= e < n_gt)
            raise ValueError(f"trajectory {i}: entity indices {bad} are outside [0, {n_gt})")
        new_per_step.append(new_steps)
        for e in seen:
            found_by[e] = found_by.get(e, 0) + 1
    alpha, beta, charge = weights.alpha, weights.beta, weights.charge
    value = {e: alpha + beta * novelty_premium(n, novelty=weights.novelty) for e, n in found_by.items()}
    get = value.__getitem__
    rewards = [
        [(sum(map(get, new)) - charge(q)) / n_gt for new, q in zip(new_steps, traj_queries, strict=False)]
        for new_steps, traj_queries in zip(new_per_step, queries, strict=False)
    ]
    return rewards, [sum(len(new) for new in new_steps) for new_steps in new_per_step]


def group_step_rewards(
    hits: Sequence[Sequence[Iterable[int]]],
    queries: Sequence[Sequence[int]],
    final_f1: Sequence[float | None],
    n_gt: int,
    *,
    alpha: float,
    beta: float,
    cost: float,
    novelty: str = "inverse",
    invalid_format_reward: float = -1.0,
    cost_scale: float = 1.0,
    cost_per: str = "call",
) -> list[list[float]]:
    """Per-step rewards of one group: each trajectory's search-step rewards, then its terminal reward.

    Args:
        hits, queries, n_gt, alpha, beta, cost, novelty, cost_scale, cost_per: see
            :func:`search_step_rewards`.
        final_f1: ``final_f1[i]`` F1 of trajectory i's final answer, ``None`` for an invalid format.
        invalid_format_reward: terminal reward of an invalid format (paper -1, authors' code 0).
    Returns:
        ``rewards[i]`` of length ``len(hits[i]) + 1``.

    >>> group_step_rewards([[{0}], []], [[1], []], [0.5, None], 2, alpha=1.0, beta=4.0, cost=0.0)
    [[2.5, 0.5], [-1.0]]
    """
    if len(final_f1) != len(hits):
        raise ValueError(f"final_f1 has {len(final_f1)} entries for {len(hits)} trajectories")
    search = search_step_rewards(
        hits,
        queries,
        n_gt,
        alpha=alpha,
        beta=beta,
        cost=cost,
        novelty=novelty,
        cost_scale=cost_scale,
        cost_per=cost_per,
    )
    return [
        [*steps, terminal_reward(f1, invalid_format_reward=invalid_format_reward)]
        for steps, f1 in zip(search, final_f1, strict=False)
    ]
