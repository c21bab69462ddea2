"""Rule ``aggregate_results``: every method x dataset evaluation of one backbone -> the paper's
tables (TSV) with their uncertainty, the significance table, the plots (PNG) and the learning
curves of the backbone's training runs. See ``tables`` for what each table holds, ``stats`` for
the intervals and tests, ``curves`` for the learning curves."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spader.config import PROMPTING
from spader.evaluation.curves import curves_table, missing_curves, run_labels
from spader.evaluation.episodes import read_jsonl
from spader.evaluation.evaluate import TINY_NOTE
from spader.evaluation.plots import (
    MethodStyle,
    method_styles,
    plot_curves,
    plot_efficiency,
    plot_f1,
    plot_temporal,
)
from spader.evaluation.tables import (
    AVG,
    METRICS,
    Estimates,
    Uncertainty,
    efficiency_table,
    f1_ci_table,
    f1_table,
    prf_table,
    role_table,
    significance_table,
    temporal_table,
)
from spader.evaluation.topics import read_topics

log = logging.getLogger(__name__)

__all__ = ["TABLES", "aggregate_results", "load_runs", "training_runs_table"]

TABLES = ("f1", "prf", "significance", "f1_ci", "ablation", "beta_sweep", "efficiency", "temporal", "curves")
PLOTS = ("f1_plot", "efficiency_plot", "temporal_plot", "curves_plot")


def load_runs(
    summaries: Sequence[str | os.PathLike], records: Sequence[str | os.PathLike]
) -> tuple[dict[tuple[str, str], list[dict[str, Any]]], bool]:
    """Read each summary and its per-instance records (same path, ``.jsonl``).

    Returns:
        ``{(method, dataset): records}`` and whether any run used a tiny random model.
    Raises:
        ValueError: a summary without its records file, or counts that disagree (stale files).
    """
    record_paths = {Path(p).resolve() for p in records}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    tiny = False
    for s in summaries:
        summary = json.loads(Path(s).read_text(encoding="utf-8"))
        rec_path = Path(s).with_suffix(".jsonl")
        if rec_path.resolve() not in record_paths:
            raise ValueError(f"{s}: its per-instance records {rec_path} are not among the inputs")
        recs = read_jsonl(rec_path)
        if len(recs) != summary.get("n"):
            raise ValueError(
                f"{s}: summary says n={summary.get('n')} but {rec_path} holds {len(recs)} records"
            )
        key = (str(summary["method"]), str(summary["dataset"]))
        if key in runs:
            raise ValueError(f"{s}: a second evaluation of method {key[0]!r} on dataset {key[1]!r}")
        runs[key] = recs
        tiny = tiny or bool(summary.get("tiny_model"))
    return runs, tiny


def training_runs_table(methods: Sequence[str], shared_runs: Mapping[str, str]):
    """Which training run each trained row evaluates: ``method, training_run, shared_with``.

    Variants whose resolved training config is identical are trained once; every one of them keeps
    its row in the tables, with the scores of that one run (``shared_with`` lists the others).
    """
    import polars as pl

    trained = [m for m in methods if m in shared_runs]
    rows = []
    for m in trained:
        run = shared_runs[m]
        others = [o for o in trained if o != m and shared_runs[o] == run]
        rows.append({"method": m, "training_run": run, "shared_with": ",".join(others)})
    return pl.DataFrame(
        rows, schema={"method": pl.String, "training_run": pl.String, "shared_with": pl.String}
    )


def _write_tsv(df, path: str | os.PathLike) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    df.write_csv(path, separator="\t", float_precision=4)


def _f1_plot_rows(prf, est: Estimates, datasets: Sequence[str]):
    """prf's F1 rows plus each method's ``avg``, with whether it differs from the reference."""
    import polars as pl

    k = METRICS.index("f1")
    rows = [
        {
            "method": r["method"],
            "dataset": r["dataset"],
            "f1": r["f1"],
            "f1_lo": r["f1_lo"],
            "f1_hi": r["f1_hi"],
        }
        for r in prf.iter_rows(named=True)
    ]
    for m in est.methods:
        lo, hi = est.interval(m, AVG)
        rows.append(
            {
                "method": m,
                "dataset": AVG,
                "f1": float(est.point(m, AVG)[k]),
                "f1_lo": float(lo[k]),
                "f1_hi": float(hi[k]),
            }
        )
    for r in rows:
        r["significant"] = est.significant(r["method"], r["dataset"])
    order = {d: i for i, d in enumerate([*datasets, AVG])}
    rows.sort(key=lambda r: (est.methods.index(r["method"]), order[r["dataset"]]))
    return pl.DataFrame(rows)


def _load(
    summaries: Sequence[str | os.PathLike],
    records: Sequence[str | os.PathLike],
    methods: Sequence[str],
    datasets: Sequence[str],
) -> tuple[Any, str]:
    """``(runs, note)``: the evaluations (those outside methods x datasets logged) and the plots'
    note (the tiny-run warning, or empty)."""
    runs, tiny = load_runs(summaries, records)
    expected = {(m, d) for m in methods for d in datasets}
    extra = sorted(set(runs) - expected)
    if extra:
        log.warning("ignoring evaluations not in this backbone's methods x datasets: %s", extra)
    note = TINY_NOTE if tiny else ""
    if tiny:
        log.warning("%s", TINY_NOTE)
    return runs, note


def _tables(
    runs,
    methods: Sequence[str],
    variants: Sequence[Sequence[Any]],
    datasets: Sequence[str],
    est: Estimates,
    u: Uncertainty,
    training_steps: Mapping[str, Mapping[int, Mapping[str, float]]],
    backbone: str,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """The backbone's tables by output name (all but ``runs``)."""
    return {
        "f1": f1_table(runs, methods, datasets),
        "prf": prf_table(runs, methods, datasets, est),
        "significance": significance_table(runs, methods, datasets, est),
        "f1_ci": f1_ci_table(runs, methods, datasets, est),
        "ablation": role_table("ablation", runs, methods, variants, datasets, est),
        "beta_sweep": role_table("beta_sweep", runs, methods, variants, datasets, est),
        "efficiency": efficiency_table(runs, methods, datasets, u),
        "temporal": temporal_table(runs, methods, datasets, u),
        "curves": curves_table(training_steps, backbone=backbone, labels=labels),
    }


