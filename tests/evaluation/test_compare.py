"""The table that sets a named run (config/authors.yaml) beside the default run: paired by
question, each run's interval, the difference's paired interval and the permutation test."""

from __future__ import annotations

import polars as pl
import pytest

from spader.evaluation.compare import COLUMNS, compare_runs_table
from spader.evaluation.tables import Uncertainty

DATASETS = ["qampari", "mintaka", "webqsp", "quest"]
U = Uncertainty(samples=2000, seed=0, alpha=0.05)


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
