"""Learning curves of a backbone's training runs, for the report (rule ``aggregate_results``).

A training job logs verl's per-step metrics, and the project's own, to its MLflow run; verl's
``file`` logger writes the same records into the job's work directory
(``results/{backbone}/train/{variant}/work/metrics/attempt_*.jsonl``), which the rule's script
reads through the job's ``final.json`` (the MLflow run named there when those files were deleted).
This module turns ``{run: {step: metrics}}`` into the curves of :data:`CURVES`:

* ``answer_f1`` - mean F1 of the batch's final answers (0 for an invalid answer), the one reward
  every variant is scored on, so the only reward level comparable across variants;
* ``step_reward`` - mean reward of a search step under SPADER's rewards (variants trained on them
  only: GRPO and PPO have no step reward, and verl's ``critic/score/mean``, step rewards plus the
  terminal reward for SPADER but the terminal reward alone for GRPO, is not drawn at all);
* ``format_valid`` - share of trajectories ending in a well-formed answer;
* ``searches`` - search steps per trajectory;
* ``entities`` - distinct gold entities the searches of a trajectory surfaced;
* ``response_length`` - tokens per response (tool observations included);
* ``kl`` - KL to the reference policy (the KL loss, or the KL penalty in the reward).

Each curve lists the metric names it is read from, first found first; a run that logged none of
them has no such curve, and the figure says so (``absent``: "not logged", or for the step reward
"no SPADER step reward").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl

__all__ = ["CURVES", "Curve", "curves_table", "missing_curves", "run_labels", "steps_from_mlflow"]


@dataclass(frozen=True)
class Curve:
    """One learning curve: its name, its axis label, the metric names it is read from and what the
    figure says of a run without it."""

    name: str
    label: str
    metrics: tuple[str, ...]
    absent: str = "not logged"


CURVES: tuple[Curve, ...] = (
    Curve("answer_f1", "answer F1 (terminal; every variant)", ("episode/f1",)),
    Curve(
        "step_reward",
        "search-step reward (SPADER's step rewards)",
        ("spader/search_reward/mean",),
        absent="no SPADER step reward",
    ),
    Curve("format_valid", "valid-format rate", ("episode/format_valid",)),
    Curve("searches", "search steps per trajectory", ("episode/searches", "spader/search_steps/mean")),
    Curve(
        "entities",
        "discovered entities per trajectory",
        ("episode/entities", "spader/new_entities/mean"),
    ),
    Curve("response_length", "response length (tokens)", ("response_length/mean",)),
    Curve("kl", "KL to the reference", ("actor/kl_loss", "actor/reward_kl_penalty")),
)


def run_labels(shared_runs: Mapping[str, str]) -> dict[str, str]:
    """``{training run: label}``: a run trained once for several variants (``spader`` and
    ``beta_4``) is labelled with all of them, ``"spader (= beta_4)"``."""
    out: dict[str, str] = {}
    for run in dict.fromkeys(shared_runs.values()):
        others = [v for v, r in shared_runs.items() if r == run and v != run]
        out[run] = f"{run} (= {', '.join(others)})" if others else run
    return out


def curves_table(
    steps_by_run: Mapping[str, Mapping[int, Mapping[str, float]]],
    *,
    backbone: str = "",
    labels: Mapping[str, str] | None = None,
) -> pl.DataFrame:
    """Long form ``backbone, run, curve, metric, step, value`` of every curve of every run.

    Args:
        steps_by_run: per training run, its per-step metrics (``{step: {name: value}}``; steps
            below 1 and validation-only records are skipped).
        backbone: the backbone the runs train (a column, and the figure's title).
        labels: display names of the runs (default: the run names).
    Returns:
        One row per run, curve and step with a finite value, ordered by run, curve, step.
    """
    labels = labels or {}
    rows = []
    for run, steps in steps_by_run.items():
        for curve in CURVES:
            for step in sorted(steps):
                if step < 1:
                    continue
                data = steps[step]
                name = next((m for m in curve.metrics if m in data), None)
                if name is None:
                    continue
                value = float(data[name])
                if math.isfinite(value):
                    rows.append(
                        {
                            "backbone": backbone, "run": labels.get(run, run), "curve": curve.name,
                            "metric": name, "step": int(step), "value": value,
                        }
                    )  # fmt: skip
    schema = {
        "backbone": pl.String,
        "run": pl.String,
        "curve": pl.String,
        "metric": pl.String,
        "step": pl.Int64,
        "value": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema)


def missing_curves(table: pl.DataFrame, runs: Sequence[str]) -> dict[str, list[str]]:
    """``{run: [curve names it has no value for]}`` (for the job's log)."""
    have = set(zip(table["run"].to_list(), table["curve"].to_list(), strict=True))
    return {r: [c.name for c in CURVES if (r, c.name) not in have] for r in runs}


def steps_from_mlflow(tracking_uri: str, run_id: str) -> dict[int, dict[str, float]]:
    """Per-step values of the curves' metrics of MLflow run ``run_id`` (``{step: {name: value}}``),
    for a training run whose metrics files are gone. Metrics the run never logged are absent."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    steps: dict[int, dict[str, float]] = {}
    for name in dict.fromkeys(m for c in CURVES for m in c.metrics):
        for point in client.get_metric_history(run_id, name):
            steps.setdefault(int(point.step), {})[name] = float(point.value)
    return dict(sorted(steps.items()))