def _write_plots(
    tables: Mapping[str, Any],
    outputs: Mapping[str, str | os.PathLike],
    est: Estimates,
    datasets: Sequence[str],
    reference: str,
    backbone: str,
    note: str,
    styles: dict[str, MethodStyle],
) -> None:
    """Draw the backbone's plots (F1, efficiency, temporal dynamics, learning curves) from its tables."""
    label = f" ({backbone})" if backbone else ""
    plot_f1(
        _f1_plot_rows(tables["prf"], est, datasets), outputs["f1_plot"], reference=reference,
        title=f"F1 per test set{label}", note=note, styles=styles,
    )  # fmt: skip
    plot_efficiency(
        tables["efficiency"], outputs["efficiency_plot"], title=f"Search efficiency{label}", note=note,
        styles=styles,
    )  # fmt: skip
    plot_temporal(
        tables["temporal"], outputs["temporal_plot"], datasets=[*datasets, "all"],
        title=f"Temporal dynamics of entity discovery{label}", note=note, styles=styles,
    )  # fmt: skip
    plot_curves(
        tables["curves"], outputs["curves_plot"], title=f"Learning curves{label}", note=note, styles=styles
    )


def _uncertainty(
    uncertainty: Mapping[str, Any] | Uncertainty | None, topics: str | os.PathLike | None
) -> Uncertainty:
    """The tables' settings, with the questions' topics read from ``topics`` when given."""
    u = uncertainty if isinstance(uncertainty, Uncertainty) else Uncertainty.from_config(uncertainty)
    return u if topics is None else dataclasses.replace(u, topics=read_topics(topics))


