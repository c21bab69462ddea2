"""Slow, loop-based reference of the SPADER reward densification and SPA advantage.

Written straight from docs/method.md with plain Python loops over tokens and steps, independently of
the vectorised code in :mod:`spader.core.advantage` and :mod:`spader.methods.steps`. The tests check that
both agree on random batches, and ``bench/advantage.py`` times one against the other. Never used
in training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["reference_dense_rewards", "reference_token_advantages"]


def _runs(mask_row: Sequence[int]) -> list[list[int]]:
    """Token positions of each maximal run of 1s."""
    runs: list[list[int]] = []
    inside = False
    for j, m in enumerate(mask_row):
        if m:
            if not inside:
                runs.append([])
                inside = True
            runs[-1].append(j)
        else:
            inside = False
    return runs


def reference_dense_rewards(
    response_mask: Sequence[Sequence[int]],
    terminal: Sequence[float],
    group_ids: Sequence[Any],
    records: Sequence[Sequence[Any]],
    n_gold: Sequence[int | None],
    *,
    alpha: float,
    beta: float,
    cost: float,
    novelty: str = "inverse",
    cost_scale: float = 1.0,
    cost_per: str = "call",
) -> list[list[float]]:
    """Loop version of :func:`spader.methods.spader.densify.densify_rewards` (records are ``StepRecord``-like)."""
    b = len(response_mask)
    runs = [_runs(row) for row in response_mask]
    # search steps of each trajectory: hits and queries by position; missing or extra records handled
    # as in the vectorised code (missing: nothing found, 0 queries; extra: ignored)
    search = []
    for i in range(b):
        n_search = max(len(runs[i]) - 1, 0)
        steps = [(set(), 0) for _ in range(n_search)]
        filled = [False] * n_search
        for rec in records[i]:
            t = rec.turn - 1
            if t < n_search and not filled[t]:
                filled[t] = True
                steps[t] = (set(rec.hits), rec.queries)
        search.append(steps)
    # N(e): trajectories of the group (with at least one assistant run) that hit e at any step
    found_by: dict[tuple[Any, int], int] = {}
    for j in range(b):
        if not runs[j]:
            continue
        hit_by_j: set[int] = set()
        for hits, _ in search[j]:
            hit_by_j |= hits
        for e in hit_by_j:
            found_by[(group_ids[j], e)] = found_by.get((group_ids[j], e), 0) + 1
    dense = [[0.0] * len(row) for row in response_mask]
    for i in range(b):
        if not runs[i]:
            continue
        earlier: set[int] = set()
        for t, (hits, q) in enumerate(search[i]):
            total = 0.0
            for e in hits:
                if e in earlier:
                    continue
                n = found_by[(group_ids[i], e)]
                premium = 1.0 / n if novelty == "inverse" else math.exp(-(n - 1))
                total += alpha + beta * premium
            earlier |= hits
            charged = q if cost_per == "query" else min(q, 1)  # per query, or per call that issued any
            dense[i][runs[i][t][-1]] = (total - cost * cost_scale * charged) / n_gold[i]
        dense[i][runs[i][-1][-1]] = terminal[i]
    return dense


def reference_token_advantages(
    token_rewards: Sequence[Sequence[float]],
    response_mask: Sequence[Sequence[int]],
    group_ids: Sequence[Any],
    *,
    gamma: float,
    eps: float = 1e-6,
    trajectory_level: bool = False,
) -> list[list[float]]:
    """Loop version of the SPA (or trajectory-level) token advantages.

    A token reward counts for the assistant run it belongs to, or the run before it for
    observation/padding tokens (run 0 before the first run); each run's tokens get that step's
    advantage.
    """
    b = len(response_mask)
    step_r: list[list[float]] = []
    for i in range(b):
        runs = _runs(response_mask[i])
        r = [0.0] * len(runs)
        current = -1
        for j, m in enumerate(response_mask[i]):
            if m and (j == 0 or not response_mask[i][j - 1]):
                current += 1
            if runs:
                r[max(current, 0)] += token_rewards[i][j]
        step_r.append(r)
    if trajectory_level:
        values = [[sum(r)] if r else [] for r in step_r]
    else:
        values = []
        for r in step_r:
            g = [0.0] * len(r)
            acc = 0.0
            for t in range(len(r) - 1, -1, -1):
                acc = r[t] + gamma * acc
                g[t] = acc
            values.append(g)
    width = max((len(v) for v in values), default=0)
    adv_steps = [[0.0] * len(v) for v in values]
    groups: dict[Any, list[int]] = {}
    for j in range(b):
        groups.setdefault(group_ids[j], []).append(j)
    for t in range(width):
        for i in range(b):
            if t >= len(values[i]):
                continue
            members = groups[group_ids[i]]
            col = [values[j][t] if t < len(values[j]) else 0.0 for j in members]
            if max(col) == min(col):
                continue
            mu = sum(col) / len(col)
            sigma = math.sqrt(sum((x - mu) ** 2 for x in col) / len(col))
            adv_steps[i][t] = (values[i][t] - mu) / (sigma + eps)
    out = []
    for i in range(b):
        row = [0.0] * len(response_mask[i])
        run = -1
        for j, m in enumerate(response_mask[i]):
            if m and (j == 0 or not response_mask[i][j - 1]):
                run += 1
            if m:
                row[j] = adv_steps[i][0] if trajectory_level else adv_steps[i][run]
        out.append(row)
    return out
