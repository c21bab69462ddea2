"""What the demo's warm start must give the tiny policy, shared by tests/models/test_warmstart_demo.py
(on the demo run's own evaluation records) and bench/warmstart.py (over warm-start seeds, which
measures the distribution the floors come from).

A rate is taken over a method's per-question evaluation records (rule ``evaluate_policy``'s JSON
lines, :func:`spader.evaluation.episodes.episode_record`) on all of the demo's evaluation questions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["FLOORS", "METHODS", "floor_failures", "rates"]

METHODS = ("react", "rag")

#: (method, rate) -> the lowest value the test accepts. Set from bench/warmstart.py over warm-start
#: seeds 1-10 on one demo run's scripted episodes (record 2026-12-04, docs/cpu-training.md, "The warm
#: start's floors"): each floor sits below its rate's 1% quantile under a normal fit on the logit
#: scale, so a warm start on another seed (or with another CPU's rounding) fails it less than 1% of
#: the time under that fit. The spread is wide (ReAct well-formed 0.44-0.99, RAG 0.26-0.995 over
#: those seeds); what the floors catch is a warm start that did not take, not a weak one. No floor
#: holds the share of episodes that search twice: two of the ten seeds searched twice at most once.
FLOORS: dict[tuple[str, str], float] = {
    ("react", "valid"): 0.25,  # 1% quantile 0.263
    ("react", "searched"): 0.75,  # 0.776
    ("react", "copied"): 0.04,  # 0.049: 8 of the 200 questions
    ("rag", "valid"): 0.04,  # 0.046
    ("rag", "copied"): 0.025,  # 0.030: 5 questions
}


def rates(records: Sequence[Mapping]) -> dict[str, float]:
    """Shares of the records: ``valid`` (a well-formed answer ended the episode), ``searched`` (the
    first step ran a search), ``copied`` (the answer holds a gold name: F1 above 0), ``multi``
    (more than one search step), and the mean ``f1``."""
    n = len(records)
    if not n:
        raise ValueError("no evaluation record to take rates over")
    return {
        "valid": sum(bool(r["format_valid"]) for r in records) / n,
        "searched": sum(bool(r["steps"]) and bool(r["steps"][0]["queries"]) for r in records) / n,
        "copied": sum(r["f1"] > 0 for r in records) / n,
        "multi": sum(r["search_calls"] > 1 for r in records) / n,
        "f1": sum(r["f1"] for r in records) / n,
    }


def floor_failures(by_method: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The floors ``by_method`` (method -> :func:`rates`) falls below, as readable lines."""
    return [
        f"{method} {rate} {by_method[method][rate]:.3f} < {floor}"
        for (method, rate), floor in FLOORS.items()
        if by_method[method][rate] < floor
    ]
