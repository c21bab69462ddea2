"""The paper DAG as `snakemake -n` lists it from the repository root, for both backbones."""

from __future__ import annotations

from collections import Counter

import pytest

from spader.config import resolved_config

PIPELINE_RULES = {
    "download_dump",
    "build_bm25_index",
    "download_dataset",
    "normalize_dataset",
    "mix_training_set",
    "train_policy",
    "export_checkpoint",
    "evaluate_policy",
    "aggregate_results",
}
DATASETS = {"qampari", "mintaka", "webqsp", "quest"}


@pytest.fixture(scope="module")
def paper_config(smk):
    return resolved_config(smk.repo / "config" / "config.yaml")


@pytest.mark.parametrize("backbone", ["qwen3_8b", "llama3_1_8b"])
def test_paper_dag_lists_every_stage(smk, paper_config, backbone):
    jobs = smk.dry_run_jobs("--cores", "all", f"results/{backbone}/f1.tsv")
    rules = Counter(j.rule for j in jobs)
    assert PIPELINE_RULES <= set(rules), f"missing rules: {PIPELINE_RULES - set(rules)}"

    spec = paper_config["backbones"][backbone]
    variants, methods = set(spec["variants"]), set(spec["variants"]) | set(spec["prompting"])
    evals = {(j.wildcards["method"], j.wildcards["dataset"]) for j in jobs if j.rule == "evaluate_policy"}
    assert evals == {(m, d) for m in methods for d in DATASETS}
    # identical trainings (spader/beta_4, no_np/beta_0) are one run, trained under the first name
    trained = {j.wildcards["variant"] for j in jobs if j.rule == "train_policy"}
    assert trained == variants - {"beta_0", "beta_4"}
    assert {j.wildcards["variant"] for j in jobs if j.rule == "export_checkpoint"} == trained
    assert rules["normalize_dataset"] == 8  # 4 datasets x (train, test)
    assert rules["aggregate_results"] == 1

    for job in jobs:
        if job.rule == "train_policy":
            res = job.resources
            assert res["gpu"] == str(spec["gpus"]) == "8"
            assert int(res["mem_mb"]) > 0 and int(res["runtime"]) > 0
            assert int(job.fields["threads"]) >= 1
        elif job.rule in {"evaluate_policy"}:
            assert int(job.resources["gpu"]) == paper_config["evaluation"]["gpus"]
        elif job.rule == "build_evidence":  # StepSearch's evidence: the reranker on a GPU
            assert int(job.resources["gpu"]) == paper_config["stepsearch"]["evidence"]["gpus"]
        else:
            assert "gpu" not in job.resources or job.resources["gpu"] == "0", job.rule


def test_paper_dag_variants(smk, paper_config):
    qwen = set(paper_config["backbones"]["qwen3_8b"]["variants"])
    assert qwen == {
        "spader",
        "no_spa",
        "no_np",
        "no_ig",
        "beta_0",
        "beta_1",
        "beta_4",
        "beta_8",
        "grpo",
        "ppo",
        "stepsearch",
        "r3rag",
    }
    llama = set(paper_config["backbones"]["llama3_1_8b"]["variants"]) | set(
        paper_config["backbones"]["llama3_1_8b"]["prompting"]
    )
    assert {"spader", "grpo", "ppo", "stepsearch", "r3rag", "rag", "react"} <= llama


def test_paper_dag_writes_intervals_significance_and_learning_curves(smk, paper_config):
    """Each backbone's aggregation writes the significance table, the F1 table with intervals and
    the learning curves, from the evaluations and from every training run's final.json."""
    jobs = smk.dry_run_jobs("--cores", "all", "results/qwen3_8b/significance.tsv")
    (aggregate,) = [j for j in jobs if j.rule == "aggregate_results"]
    outputs = aggregate.fields["output"].split(", ")
    for name in (
        "significance.tsv",
        "f1_ci.tsv",
        "prf.tsv",
        "f1.png",
        "learning_curves.tsv",
        "learning_curves.png",
    ):
        assert f"results/qwen3_8b/{name}" in outputs, name
    inputs = aggregate.fields["input"].split(", ")
    trained = {j.wildcards["variant"] for j in jobs if j.rule == "train_policy"}
    assert {p for p in inputs if p.endswith("final.json")} == {
        f"results/qwen3_8b/train/{v}/final.json" for v in trained
    }


