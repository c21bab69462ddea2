"""The paper's tables from hand-made per-instance records: exact columns, row sets and values,
their bootstrap intervals and paired tests, sampling seeds, and the learning curves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from spader.config import resolved_config
from spader.evaluation.aggregate import aggregate_results
from spader.evaluation.stats import SignFlip, bootstrap_means, paired_permutation_test, percentile_interval
from spader.evaluation.tables import (
    NOT_RUN,
    Estimates,
    Uncertainty,
    efficiency_table,
    f1_ci_table,
    f1_table,
    prf_table,
    question_scores,
    role_table,
    significance_table,
    temporal_table,
)
from spader.methods import table_rows

DATASETS = ["qampari", "mintaka", "webqsp", "quest"]
ROOT = Path(__file__).resolve().parents[2]
VARIANTS = table_rows(resolved_config(ROOT / "config" / "config.yaml")["variants"])


def rec(f1, p=None, r=None, calls=0, queries=0, per_turn=(), correct=0, cut=False):
    return {
        "precision": f1 if p is None else p,
        "recall": f1 if r is None else r,
        "f1": f1,
        "search_calls": calls,
        "queries_issued": queries,
        "queries_written": queries,
        "correct_entities": correct,
        "budget_cut": cut,
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
    assert df.columns == [
        "method", "dataset", "precision", "recall", "f1", "n",
        "precision_lo", "precision_hi", "recall_lo", "recall_hi", "f1_lo", "f1_hi", "seeds", "f1_seed_sd",
    ]  # fmt: skip
    assert df["dataset"].to_list() == DATASETS and df["n"].to_list() == [2] * 4
    row = df.row(0, named=True)
    assert (row["precision"], row["recall"], row["f1"]) == pytest.approx((0.5, 1 / 6, 0.25))
    # two questions scoring 0 and 0.5: resamples are 0, 0.25 or 0.5, the interval spans them
    assert (row["f1_lo"], row["f1_hi"]) == pytest.approx((0.0, 0.5))
    assert row["seeds"] == 1 and row["f1_seed_sd"] is None


def test_ablation_and_beta_rows_say_which_runs_this_backbone_has():
    runs = make_runs(METHODS)
    abl = role_table("ablation", runs, METHODS, VARIANTS, DATASETS)
    intervals = ["avg_lo", "avg_hi", "avg_p_vs_reference", "avg_p_holm", "avg_p_min"]
    assert abl.columns == ["method", "setting", "status", *DATASETS, "avg", *intervals]
    assert abl["method"].to_list() == ["spader", "no_spa", "no_np", "no_ig"]
    assert abl["setting"].to_list() == ["SPADER", "w/o SPA", "w/o NP", "w/o IG"]
    assert abl["status"].to_list() == ["evaluated", NOT_RUN, "evaluated", NOT_RUN]
    missing = abl.filter(pl.col("status") == NOT_RUN)
    assert all(
        missing[c].null_count() == missing.height for c in [*DATASETS, "avg", *intervals]
    )  # never invented
    spader = abl.row(0, named=True)
    assert spader["avg_lo"] <= spader["avg"] <= spader["avg_hi"] and spader["avg_p_vs_reference"] is None
    no_np = abl.filter(pl.col("method") == "no_np").row(0, named=True)
    assert 0 < no_np["avg_p_vs_reference"] <= no_np["avg_p_holm"] <= 1
    assert no_np["avg_p_min"] == pytest.approx(2 / 2**8)  # 8 questions: all 256 sign patterns
    beta = role_table("beta_sweep", runs, METHODS, VARIANTS, DATASETS)
    assert beta.columns == ["method", "beta", "status", *DATASETS, "avg", *intervals]
    assert beta["method"].to_list() == ["beta_0", "beta_1", "beta_4", "beta_8"]
    assert beta["beta"].to_list() == [0.0, 1.0, 4.0, 8.0]
    assert beta["status"].to_list() == [NOT_RUN, NOT_RUN, NOT_RUN, "evaluated"]
    assert beta.filter(pl.col("method") == "beta_8")["qampari"].item() == pytest.approx(0.03)


def test_ablation_and_beta_tables_for_a_backbone_without_variants_keep_their_columns():
    runs = make_runs(["rag", "react"])
    abl = role_table("ablation", runs, ["rag", "react"], VARIANTS, DATASETS)
    assert abl.height == 4 and set(abl["status"]) == {NOT_RUN}
    assert role_table("beta_sweep", runs, ["rag", "react"], [], DATASETS).columns == [
        "method",
        "beta",
        "status",
        *DATASETS,
        "avg",
        "avg_lo",
        "avg_hi",
        "avg_p_vs_reference",
        "avg_p_holm",
        "avg_p_min",
    ]


def test_efficiency_is_the_authors_mean_per_instance_beside_the_pooled_figures():
    runs = {
        ("react", d): [
            rec(0, calls=4, queries=6, per_turn=[1, 1], correct=2, cut=True),  # 6 / 2 = 3.0
            rec(0, calls=2, queries=2, per_turn=[0, 1], correct=0),  # no correct entity: 0
        ]
        for d in DATASETS
    }
    runs[("react", "quest")] = [rec(0, calls=3, queries=3, per_turn=[0, 0, 0], correct=1)]
    df = efficiency_table(runs, ["react"], DATASETS)
    assert df.columns == [
        "method", "dataset", "n", "search_efficiency", "queries_written", "correct_entities",
        "search_calls", "queries_issued", "entities_found", "search_calls_per_surfaced_entity",
        "queries_per_surfaced_entity", "budget_cut", "search_efficiency_lo", "search_efficiency_hi",
        "conversation_queries_per_correct_entity",
    ]  # fmt: skip
    assert df["dataset"].to_list() == [*DATASETS, "all"]
    q = df.row(0, named=True)
    assert q["search_efficiency"] == pytest.approx((3.0 + 0.0) / 2)  # averaged over instances
    # the bootstrap interval of that mean over its two instances (3.0 and 0.0): every resample's
    # mean is 0, 1.5 or 3, and the 95% interval reaches both ends
    assert (q["search_efficiency_lo"], q["search_efficiency_hi"]) == (0.0, 3.0)
    assert (q["queries_written"], q["correct_entities"], q["budget_cut"]) == (8, 2, 1)
    assert (q["search_calls"], q["entities_found"]) == (6, 3)
    assert (q["search_calls_per_surfaced_entity"], q["queries_per_surfaced_entity"]) == (2.0, 8 / 3)
    quest = df.filter(pl.col("dataset") == "quest").row(0, named=True)
    assert quest["search_efficiency"] == 3.0 and quest["search_calls_per_surfaced_entity"] is None
    assert quest["search_efficiency_lo"] == quest["search_efficiency_hi"] == 3.0  # one instance
    total = df.filter(pl.col("dataset") == "all").row(0, named=True)
    assert (total["n"], total["search_calls"], total["entities_found"]) == (7, 21, 9)
    assert total["search_efficiency"] == pytest.approx((3 * 3.0 + 3.0) / 7)
    assert total["search_calls_per_surfaced_entity"] == pytest.approx(21 / 9)
    # records written before these fields existed: recomputed from predictions and gold
    old = {k: v for k, v in rec(0, queries=4).items() if k not in ("correct_entities", "queries_written")}
    old.update(predictions=["Tam", "Oure"], gold=[["Tam"], ["Oure"], ["Lys"]])
    legacy = efficiency_table({("react", "qampari"): [old]}, ["react"], ["qampari"])
    assert legacy.row(0, named=True)["search_efficiency"] == 2.0


def test_temporal_curve_is_cumulative_and_carries_finished_episodes_forward():
    runs = {("react", d): [rec(0, per_turn=[2, 0, 1]), rec(0, per_turn=[1])] for d in DATASETS}
    df = temporal_table(runs, ["react"], DATASETS)
    assert df.columns == ["method", "dataset", "turn", "cumulative_entities", "n", "ci_lo", "ci_hi"]
    q = df.filter(pl.col("dataset") == "qampari").sort("turn")
    assert q["turn"].to_list() == [1, 2, 3]
    assert q["cumulative_entities"].to_list() == pytest.approx([1.5, 1.5, 2.0])  # (2+1)/2, (2+1)/2, (3+1)/2
    # two questions at 2 and 1 by turn 1 (3 and 1 by turn 3): the interval spans their values
    assert q["ci_lo"].to_list() == pytest.approx([1.0, 1.0, 1.0]) and q["ci_hi"].to_list() == pytest.approx(
        [2.0, 2.0, 3.0]
    )
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


OUTPUTS = ["f1", "prf", "significance", "f1_ci", "ablation", "beta_sweep", "efficiency", "temporal", "curves"]
PLOTS = ["f1_plot", "efficiency_plot", "temporal_plot", "curves_plot"]


def test_aggregate_results_writes_every_table_and_plot(tmp_path):
    methods = ["spader", "rag", "react"]
    runs = make_runs(methods)
    paths = [_write_run(tmp_path, m, d, runs[(m, d)], tiny=True) for m in methods for d in DATASETS]
    outputs = {k: tmp_path / f"{k}.tsv" for k in OUTPUTS} | {k: tmp_path / f"{k}.png" for k in PLOTS}
    steps = {
        s: {
            "critic/score/mean": 0.1 * s,
            "episode/f1": 0.05 * s,
            "actor/kl_loss": 0.01,
            "response_length/mean": 40.0,
        }
        for s in (1, 2, 3)
    }
    f1 = aggregate_results(
        [s for s, _ in paths],
        [j for _, j in paths],
        outputs,
        methods=methods,
        variants=VARIANTS,
        datasets=DATASETS,
        uncertainty={"bootstrap_samples": 500, "bootstrap_seed": 1, "significance_level": 0.05},
        training_steps={"spader": steps},
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
    sig = pl.read_csv(outputs["significance"], separator="\t")
    assert sig.height == 2 * 5 * 3 and set(sig["method"]) == {
        "rag",
        "react",
    }  # 2 methods x (4 sets + avg) x P/R/F1
    shown = pl.read_csv(outputs["f1_ci"], separator="\t", infer_schema=False)
    assert shown.columns == ["method", *DATASETS, "avg"] and shown["method"].to_list() == [
        "rag",
        "react",
        "spader",
    ]
    assert all(re.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]( \(n\.s\.\))?", c) for c in shown["qampari"])
    curves = pl.read_csv(outputs["curves"], separator="\t")
    assert set(curves["curve"]) == {"answer_f1", "kl", "response_length"} and set(curves["run"]) == {"spader"}
    for name in PLOTS:
        assert outputs[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and outputs[name].stat().st_size > 5000


def test_aggregate_refuses_stale_or_unpaired_files(tmp_path):
    sm, jl = _write_run(tmp_path, "rag", "qampari", [rec(0.5)])
    outputs = {k: tmp_path / f"{k}.tsv" for k in OUTPUTS} | {k: tmp_path / f"{k}.png" for k in PLOTS}
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


# --------------------------------------------------------------------------------------------
# uncertainty: intervals, paired tests, seeds
# --------------------------------------------------------------------------------------------
U = Uncertainty(
    samples=1000, seed=3, alpha=0.05, topics=None
)  # exact up to 12 questions, 1,000 random patterns beyond


def _graded(scores: list[float], prefix: str = "q", seed=None) -> list[dict]:
    out = []
    for i, f in enumerate(scores):
        r = rec(f) | {"id": f"{prefix}{i}"}
        if seed is not None:
            r["seed"] = seed
        out.append(r)
    return out


def _two_methods():
    """spader answers every question (F1 1.0); react only the first of every three."""
    runs = {}
    for d in DATASETS:
        runs[("spader", d)] = _graded([1.0] * 9)
        runs[("react", d)] = _graded([1.0 if i % 3 == 0 else 0.0 for i in range(9)])
    return runs


def test_intervals_and_tests_are_the_stats_modules_on_each_questions_scores():
    runs = _two_methods()
    est = Estimates(runs, ["spader", "react"], DATASETS, U)
    react = np.array([[1.0 if i % 3 == 0 else 0.0 for i in range(9)]] * 3)
    lo, hi = percentile_interval(bootstrap_means(react, U.samples, U.seed), U.level)
    prf = prf_table(runs, ["spader", "react"], DATASETS, est).filter(pl.col("method") == "react")
    assert prf["f1_lo"].to_list() == pytest.approx([lo[2]] * 4) and prf["f1_hi"].to_list() == pytest.approx(
        [hi[2]] * 4
    )
    sig = significance_table(runs, ["spader", "react"], DATASETS, est)
    assert sig.columns == [
        "method", "reference", "dataset", "metric", "n", "units", "diff", "diff_lo", "diff_hi", "p_value",
        "p_holm", "significant", "p_min",
    ]  # fmt: skip
    f1 = sig.filter(pl.col("metric") == "f1")
    assert f1["dataset"].to_list() == [*DATASETS, "avg"] and set(f1["reference"]) == {"spader"}
    assert f1["diff"].to_list() == pytest.approx([-2 / 3] * 5) and f1["n"].to_list() == [9] * 4 + [36]
    assert f1["units"].to_list() == [9] * 4 + [36]  # no topics: every question is a unit
    # 6 of 9 questions differ: exact enumeration, 2 of 64 sign patterns as extreme
    assert f1["p_value"].to_list()[:4] == pytest.approx([2 / 64] * 4)
    direct = paired_permutation_test(react[2], np.ones(9), U.samples, U.seed)
    assert f1["p_value"][0] == pytest.approx(float(direct[0]))
    # the intervals are the differences the same test does not reject: every one excludes 0
    assert all(f1["diff_hi"] < 0) and all(f1["diff_lo"] >= -1 - 1e-9)
    # 6 of the 9 questions differ (3 tie): the smallest reachable p is 2 / 64, not the 2 / 512 of 9
    # differing questions; 24 differ over avg: too many to enumerate, 1 / 1001 with random patterns
    assert f1["p_min"].to_list() == pytest.approx([2 / 64] * 4 + [1 / 1001])
    # Holm over the 5 rows of a metric: 4 x 0.031 is not below 0.05, avg (p ~ 0.001) is
    assert f1["p_holm"].to_list()[:4] == pytest.approx([4 * 2 / 64] * 4)
    assert f1["significant"].to_list() == [False] * 4 + [True]


def test_a_difference_inside_the_noise_is_marked_not_significant():
    runs = {}
    for d in DATASETS:
        runs[("spader", d)] = _graded([1.0, 0.0, 0.5, 0.0, 1.0, 0.0])
        runs[("grpo", d)] = _graded([0.0, 0.0, 0.5, 0.0, 1.0, 1.0])  # swaps two questions: same mean
        runs[("rag", d)] = _graded([0.0] * 6)
    table = f1_ci_table(
        runs, ["spader", "grpo", "rag"], DATASETS, Estimates(runs, ["spader", "grpo", "rag"], DATASETS, U)
    )
    cells = {r["method"]: r for r in table.iter_rows(named=True)}
    assert cells["grpo"]["qampari"].endswith("(n.s.)") and not cells["spader"]["qampari"].endswith("(n.s.)")
    assert cells["spader"]["qampari"].startswith("0.417 [")
    assert cells["rag"]["qampari"] == "0.000 [0.000, 0.000] (n.s.)"  # 3 of 6 questions differ: p = 1/4
    assert not cells["rag"]["avg"].endswith("(n.s.)")  # over 24 questions the difference is significant


def test_significance_and_the_marks_follow_holms_p_and_the_intervals_follow_the_test():
    """Six questions per test set, every one better for spader: p = 2/64 = 0.031 on each set, below
    0.05, but not after Holm's adjustment over the table's F1 rows, so neither significance.tsv nor
    the F1 table's marks call it significant; over the 24 questions of ``avg`` it is. Every
    difference interval excludes 0 exactly when its p-value is below the level."""
    runs = {}
    for d in DATASETS:
        runs[("spader", d)] = _graded([1.0] * 6)
        runs[("grpo", d)] = _graded([0.0] * 6)
        runs[("rag", d)] = _graded([0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    methods = ["spader", "grpo", "rag"]
    est = Estimates(runs, methods, DATASETS, U)
    sig = significance_table(runs, methods, DATASETS, est)
    assert all(
        ((r["diff_hi"] < 0) or (r["diff_lo"] > 0)) == (r["p_value"] < U.alpha)
        for r in sig.iter_rows(named=True)
    )
    assert all(r["significant"] == (r["p_holm"] < U.alpha) for r in sig.iter_rows(named=True))
    grpo = sig.filter((pl.col("method") == "grpo") & (pl.col("metric") == "f1"))
    assert grpo["p_value"].to_list()[:4] == pytest.approx([2 / 64] * 4)
    assert grpo["significant"].to_list() == [False] * 4 + [True]
    assert grpo["p_min"].to_list() == pytest.approx([2 / 64] * 4 + [1 / 1001])
    cells = {r["method"]: r for r in f1_ci_table(runs, methods, DATASETS, est).iter_rows(named=True)}
    assert cells["grpo"]["qampari"].endswith("(n.s.)") and not cells["grpo"]["avg"].endswith("(n.s.)")
    assert est.significant("grpo", "qampari") is False and est.significant("grpo", "avg") is True


def test_the_smallest_p_counts_only_the_questions_where_the_methods_differ():
    """grpo differs from spader on one question of nine per test set (as the demo's trained
    variants did on one of 200): no test can go below p = 1 there, and p_min says so; over avg
    four questions differ, 2 / 16."""
    runs = {}
    for d in DATASETS:
        runs[("spader", d)] = _graded([1.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.25, 0.0])
        runs[("grpo", d)] = _graded([1.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.25, 1.0])
    sig = significance_table(runs, ["spader", "grpo"], DATASETS)
    f1 = sig.filter(pl.col("metric") == "f1")
    assert f1["p_min"].to_list() == pytest.approx([1.0] * 4 + [2 / 16])
    assert f1["p_value"].to_list() == pytest.approx([1.0] * 4 + [2 / 16])
    assert all(r["p_value"] >= r["p_min"] for r in sig.iter_rows(named=True))
    abl = role_table(
        "ablation",
        runs | {("no_np", d): runs[("grpo", d)] for d in DATASETS},
        ["spader", "no_np"],
        VARIANTS,
        DATASETS,
    )
    assert abl.filter(pl.col("method") == "no_np")["avg_p_min"].item() == pytest.approx(2 / 16)


def _topics() -> dict[str, tuple[str, ...]]:
    """Question ``q{i}`` of every dataset asks about topic ``T{i % 3}``: three topics, each asked
    in all four datasets (as the demo asks about one topic in several datasets)."""
    return {f"{d}:q{i}": (f"T{i % 3}",) for d in DATASETS for i in range(9)}


def _prefixed(runs):
    return {(m, d): [r | {"id": f"{d}:{r['id']}"} for r in recs] for (m, d), recs in runs.items()}


def test_the_avg_row_resamples_topics_when_they_are_known():
    """With topics, ``avg`` resamples the three topics (each with its questions in every dataset)
    for its intervals and flips one sign per topic in its test: the numbers equal the stats
    module's on those clusters; the datasets' rows stay per question."""
    runs = _prefixed(_two_methods())
    clustered = Uncertainty(samples=U.samples, seed=U.seed, alpha=U.alpha, topics=_topics())
    est = Estimates(runs, ["spader", "react"], DATASETS, clustered)
    assert est.units("avg") == 3 and est.units("quest") == 9 and est.questions("avg") == 36
    sig = significance_table(runs, ["spader", "react"], DATASETS, est).filter(pl.col("metric") == "f1")
    assert sig["units"].to_list() == [9] * 4 + [3]
    react = [np.array([1.0 if i % 3 == 0 else 0.0 for i in range(9)])] * 4
    labels = [[i % 3 for i in range(9)]] * 4
    flip = SignFlip(react, [np.ones(9)] * 4, U.samples, U.seed, clusters=labels)
    # topics T1 and T2 differ (every question of T0 ties): 2 / 2**2 is as low as p can go
    assert sig["p_value"][4] == pytest.approx(float(flip.p_value()[0])) == pytest.approx(0.5)
    assert sig["p_min"][4] == pytest.approx(0.5)
    lo, hi = flip.interval(U.level)
    assert (sig["diff_lo"][4], sig["diff_hi"][4]) == pytest.approx((float(lo[0]), float(hi[0])))
    assert sig["p_value"][0] == pytest.approx(2 / 64)  # a dataset's row: its 6 differing questions
    draws = bootstrap_means(react, U.samples, U.seed, clusters=labels)
    a_lo, a_hi = percentile_interval(draws, U.level)
    assert est.interval("react", "avg")[0][2] == pytest.approx(float(a_lo[0]))
    assert est.interval("react", "avg")[1][2] == pytest.approx(float(a_hi[0]))
    # without topics the same avg is 36 independent questions: a narrower interval, a smaller p
    plain = Estimates(runs, ["spader", "react"], DATASETS, U)
    assert plain.p_value("react", "avg", "spader")[2] < 0.01
    width = est.interval("react", "avg")[1][2] - est.interval("react", "avg")[0][2]
    assert plain.interval("react", "avg")[1][2] - plain.interval("react", "avg")[0][2] < width


def test_a_question_without_a_topic_is_named():
    from spader.evaluation.topics import TopicsError

    runs = _prefixed(_two_methods())
    topics = {q: t for q, t in _topics().items() if q != "webqsp:q4"}
    u = Uncertainty(samples=100, seed=0, alpha=0.05, topics=topics)
    with pytest.raises(TopicsError, match="no topic for evaluation question 'webqsp:q4'"):
        Estimates(runs, ["spader", "react"], DATASETS, u)


def test_the_pooled_rows_of_efficiency_and_temporal_resample_topics():
    runs = _prefixed(
        {("react", d): [rec(0.5, queries=q, per_turn=[q % 2], correct=1) | {"id": f"q{i}"} for i, q in
                        enumerate([1, 3, 2, 1, 4, 2, 1, 1, 5])] for d in DATASETS}
    )  # fmt: skip
    clustered = Uncertainty(samples=500, seed=0, alpha=0.05, topics=_topics())
    plain = Uncertainty(samples=500, seed=0, alpha=0.05, topics=None)
    for table in (efficiency_table, temporal_table):
        a = table(runs, ["react"], DATASETS, clustered)
        b = table(runs, ["react"], DATASETS, plain)
        lo = "search_efficiency_lo" if table is efficiency_table else "ci_lo"
        assert (
            a.filter(pl.col("dataset") != "all")[lo].to_list()
            == b.filter(pl.col("dataset") != "all")[lo].to_list()
        )
        assert (
            a.filter(pl.col("dataset") == "all")[lo].to_list()
            != b.filter(pl.col("dataset") == "all")[lo].to_list()
        )


def test_without_the_reference_there_is_no_test():
    runs = make_runs(["rag", "react"])
    assert significance_table(runs, ["rag", "react"], DATASETS).height == 0
    assert "(n.s.)" not in "".join(f1_ci_table(runs, ["rag", "react"], DATASETS)["avg"])


def test_sampling_seeds_are_averaged_per_question_and_their_spread_reported():
    records = _graded([1.0, 0.0, 0.5], seed=0) + _graded([0.0, 0.0, 0.5], seed=1)
    qs = question_scores(records)
    assert qs.ids == ["q0", "q1", "q2"] and qs.scores[2].tolist() == pytest.approx([0.5, 0.0, 0.5])
    assert qs.seed_f1 == pytest.approx([0.5, 1 / 6])
    runs = {("react", d): records for d in DATASETS}
    row = prf_table(runs, ["react"], DATASETS).row(0, named=True)
    assert row["n"] == 3 and row["seeds"] == 2 and row["f1"] == pytest.approx(1 / 3)
    assert row["f1_seed_sd"] == pytest.approx(np.std([0.5, 1 / 6], ddof=1))
    with pytest.raises(ValueError, match="seed 1 did not evaluate every question"):
        question_scores(_graded([1.0, 0.0], seed=0) + _graded([1.0], seed=1))


def test_methods_evaluated_on_different_questions_are_refused():
    runs = _two_methods()
    runs[("react", "quest")] = _graded([0.0] * 9, prefix="other")
    with pytest.raises(ValueError, match="different questions of 'quest'"):
        Estimates(runs, ["spader", "react"], DATASETS, U)


# --------------------------------------------------------------------------------------------
# learning curves
# --------------------------------------------------------------------------------------------
def test_curves_table_reads_each_curve_from_its_first_logged_metric():
    from spader.evaluation.curves import CURVES, curves_table, missing_curves, run_labels

    spader = {
        0: {"val-core/f1": 0.1},  # validation before training: no curve point
        1: {"critic/score/mean": 0.5, "episode/f1": 0.2, "spader/search_reward/mean": 0.3,
            "episode/format_valid": 0.25, "spader/new_entities/mean": 1.0,
            "episode/searches": 1.5, "response_length/mean": 60.0, "actor/kl_loss": 0.0},
        2: {"critic/score/mean": 0.9, "episode/f1": 0.4, "episode/format_valid": 0.5,
            "spader/new_entities/mean": 2.0, "episode/entities": 2.5, "episode/searches": 2.0,
            "response_length/mean": 70.0, "actor/kl_loss": float("nan")},
    }  # fmt: skip
    grpo = {1: {"critic/score/mean": -0.5, "episode/f1": 0.0, "response_length/mean": 50.0}}
    labels = run_labels({"spader": "spader", "beta_4": "spader", "grpo": "grpo"})
    assert labels == {"spader": "spader (= beta_4)", "grpo": "grpo"}
    table = curves_table({"spader": spader, "grpo": grpo}, backbone="demo", labels=labels)
    assert table.columns == ["backbone", "run", "curve", "metric", "step", "value"]
    rows = {(r["run"], r["curve"], r["step"]): (r["metric"], r["value"]) for r in table.iter_rows(named=True)}
    assert rows[("spader (= beta_4)", "entities", 2)] == ("episode/entities", 2.5)  # the episode metric first
    assert rows[("spader (= beta_4)", "entities", 1)] == ("spader/new_entities/mean", 1.0)
    assert ("spader (= beta_4)", "kl", 2) not in rows  # not finite: no point
    assert not any(step == 0 for _, _, step in rows)
    # the answer F1 is every run's; SPADER's step reward is read only where it was logged, and
    # verl's critic/score/mean (step + terminal for SPADER, terminal alone for GRPO) never
    assert rows[("spader (= beta_4)", "answer_f1", 2)] == ("episode/f1", 0.4)
    assert rows[("grpo", "answer_f1", 1)] == ("episode/f1", 0.0)
    assert rows[("spader (= beta_4)", "step_reward", 1)] == ("spader/search_reward/mean", 0.3)
    assert "critic/score/mean" not in set(table["metric"])
    assert missing_curves(table, ["grpo"]) == {
        "grpo": ["step_reward", "format_valid", "searches", "entities", "kl"]
    }
    assert {c.name for c in CURVES} == {
        "answer_f1",
        "step_reward",
        "format_valid",
        "searches",
        "entities",
        "response_length",
        "kl",
    }