def _write_tables(tables: Mapping[str, Any], outputs: Mapping[str, str | os.PathLike]) -> None:
    for name, df in tables.items():
        _write_tsv(df, outputs[name])
        log.info("%s: %d rows -> %s", name, df.height, outputs[name])


def aggregate_results(
    summaries: Sequence[str | os.PathLike],
    records: Sequence[str | os.PathLike],
    outputs: Mapping[str, str | os.PathLike],
    *,
    methods: Sequence[str],
    variants: Sequence[Sequence[Any]],
    datasets: Sequence[str],
    backbone: str = "",
    shared_runs: Mapping[str, str] | None = None,
    uncertainty: Mapping[str, Any] | Uncertainty | None = None,
    training_steps: Mapping[str, Mapping[int, Mapping[str, float]]] | None = None,
    topics: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Write the tables and plots of one backbone.

    Args:
        summaries, records: ``results/{backbone}/eval/{method}/{dataset}.json`` / ``.jsonl``.
        outputs: paths by name: ``f1, prf, significance, f1_ci, ablation, beta_sweep, efficiency,
            temporal, curves`` (TSV) and ``f1_plot, efficiency_plot, temporal_plot, curves_plot``
            (PNG); optionally ``runs`` (TSV).
        methods: the backbone's methods (trained variants and baselines).
        variants: :func:`spader.methods.table_rows` of every configured variant: the ablation and
            beta-sweep rows, and (in config order) each method's style in the plots.
        datasets: column order (``qampari, mintaka, webqsp, quest``).
        shared_runs: ``{variant: the variant whose training run it evaluates}``; with an output
            ``runs``, written as :func:`training_runs_table`.
        uncertainty: bootstrap and test settings (:class:`Uncertainty`, or ``config["evaluation"]``
            with ``bootstrap_samples``, ``bootstrap_seed``, ``significance_level``).
        training_steps: per training run, its per-step metrics (the learning curves); None or
            empty: the backbone trained nothing.
        topics: ``evaluation.topics`` (:mod:`spader.evaluation.topics`): pooled rows resample
            clusters of questions sharing a topic; None: questions.
    Returns:
        The F1 table as ``{method: {dataset: f1, "avg": f1}}``.
    """
    missing = [k for k in (*TABLES, *PLOTS) if k not in outputs]
    if missing:
        raise ValueError(f"aggregate_results: no output path for {missing}")
    runs, note = _load(summaries, records, methods, datasets)
    u = _uncertainty(uncertainty, topics)
    est = Estimates(runs, methods, datasets, u)
    log.info(
        "intervals: %d bootstrap resamples (seed %d) at %.0f%%; tests against %r; avg over %d %s",
        u.samples, u.seed, 100 * u.level, u.reference, est.units(AVG),
        "questions" if u.topics is None else f"clusters of questions sharing a topic ({topics})",
    )  # fmt: skip
    names = [name for name, _ in variants]
    shared = shared_runs or {m: m for m in names if m in methods}
    labels = run_labels({v: r for v, r in shared.items() if r in (training_steps or {})})
    tables = _tables(runs, methods, variants, datasets, est, u, training_steps or {}, backbone, labels)
    for run, curves in missing_curves(tables["curves"], list(labels.values())).items():
        if curves:
            log.warning("training run %s logged no metric for the curves %s", run, curves)
    if "runs" in outputs:
        tables["runs"] = training_runs_table(methods, shared)
    _write_tables(tables, outputs)
    styles = method_styles([*PROMPTING, *names, *methods])
    _write_plots(tables, outputs, est, datasets, u.reference, backbone, note, styles)
    return {row["method"]: {k: v for k, v in row.items() if k != "method"} for row in tables["f1"].to_dicts()}