def test_default_target_builds_every_configured_backbone(smk, paper_config):
    jobs = smk.dry_run_jobs("--cores", "all")
    aggregated = {j.wildcards["backbone"] for j in jobs if j.rule == "aggregate_results"}
    assert aggregated == set(paper_config["targets"])


def test_demo_dag_runs_only_cpu_stages(smk):
    jobs = smk.dry_run_jobs("--cores", "2", "--configfile", "config/demo.yaml")
    rules = set(j.rule for j in jobs)
    assert {
        "download_dump",
        "build_bm25_index",
        "download_dataset",
        "normalize_dataset",
        "mix_training_set",
        "export_rl_dataset",
        "evaluate_policy",
        "aggregate_results",
        "build_tiny_model",
    } <= rules
    assert not any(j.resources.get("gpu", "0") != "0" for j in jobs)
    assert all(j.wildcards.get("suite", "demo") == "demo" for j in jobs)


def test_slurm_profile_dry_run_from_repo_root(smk):
    """`snakemake -n --profile slurm ...` works exactly as typed, without SLURM on the machine."""
    proc = smk.run("-n", "--nolock", "--forceall", "--profile", "slurm", "results/qwen3_8b/f1.tsv")
    jobs = smk.parse_jobs(proc.stdout + proc.stderr)
    assert {j.rule for j in jobs} >= PIPELINE_RULES
    train = [j for j in jobs if j.rule == "train_policy"]
    assert train and all(j.resources["gpu"] == "8" for j in train)


def test_lint_is_clean_apart_from_environments(smk):
    """`snakemake --lint` finds nothing but the missing per-rule conda/container directives (the
    project runs every rule in its one pip environment)."""
    proc = smk.run("--lint", check=False)
    findings = [
        line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip().startswith("* ")
    ]
    assert findings, "lint produced no output at all"
    assert all(f.startswith("* Specify a conda environment or container") for f in findings), findings


def test_identical_trainings_are_trained_once_and_evaluated_under_every_name(smk, paper_config):
    jobs = smk.dry_run_jobs("--cores", "all", "results/qwen3_8b/f1.tsv", "results/llama3_1_8b/f1.tsv")
    train = [j for j in jobs if j.rule == "train_policy"]
    variants = {b: set(spec["variants"]) for b, spec in paper_config["backbones"].items()}
    # beta_0 trains as no_np and beta_4 as spader on Qwen3-8B; Llama-3.1-8B has no duplicate
    assert len(train) == len(variants["qwen3_8b"]) - 2 + len(variants["llama3_1_8b"])
    assert {(j.wildcards["backbone"], j.wildcards["variant"]) for j in train} >= {
        ("qwen3_8b", "spader"),
        ("qwen3_8b", "no_np"),
        ("llama3_1_8b", "spader"),
    }
    assert not {("qwen3_8b", "beta_0"), ("qwen3_8b", "beta_4")} & {
        (j.wildcards["backbone"], j.wildcards["variant"]) for j in train
    }
    # every variant keeps its evaluations (and so its table rows), on the shared checkpoint
    evals = {(j.wildcards["backbone"], j.wildcards["method"]) for j in jobs if j.rule == "evaluate_policy"}
    assert {("qwen3_8b", "beta_0"), ("qwen3_8b", "beta_4")} <= evals
    beta_4 = next(j for j in jobs if j.rule == "evaluate_policy" and j.wildcards["method"] == "beta_4")
    assert "results/qwen3_8b/models/spader" in beta_4.fields["input"]
