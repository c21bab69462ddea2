"""Two runs of the pipeline side by side: a named run (``run: authors``, config/authors.yaml) against
the default run of the same checkout, method by method and dataset by dataset.

Both runs evaluate the same questions (the evaluation sets are shared unless the named run
changes a setting they depend on; then the questions both evaluated), so the comparison is
paired: for every method, dataset and metric (precision, recall, F1) the table gives each run's
macro average with its percentile-bootstrap interval over the questions, the difference (named run
minus default run) with the interval of the paired sign-flip test (the differences it does not
reject, so the interval excludes 0 exactly when ``p_value`` is below the level), the test's
p-value and the smallest p-value it can reach on these pairs, with the settings the other tables
use (``evaluation.bootstrap_samples``, ``bootstrap_seed``, ``significance_level``;
:mod:`spader.evaluation.stats`). ``avg`` is the unweighted mean over the datasets, resampled
within each, by clusters of questions that share a topic when ``evaluation.topics`` names them.
Questions one of the runs left out of its means (the authors' evaluation loop drops failed
episodes) are left out of both sides.

What is assumed rather than reproduced is said in the table's first lines (``#`` comments): the
authors' published code trains SPADER (its ablations are its settings) and GRPO only
(:data:`spader.methods.AUTHORS_TRAINED`); for any other trained method of the table (PPO,
StepSearch, R3-RAG) the named run's options (config/authors.yaml: their parser, observations,
alias-blind reward) are applied as if their code had trained it, an assumption
(:func:`spader.methods.assumed_methods`, :func:`header_lines`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from spader.evaluation.stats import SignFlip, bootstrap_means, percentile_interval
from spader.evaluation.tables import AVG, METRICS, Uncertainty, method_order, question_scores

__all__ = ["COLUMNS", "compare_runs_table", "header_lines"]

Runs = Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]

#: Columns of the comparison table, in order.
COLUMNS = {
    "run": pl.String, "method": pl.String, "dataset": pl.String, "metric": pl.String, "n": pl.Int64,
    "units": pl.Int64,
    "default": pl.Float64, "default_lo": pl.Float64, "default_hi": pl.Float64,
    "this_run": pl.Float64, "this_run_lo": pl.Float64, "this_run_hi": pl.Float64,
    "diff": pl.Float64, "diff_lo": pl.Float64, "diff_hi": pl.Float64,
    "p_value": pl.Float64, "significant": pl.Boolean, "p_min": pl.Float64,
}  # fmt: skip


def header_lines(name: str, assumed: Sequence[str]) -> list[str]:
    """The table's ``#`` lines: what the comparison of run ``name`` assumes (none without
    ``assumed`` methods)."""
    if not assumed:
        return []
    return [
        f"# assumed, not reproduced: the authors' published code has no training code for {', '.join(assumed)};",
        f"# run {name!r} trains them with its options (config/authors.yaml: their parser, observations and",
        "# alias-blind reward) as if it had (docs/method.md, Known divergences)",
    ]


def _kept(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if not r.get("dropped")]


def _paired(
    default: Sequence[Mapping[str, Any]], run: Sequence[Mapping[str, Any]], where: str
) -> tuple[np.ndarray, list[str]]:
    """``(6, n)``: P/R/F1 of the default run, then of the named run, on the questions both kept
    (by id), and their ids."""
    a, b = question_scores(_kept(default)), question_scores(_kept(run))
    ids = [q for q in a.ids if q in set(b.ids)]
    if not ids:
        raise ValueError(f"{where}: the two runs share no evaluated question")
    ia, ib = {q: i for i, q in enumerate(a.ids)}, {q: i for i, q in enumerate(b.ids)}
    return np.vstack([a.scores[:, [ia[q] for q in ids]], b.scores[:, [ib[q] for q in ids]]]), ids


def _rows(
    name: str, method: str, dataset: str, parts: list[np.ndarray], clusters, u: Uncertainty
) -> list[dict]:
    """The table's rows of one method on one dataset (or ``avg``: ``parts`` has every dataset)."""
    k = len(METRICS)
    point = sum(p.mean(axis=1) for p in parts) / len(parts)
    lo, hi = percentile_interval(bootstrap_means(parts, u.samples, u.seed, clusters), u.level)
    flip = SignFlip([x[k:] for x in parts], [x[:k] for x in parts], u.samples, u.seed, clusters)
    (dlo, dhi), p, floor = flip.interval(u.level), flip.p_value(), flip.smallest_p
    n = sum(x.shape[1] for x in parts)
    return [
        {
            "run": name, "method": method, "dataset": dataset, "metric": metric, "n": n, "units": flip.units,
            "default": float(point[i]), "default_lo": float(lo[i]), "default_hi": float(hi[i]),
            "this_run": float(point[k + i]), "this_run_lo": float(lo[k + i]), "this_run_hi": float(hi[k + i]),
            "diff": float(point[k + i] - point[i]), "diff_lo": float(dlo[i]), "diff_hi": float(dhi[i]),
            "p_value": float(p[i]), "significant": bool(p[i] < u.alpha), "p_min": float(floor[i]),
        }
        for i, metric in enumerate(METRICS)
    ]  # fmt: skip


