"""The paper's tables from per-instance evaluation records (polars DataFrames, written as TSV).

Every table is computed from the records of ``results/{backbone}/eval/{method}/{dataset}.jsonl``:

* ``f1``: rows = methods (prompting baselines first, then trained variants), columns = the four
  datasets and ``avg`` (unweighted mean of the four macro F1s).
* ``prf``: long form ``method, dataset, precision, recall, f1, n`` (macro averages).
* ``ablation`` / ``beta_sweep``: every row of the paper's tables (SPADER, w/o SPA, w/o NP, w/o IG;
  beta in the ``beta_*`` variants) with a ``status`` column; a run this backbone does not train
  has status ``not run for this backbone`` and empty F1 cells: no number is ever invented.
* ``efficiency``: searches per valid entity found, as a ratio of totals per method and dataset
  (plus ``all``): search steps that ran queries / distinct gold entities surfaced in passages.
  Empty when nothing was found (the ratio is undefined).
* ``temporal``: mean cumulative number of distinct gold entities surfaced by turn t (episodes that
  ended earlier keep their final count), per method and dataset (plus ``all``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from spader.config import PROMPTING
from spader.core.metrics import macro_average

__all__ = [
    "ABLATION_ROWS",
    "NOT_RUN",
    "ablation_table",
    "beta_sweep_table",
    "efficiency_table",
    "f1_table",
    "method_order",
    "prf_table",
    "temporal_table",
]

#: The ablation table's rows (docs/method.md, "Ablations and baselines"): variant name -> paper label.
ABLATION_ROWS = {"spader": "SPADER", "no_spa": "w/o SPA", "no_np": "w/o NP", "no_ig": "w/o IG"}
NOT_RUN = "not run for this backbone"
EVALUATED = "evaluated"
ALL = "all"

Runs = Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]  # (method, dataset) -> records


def method_order(methods: Sequence[str]) -> list[str]:
    """Prompting baselines first (as in the paper's tables), then trained variants in config order."""
    return [m for m in PROMPTING if m in methods] + [m for m in methods if m not in PROMPTING]


def _records(runs: Runs, method: str, dataset: str) -> Sequence[Mapping[str, Any]]:
    try:
        return runs[(method, dataset)]
    except KeyError:
        raise KeyError(f"no evaluation records for method {method!r} on dataset {dataset!r}") from None


def _macro(records) -> tuple[float, float, float, int]:
    return macro_average((r["precision"], r["recall"], r["f1"]) for r in records)


def prf_table(runs: Runs, methods: Sequence[str], datasets: Sequence[str]) -> pl.DataFrame:
    """Long form ``method, dataset, precision, recall, f1, n``."""
    rows = []
    for m in method_order(methods):
        for d in datasets:
            p, r, f, n = _macro(_records(runs, m, d))
            rows.append({"method": m, "dataset": d, "precision": p, "recall": r, "f1": f, "n": n})
    schema = {
        "method": pl.String,
        "dataset": pl.String,
        "precision": pl.Float64,
        "recall": pl.Float64,
        "f1": pl.Float64,
        "n": pl.Int64,
    }
    return pl.DataFrame(rows, schema=schema)


def _f1_row(runs: Runs, method: str, datasets: Sequence[str]) -> dict[str, float]:
    row = {d: _macro(_records(runs, method, d))[2] for d in datasets}
    row["avg"] = sum(row.values()) / len(datasets) if datasets else 0.0
    return row


def _f1_schema(datasets: Sequence[str], leading: Mapping[str, Any]) -> dict[str, Any]:
    return {**leading, **{d: pl.Float64 for d in datasets}, "avg": pl.Float64}


def f1_table(runs: Runs, methods: Sequence[str], datasets: Sequence[str]) -> pl.DataFrame:
    """Rows = methods, columns ``method, <datasets...>, avg`` (macro F1)."""
    rows = [{"method": m, **_f1_row(runs, m, datasets)} for m in method_order(methods)]
    return pl.DataFrame(rows, schema=_f1_schema(datasets, {"method": pl.String}))


def _status_rows(
    runs: Runs, names: Sequence[str], methods: Sequence[str], datasets: Sequence[str], extra
) -> list[dict]:
    rows = []
    for name in names:
        row = {"method": name, **extra(name)}
        if name in methods:
            row.update(status=EVALUATED, **_f1_row(runs, name, datasets))
        else:
            row.update(status=NOT_RUN, **{d: None for d in datasets}, avg=None)
        rows.append(row)
    return rows


def ablation_table(
    runs: Runs, methods: Sequence[str], variants: Mapping[str, Any], datasets: Sequence[str]
) -> pl.DataFrame:
    """``method, setting, status, <datasets...>, avg`` for the ablation runs defined in ``variants``."""
    names = [v for v in ABLATION_ROWS if v in variants]
    rows = _status_rows(runs, names, methods, datasets, lambda v: {"setting": ABLATION_ROWS[v]})
    return pl.DataFrame(
        rows, schema=_f1_schema(datasets, {"method": pl.String, "setting": pl.String, "status": pl.String})
    )


def beta_sweep_table(
    runs: Runs, methods: Sequence[str], variants: Mapping[str, Any], datasets: Sequence[str]
) -> pl.DataFrame:
    """``method, beta, status, <datasets...>, avg`` for the ``beta_*`` variants, by beta."""
    names = sorted((v for v in variants if v.startswith("beta_")), key=lambda v: float(variants[v]["beta"]))
    rows = _status_rows(runs, names, methods, datasets, lambda v: {"beta": float(variants[v]["beta"])})
    return pl.DataFrame(
        rows, schema=_f1_schema(datasets, {"method": pl.String, "beta": pl.Float64, "status": pl.String})
    )


def _pooled(
    runs: Runs, method: str, datasets: Sequence[str]
) -> list[tuple[str, Sequence[Mapping[str, Any]]]]:
    per = [(d, _records(runs, method, d)) for d in datasets]
    return [*per, (ALL, [r for _, recs in per for r in recs])]


def efficiency_table(runs: Runs, methods: Sequence[str], datasets: Sequence[str]) -> pl.DataFrame:
    """``method, dataset, n, search_calls, queries_issued, entities_found, searches_per_entity,
    queries_per_entity`` (ratios of totals; empty when no entity was found)."""
    rows = []
    for m in method_order(methods):
        for d, recs in _pooled(runs, m, datasets):
            calls = sum(int(r["search_calls"]) for r in recs)
            queries = sum(int(r["queries_issued"]) for r in recs)
            found = sum(int(r["entities_found"]) for r in recs)
            rows.append(
                {
                    "method": m,
                    "dataset": d,
                    "n": len(recs),
                    "search_calls": calls,
                    "queries_issued": queries,
                    "entities_found": found,
                    "searches_per_entity": calls / found if found else None,
                    "queries_per_entity": queries / found if found else None,
                }
            )
    schema = {
        "method": pl.String, "dataset": pl.String, "n": pl.Int64, "search_calls": pl.Int64,
        "queries_issued": pl.Int64, "entities_found": pl.Int64,
        "searches_per_entity": pl.Float64, "queries_per_entity": pl.Float64,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def cumulative_curve(records: Sequence[Mapping[str, Any]], turns: int) -> list[float]:
    """Mean over instances of the cumulative distinct entities found by turn 1..``turns``."""
    if not records:
        return [0.0] * turns
    totals = [0.0] * turns
    for r in records:
        running = 0
        per_turn = list(r["new_entities_per_turn"])
        for t in range(turns):
            if t < len(per_turn):
                running += int(per_turn[t])
            totals[t] += running
    return [x / len(records) for x in totals]


def temporal_table(runs: Runs, methods: Sequence[str], datasets: Sequence[str]) -> pl.DataFrame:
    """``method, dataset, turn, cumulative_entities, n`` (turn 1 .. longest episode of the run)."""
    rows = []
    for m in method_order(methods):
        for d, recs in _pooled(runs, m, datasets):
            turns = max([len(r["new_entities_per_turn"]) for r in recs] + [1])
            for t, value in enumerate(cumulative_curve(recs, turns), start=1):
                rows.append(
                    {"method": m, "dataset": d, "turn": t, "cumulative_entities": value, "n": len(recs)}
                )
    schema = {
        "method": pl.String,
        "dataset": pl.String,
        "turn": pl.Int64,
        "cumulative_entities": pl.Float64,
        "n": pl.Int64,
    }
    return pl.DataFrame(rows, schema=schema)
