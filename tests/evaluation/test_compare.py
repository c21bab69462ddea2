"""The table that sets a named run (config/authors.yaml) beside the default run: paired by
question, each run's interval, the difference's interval from the same sign-flip test as its
p-value (so the two agree), the smallest p that test can reach, and ``avg`` over topics."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from spader.evaluation.compare import COLUMNS, compare_runs_table
from spader.evaluation.stats import bootstrap_means, percentile_interval
from spader.evaluation.tables import Uncertainty

DATASETS = ["qampari", "mintaka", "webqsp", "quest"]
U = Uncertainty(samples=2000, seed=0, alpha=0.05, topics=None)


def rec(qid, f1, dropped=False):
    return {"id": qid, "precision": f1, "recall": f1, "f1": f1, "dropped": dropped}


def runs(method, scores):
    return {(method, d): [rec(f"{d}{i}", s) for i, s in enumerate(scores)] for d in DATASETS}


def test_each_run_its_interval_and_the_paired_difference():
    default = runs("react", [0.2] * 8 + [0.6] * 8)
    # the named run scores every question 0.1 lower: a constant paired difference
    run = runs("react", [0.1] * 8 + [0.5] * 8)
    table = compare_runs_table(default, run, ["react"], DATASETS, name="authors", uncertainty=U)
    assert list(table.schema) == list(COLUMNS) and table.height == (len(DATASETS) + 1) * 3
    f1 = table.filter((pl.col("metric") == "f1") & (pl.col("dataset") == "qampari")).row(0, named=True)
    assert (f1["run"], f1["n"]) == ("authors", 16)
    assert (f1["default"], f1["this_run"], f1["diff"]) == pytest.approx((0.4, 0.3, -0.1))
    assert f1["default_lo"] < 0.4 < f1["default_hi"] and f1["this_run_lo"] < 0.3 < f1["this_run_hi"]
    # paired: resampling the same questions for both runs leaves the difference exactly -0.1,
    # while the two runs' own intervals overlap
    assert f1["diff_lo"] == pytest.approx(-0.1) and f1["diff_hi"] == pytest.approx(-0.1)
    assert f1["this_run_hi"] > f1["default_lo"]
    assert f1["significant"] and f1["p_value"] < 0.05
    avg = table.filter((pl.col("metric") == "f1") & (pl.col("dataset") == "avg")).row(0, named=True)
    assert avg["n"] == 64 and avg["diff"] == pytest.approx(-0.1)


def test_questions_a_run_dropped_leave_both_sides_and_a_missing_method_is_named():
    default = runs("rag", [0.5, 0.5, 0.5, 0.5])
    run = runs("rag", [0.5, 0.5, 0.5, 0.5])
    for d in DATASETS:
        run[("rag", d)][0] = rec(f"{d}0", 0.0, dropped=True)  # the authors' loop dropped it
        default[("rag", d)][0] = rec(f"{d}0", 1.0)
    table = compare_runs_table(default, run, ["rag"], DATASETS, name="authors", uncertainty=U)
    row = table.filter((pl.col("metric") == "f1") & (pl.col("dataset") == "quest")).row(0, named=True)
    assert (row["n"], row["default"], row["this_run"], row["p_value"]) == (3, 0.5, 0.5, 1.0)
    with pytest.raises(KeyError, match="default run has no evaluation records for method 'react'"):
        compare_runs_table(default, run, ["react"], DATASETS, name="authors", uncertainty=U)


def test_the_difference_interval_and_the_test_agree_on_the_same_pairs():
    """50 questions of which four are worse in the named run and the rest tie (the shape of RAG on
    QAMPARI in the demo's authors run, whose bootstrap interval of the difference excluded 0 at
    p = 0.13): a percentile bootstrap of the difference excludes 0, since a resample misses all
    four worse questions less than 2.5% of the time; the sign-flip test cannot reject (p = 2/16,
    the smallest it can reach with four differing questions), and the table's interval, the
    differences that test does not reject, holds 0."""
    scores = [0.5] * 50
    default = {("rag", "qampari"): [rec(f"q{i}", s) for i, s in enumerate(scores)]}
    worse = [s - (0.4 if i < 4 else 0.0) for i, s in enumerate(scores)]
    run = {("rag", "qampari"): [rec(f"q{i}", s) for i, s in enumerate(worse)]}
    u = Uncertainty(samples=10_000, seed=0, alpha=0.05, topics=None)
    table = compare_runs_table(default, run, ["rag"], ["qampari"], name="authors", uncertainty=u)
    row = table.filter((pl.col("metric") == "f1") & (pl.col("dataset") == "qampari")).row(0, named=True)
    boot = bootstrap_means(np.array([scores, worse]), u.samples, u.seed)
    _, boot_hi = percentile_interval(boot[:, 1] - boot[:, 0], u.level)
    assert float(boot_hi) < 0  # the interval the table gave before: it disagreed with the test
    assert row["p_value"] == pytest.approx(2 / 16) and row["p_min"] == pytest.approx(2 / 16)
    assert row["diff_lo"] < row["diff"] < 0 <= row["diff_hi"] and not row["significant"]


def test_interval_and_test_agree_on_random_paired_runs_over_many_seeds():
    """Random paired scores with many ties (F1 of 0, 0.5 or 1 and runs that mostly agree), some
    runs truly worse: on every row the difference's interval excludes 0 exactly when p < alpha,
    and no p is below the p_min the row states."""
    rows = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(5, 40))
        base = rng.choice([0.0, 0.5, 1.0], size=n)
        shift = rng.choice([0.0, -0.5]) * (rng.random(n) < rng.uniform(0.05, 0.6))
        changed = np.where(rng.random(n) < 0.2, rng.choice([0.0, 0.5, 1.0], size=n), base)
        default = runs("react", base.tolist())
        run = runs("react", np.clip(changed + shift, 0, 1).tolist())
        u = Uncertainty(samples=500, seed=seed, alpha=0.05, topics=None)
        table = compare_runs_table(default, run, ["react"], DATASETS, name="authors", uncertainty=u)
        for r in table.iter_rows(named=True):
            assert ((r["diff_lo"] > 0) or (r["diff_hi"] < 0)) == (r["p_value"] < u.alpha), r
            assert r["p_value"] >= r["p_min"] - 1e-12, r
            rows += 1
    assert rows == 12 * 15


def test_the_avg_row_resamples_topics():
    """Each question ``i`` of every dataset asks about topic ``i % 2``: ``avg`` has two units, so
    its test cannot go below 2/4 however many questions differ; the datasets' rows stay per
    question."""
    default = runs("react", [0.2] * 8 + [0.6] * 8)
    run = runs("react", [0.1] * 8 + [0.5] * 8)
    topics = {f"{d}{i}": (f"T{i % 2}",) for d in DATASETS for i in range(16)}
    u = Uncertainty(samples=2000, seed=0, alpha=0.05, topics=topics)
    table = compare_runs_table(default, run, ["react"], DATASETS, name="authors", uncertainty=u)
    f1 = table.filter(pl.col("metric") == "f1")
    assert f1["units"].to_list() == [16] * 4 + [2] and f1["n"].to_list() == [16] * 4 + [64]
    assert f1["p_min"].to_list() == pytest.approx([1 / 2001] * 4 + [0.5])
    avg = f1.row(4, named=True)
    assert avg["p_value"] == pytest.approx(0.5) and not avg["significant"]
    assert avg["diff_lo"] <= 0 <= avg["diff_hi"]


def test_the_table_says_what_the_authors_profile_assumes():
    """The authors' code trains SPADER and GRPO only: for PPO, StepSearch and R3-RAG the profile's
    options are an assumption, which versus_default.tsv says in its first lines."""
    from pathlib import Path

    from spader.config import Config, resolved_config
    from spader.evaluation.compare import header_lines
    from spader.methods import assumed_methods

    config = Config.model_validate(
        resolved_config(Path(__file__).resolve().parents[2] / "config" / "config.yaml")
    )
    methods = config.methods_of("qwen3_8b")
    assert assumed_methods(config.variants, methods) == ["ppo", "stepsearch", "r3rag"]
    lines = header_lines("authors", ["ppo", "stepsearch", "r3rag"])
    assert all(line.startswith("# ") for line in lines)
    assert "assumed, not reproduced" in lines[0] and "ppo, stepsearch, r3rag" in lines[0]
    assert header_lines("authors", []) == []  # the prompting baselines and SPADER's runs: nothing assumed