def compare_runs_table(
    default: Runs,
    run: Runs,
    methods: Sequence[str],
    datasets: Sequence[str],
    *,
    name: str,
    uncertainty: Uncertainty | None = None,
) -> pl.DataFrame:
    """The named run against the default run (see the module docstring).

    Args:
        default: ``{(method, dataset): records}`` of the default run.
        run: the same of the named run.
        methods: the methods to compare (each evaluated by both runs).
        datasets: the datasets, in table order.
        name: the named run's name (the ``run`` column).
        uncertainty: bootstrap and test settings, and the questions' topics.
    Returns:
        One row per method, dataset (and ``avg``) and metric: :data:`COLUMNS`. ``units`` is what
        the intervals and the test resample: questions, or on ``avg`` with topics, clusters.
    Raises:
        KeyError: a run lacks the records of a method on a dataset (names both).
    """
    u = uncertainty or Uncertainty.from_config()
    rows = []
    for m in method_order(methods):
        strata, ids = {}, {}
        for d in datasets:
            for side, runs in (("default run", default), (f"run {name!r}", run)):
                if (m, d) not in runs:
                    raise KeyError(f"the {side} has no evaluation records for method {m!r} on dataset {d!r}")
            strata[d], ids[d] = _paired(default[(m, d)], run[(m, d)], f"{m} on {d}")
        for d in datasets:
            rows += _rows(name, m, d, [strata[d]], None, u)
        rows += _rows(name, m, AVG, [strata[d] for d in datasets], u.clusters([ids[d] for d in datasets]), u)
    return pl.DataFrame(rows, schema=COLUMNS)


def compare_runs(
    default_summaries: Sequence[str],
    run_summaries: Sequence[str],
    output: str,
    *,
    methods: Sequence[str],
    datasets: Sequence[str],
    name: str,
    uncertainty: Mapping[str, Any] | None = None,
    topics: str | None = None,
    assumed: Sequence[str] = (),
) -> pl.DataFrame:
    """Rule ``compare_runs``: read both runs' evaluations (each summary and its records, checked
    as :func:`spader.evaluation.aggregate.load_runs` checks them) and the questions' topics
    (``evaluation.topics``, when set), and write the table (TSV), after the lines saying what it
    assumes for the ``assumed`` methods (:func:`header_lines`)."""
    from pathlib import Path

    from spader.evaluation.aggregate import load_runs
    from spader.evaluation.topics import read_topics

    default, _ = load_runs(default_summaries, [str(Path(s).with_suffix(".jsonl")) for s in default_summaries])
    run, _ = load_runs(run_summaries, [str(Path(s).with_suffix(".jsonl")) for s in run_summaries])
    u = Uncertainty.from_config(uncertainty)
    if topics is not None:
        u = dataclasses.replace(u, topics=read_topics(topics))
    table = compare_runs_table(default, run, methods, datasets, name=name, uncertainty=u)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    text = table.write_csv(separator="\t", float_precision=4)
    Path(output).write_text(
        "".join(f"{line}\n" for line in header_lines(name, assumed)) + text, encoding="utf-8"
    )
    return table
