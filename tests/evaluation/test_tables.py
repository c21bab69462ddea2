"""The paper's tables from hand-made per-instance records: exact columns, row sets and values."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from spader.evaluation.aggregate import aggregate_results
from spader.evaluation.tables import (
    NOT_RUN,
    ablation_table,
    beta_sweep_table,
    efficiency_table,
    f1_table,
    prf_table,
    temporal_table,
)

DATASETS = ["qampari", "mintaka", "webqsp", "quest"]
ROOT = Path(__file__).resolve().parents[2]
VARIANTS = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["variants"]


def rec(f1, p=None, r=None, calls=0, queries=0, per_turn=()):
    return {
        "precision": f1 if p is None else p,
        "recall": f1 if r is None else r,
        "f1": f1,
        "search_calls": calls,
        "queries_issued": queries,
        "entities_found": sum(per_turn),
        "new_entities_per_turn": list(per_turn),
        "status": "answered",
        "format_valid": True,
    }


def make_runs(methods):
    """F1 of method i on dataset j is (i + 1) * (j + 1) / 100 on average over two instances."""
    runs = {}
    for i, m in enumerate(methods):
        for j, d in enumerate(DATASETS):
            base = (i + 1) * (j + 1) / 100
            runs[(m, d)] = [
                rec(base + 0.01, calls=2, queries=3, per_turn=[1, 0, 2]),
                rec(base - 0.01, calls=1, queries=1, per_turn=[1]),
            ]
    return runs


METHODS = ["spader", "no_np", "beta_8", "rag", "react"]  # as the rule passes them: variants, then baselines


def test_f1_table_columns_rows_and_values():
    df = f1_table(make_runs(METHODS), METHODS, DATASETS)
    assert df.columns == ["method", "qampari", "mintaka", "webqsp", "quest", "avg"]
    assert df["method"].to_list() == ["rag", "react", "spader", "no_np", "beta_8"]  # baselines first
    spader = df.filter(pl.col("method") == "spader").row(0, named=True)
    assert [spader[d] for d in DATASETS] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert spader["avg"] == pytest.approx(0.025)


def test_prf_table_is_long_form_with_counts():
    runs = {("rag", d): [rec(0.0, p=0.0, r=0.0), rec(0.5, p=1.0, r=1 / 3)] for d in DATASETS}
    df = prf_table(runs, ["rag"], DATASETS)
    assert df.columns == ["method", "dataset", "precision", "recall", "f1", "n"]
    assert df["dataset"].to_list() == DATASETS and df["n"].to_list() == [2] * 4
    row = df.row(0, named=True)
    assert (row["precision"], row["recall"], row["f1"]) == pytest.approx((0.5, 1 / 6, 0.25))


def test_ablation_and_beta_rows_say_which_runs_this_backbone_has():
    runs = make_runs(METHODS)
    abl = ablation_table(runs, METHODS, VARIANTS, DATASETS)
    assert abl.columns == ["method", "setting", "status", *DATASETS, "avg"]
    assert abl["method"].to_list() == ["spader", "no_spa", "no_np", "no_ig"]
    assert abl["setting"].to_list() == ["SPADER", "w/o SPA", "w/o NP", "w/o IG"]
    assert abl["status"].to_list() == ["evaluated", NOT_RUN, "evaluated", NOT_RUN]
    missing = abl.filter(pl.col("status") == NOT_RUN)
    assert all(missing[c].null_count() == missing.height for c in [*DATASETS, "avg"])  # never invented
    beta = beta_sweep_table(runs, METHODS, VARIANTS, DATASETS)
    assert beta.columns == ["method", "beta", "status", *DATASETS, "avg"]
    assert beta["method"].to_list() == ["beta_0", "beta_1", "beta_4", "beta_8"]
    assert beta["beta"].to_list() == [0.0, 1.0, 4.0, 8.0]
    assert beta["status"].to_list() == [NOT_RUN, NOT_RUN, NOT_RUN, "evaluated"]
    assert beta.filter(pl.col("method") == "beta_8")["qampari"].item() == pytest.approx(0.03)


def test_ablation_and_beta_tables_for_a_backbone_without_variants_keep_their_columns():
    runs = make_runs(["rag", "react"])
    abl = ablation_table(runs, ["rag", "react"], VARIANTS, DATASETS)
    assert abl.height == 4 and set(abl["status"]) == {NOT_RUN}
    assert beta_sweep_table(runs, ["rag", "react"], {}, DATASETS).columns == [
        "method",
        "beta",
        "status",
        *DATASETS,
        "avg",
    ]


def test_efficiency_is_a_ratio_of_totals_and_empty_when_nothing_was_found():
    runs = {
        ("react", d): [
            rec(0, calls=4, queries=6, per_turn=[1, 1]),
            rec(0, calls=2, queries=2, per_turn=[0, 1]),
        ]
        for d in DATASETS
    }
    runs[("react", "quest")] = [rec(0, calls=3, queries=3, per_turn=[0, 0, 0])]
    df = efficiency_table(runs, ["react"], DATASETS)
    assert df.columns == [
        "method", "dataset", "n", "search_calls", "queries_issued", "entities_found",
        "searches_per_entity", "queries_per_entity",
    ]  # fmt: skip
    assert df["dataset"].to_list() == [*DATASETS, "all"]
    q = df.row(0, named=True)
    assert (q["search_calls"], q["entities_found"], q["searches_per_entity"], q["queries_per_entity"]) == (
        6,
        3,
        2.0,
        8 / 3,
    )
    assert df.filter(pl.col("dataset") == "quest")["searches_per_entity"].item() is None
    total = df.filter(pl.col("dataset") == "all").row(0, named=True)
    assert (total["n"], total["search_calls"], total["entities_found"]) == (7, 21, 9)
    assert total["searches_per_entity"] == pytest.approx(21 / 9)


def test_temporal_curve_is_cumulative_and_carries_finished_episodes_forward():
    runs = {("react", d): [rec(0, per_turn=[2, 0, 1]), rec(0, per_turn=[1])] for d in DATASETS}
    df = temporal_table(runs, ["react"], DATASETS)
    assert df.columns == ["method", "dataset", "turn", "cumulative_entities", "n"]
    q = df.filter(pl.col("dataset") == "qampari").sort("turn")
    assert q["turn"].to_list() == [1, 2, 3]
    assert q["cumulative_entities"].to_list() == pytest.approx([1.5, 1.5, 2.0])  # (2+1)/2, (2+1)/2, (3+1)/2
    assert set(df["dataset"]) == {*DATASETS, "all"}


def _write_run(
    root: Path, method: str, dataset: str, records: list[dict], tiny: bool = False
) -> tuple[Path, Path]:
    out = root / "eval" / method
    out.mkdir(parents=True, exist_ok=True)
    jl = out / f"{dataset}.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in records))
    sm = out / f"{dataset}.json"
    sm.write_text(json.dumps({"method": method, "dataset": dataset, "n": len(records), "tiny_model": tiny}))
    return sm, jl


OUTPUTS = ["f1", "prf", "ablation", "beta_sweep", "efficiency", "temporal"]


def test_aggregate_results_writes_every_table_and_plot(tmp_path):
    methods = ["spader", "rag", "react"]
    runs = make_runs(methods)
    paths = [_write_run(tmp_path, m, d, runs[(m, d)], tiny=True) for m in methods for d in DATASETS]
    outputs = {k: tmp_path / f"{k}.tsv" for k in OUTPUTS}
    outputs |= {"efficiency_plot": tmp_path / "efficiency.png", "temporal_plot": tmp_path / "temporal.png"}
    f1 = aggregate_results(
        [s for s, _ in paths],
        [j for _, j in paths],
        outputs,
        methods=methods,
        variants=VARIANTS,
        datasets=DATASETS,
    )
    assert list(f1) == ["rag", "react", "spader"] and f1["spader"]["qampari"] == pytest.approx(0.01)
    table = pl.read_csv(outputs["f1"], separator="\t")
    assert table.columns == ["method", *DATASETS, "avg"] and table["method"].to_list() == [
        "rag",
        "react",
        "spader",
    ]
    assert table.filter(pl.col("method") == "react")["quest"].item() == pytest.approx(
        0.12
    )  # method 3, dataset 4
    assert pl.read_csv(outputs["prf"], separator="\t").height == 12
    for name in ("efficiency_plot", "temporal_plot"):
        assert outputs[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and outputs[name].stat().st_size > 5000


def test_aggregate_refuses_stale_or_unpaired_files(tmp_path):
    sm, jl = _write_run(tmp_path, "rag", "qampari", [rec(0.5)])
    outputs = {k: tmp_path / f"{k}.tsv" for k in OUTPUTS} | {
        "efficiency_plot": "e.png",
        "temporal_plot": "t.png",
    }
    sm.write_text(json.dumps({"method": "rag", "dataset": "qampari", "n": 3}))
    with pytest.raises(ValueError, match="n=3 but .* holds 1 records"):
        aggregate_results([sm], [jl], outputs, methods=["rag"], variants={}, datasets=["qampari"])
    with pytest.raises(ValueError, match="not among the inputs"):
        aggregate_results([sm], [], outputs, methods=["rag"], variants={}, datasets=["qampari"])


def test_training_runs_table_says_which_rows_share_a_run():
    from spader.evaluation.aggregate import training_runs_table

    shared = {"spader": "spader", "no_np": "no_np", "beta_0": "no_np", "beta_4": "spader", "grpo": "grpo"}
    table = training_runs_table(["rag", "spader", "no_np", "beta_0", "beta_4", "grpo"], shared)
    assert table.rows() == [
        ("spader", "spader", "beta_4"),
        ("no_np", "no_np", "beta_0"),
        ("beta_0", "no_np", "no_np"),
        ("beta_4", "spader", "spader"),
        ("grpo", "grpo", ""),
    ]
