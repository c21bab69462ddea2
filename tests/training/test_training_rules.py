"""What the workflow's rules promise about a training's costly outputs, read from the paper DAG
that Snakemake builds (its API, no dry-run text): the expensive outputs are guarded by what a run
plans, not by file permissions, and the costly rules leave their benchmark files under results/."""

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


def test_expensive_outputs_are_guarded_by_the_plan_not_by_file_permissions(paper_dag_jobs):
    """The guard (spader.infra.replace_guard, the onstart hook) names rules of the DAG, and no output is
    Snakemake-protected(): read-only files would refuse a deliberate --forcerun, and a job run as
    root writes them anyway."""
    from spader.infra.replace_guard import GUARDED_RULES

    rules = {rule for rule, _, _ in paper_dag_jobs}
    assert set(GUARDED_RULES) == {"build_bm25_index", "train_policy", "export_checkpoint", "evaluate_policy"}
    assert set(GUARDED_RULES) <= rules
    assert not [f for _, outputs, _ in paper_dag_jobs for f, protected in outputs if protected]


def test_the_costly_rules_leave_benchmark_files_under_results(paper_dag_jobs):
    benchmarked = {rule for rule, _, bench in paper_dag_jobs if bench}
    assert COSTLY <= benchmarked
    for rule, _, bench in paper_dag_jobs:
        if bench:
            assert bench.startswith(f"results/benchmarks/{rule}/") and bench.endswith(".tsv"), bench
