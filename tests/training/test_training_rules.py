"""What the workflow's rules promise about a training's costly outputs, read from the paper DAG
that Snakemake builds (its API, no dry-run text): a finished training's export is protected, and
the costly rules leave their benchmark files under results/."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from spader.config import resolved_config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))

COSTLY = {"train_policy", "export_checkpoint", "evaluate_policy", "build_bm25_index", "build_evidence"}


@pytest.fixture(scope="module")
def paper_dag_jobs():
    from dag_jobs import _with_dag

    config = resolved_config(REPO / "config" / "config.yaml")

    def visit(dag):
        from snakemake.io import is_flagged

        return [
            (
                job.rule.name,
                [(str(f), is_flagged(f, "protected")) for f in job.output],
                str(job.benchmark) if job.benchmark else None,
            )
            for job in dag.jobs
        ]

    return _with_dag(config, "all", REPO, None, visit)


def test_a_finished_trainings_export_is_protected(paper_dag_jobs):
    exports = [outputs for rule, outputs, _ in paper_dag_jobs if rule == "export_checkpoint"]
    assert len(exports) >= 10  # every trained variant of both backbones
    for outputs in exports:
        assert outputs and all(protected for _, protected in outputs), outputs
    # nothing else is: a training's checkpoints are not outputs, and reruns of the rest stay free
    others = {rule for rule, outputs, _ in paper_dag_jobs if any(p for _, p in outputs)}
    assert others == {"export_checkpoint"}


def test_the_costly_rules_leave_benchmark_files_under_results(paper_dag_jobs):
    benchmarked = {rule for rule, _, bench in paper_dag_jobs if bench}
    assert COSTLY <= benchmarked
    for rule, _, bench in paper_dag_jobs:
        if bench:
            assert bench.startswith(f"results/benchmarks/{rule}/") and bench.endswith(".tsv"), bench
