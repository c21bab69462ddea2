"""Slow loop references of the step-level baselines' advantage, written from the definitions
(docs/baselines.md) with plain Python loops, independently of :mod:`spader.methods.r3rag.scoring`."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["reference_turn_gae", "reference_whiten"]


def reference_turn_gae(
    rewards: Sequence[Sequence[float]],
    values: Sequence[Sequence[float]],
    mask: Sequence[Sequence[int]],
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[list[list[float]], list[list[float]]]:
    """GAE run backwards over each row, restarted at the end of every assistant turn.

    The token after a turn's last token is an observation or padding token (or the end of the
    row), so the recursion there bootstraps with value 0 and an empty trace: each turn is an
    episode of its own. Non-assistant tokens get 0.

    Returns:
        ``(advantages, returns)``, unwhitened, with ``returns = advantages + values``.
    """
    adv_rows, ret_rows = [], []
    for r, v, m in zip(rewards, values, mask, strict=True):
        adv = [0.0] * len(r)
        next_value, trace = 0.0, 0.0
        for j in reversed(range(len(r))):
            if not m[j]:
                next_value, trace = 0.0, 0.0  # outside a turn: the next turn starts afresh
                continue
            delta = r[j] + gamma * next_value - v[j]
            trace = delta + gamma * lam * trace
            adv[j] = trace
            next_value = v[j]
        adv_rows.append(adv)
        ret_rows.append([a + vj if mj else 0.0 for a, vj, mj in zip(adv, v, m, strict=True)])
    return adv_rows, ret_rows


def reference_whiten(values: Sequence[Sequence[float]], mask: Sequence[Sequence[int]]) -> list[list[float]]:
    """``(x - mean) / sqrt(var + 1e-8)`` over the masked entries (unbiased variance), the mean
    added back nowhere (verl's ``masked_whiten`` with ``shift_mean``); unmasked entries are 0."""
    flat = [x for row, mrow in zip(values, mask, strict=True) for x, m in zip(row, mrow, strict=True) if m]
    n = len(flat)
    mean = sum(flat) / n
    var = sum((x - mean) ** 2 for x in flat) / (n - 1)
    scale = (var + 1e-8) ** -0.5
    return [
        [(x - mean) * scale if m else 0.0 for x, m in zip(row, mrow, strict=True)]
        for row, mrow in zip(values, mask, strict=True)
    ]
