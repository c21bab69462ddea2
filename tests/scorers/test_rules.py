"""The baselines in the paper DAG (`snakemake -n`): evidence only for StepSearch, the judge's
weights only for a served LLM judge, and both variants evaluated and aggregated like the others."""

from __future__ import annotations

import pytest
import yaml


@pytest.mark.slow
def test_baselines_in_the_dag(smk, tmp_path):
    jobs = smk.dry_run_jobs("--cores", "all", "results/llama3_1_8b/f1.tsv")
    by_rule = {}
    for j in jobs:
        by_rule.setdefault(j.rule, []).append(j)
    (evidence,) = by_rule["build_evidence"]
    assert "results/paper/data/evidence/train.jsonl" in evidence.fields["output"]
    assert "results/paper/data/mix/train.jsonl" in evidence.fields["input"]
    assert evidence.resources["gpu"] == "1"
    train = {j.wildcards["variant"]: j for j in by_rule["train_policy"]}
    assert "results/paper/data/evidence/train.jsonl" in train["stepsearch"].fields["input"]
    assert all("evidence" not in j.fields["input"] for v, j in train.items() if v != "stepsearch")
    judge_dir = "resources/models/hub/Qwen--Qwen2.5-14B-Instruct"
    assert judge_dir in train["r3rag"].fields["input"]
    assert all(judge_dir not in j.fields["input"] for v, j in train.items() if v != "r3rag")
    assert {j.fields["output"] for j in by_rule["download_model"]} >= {judge_dir}
    evaluated = {j.wildcards["method"] for j in by_rule["evaluate_policy"]}
    assert {"stepsearch", "r3rag"} <= evaluated
    (aggregate,) = by_rule["aggregate_results"]
    assert "results/llama3_1_8b/eval/r3rag/qampari.json" in aggregate.fields["input"]

    # a judge given by URL is not downloaded nor served
    overlay = tmp_path / "judge_url.yaml"
    overlay.write_text(yaml.safe_dump({"judge": {"url": "http://judge-host:30000/v1", "gpus": 1}}))
    target = "results/llama3_1_8b/train/r3rag/final.json"
    jobs = smk.dry_run_jobs(target, "--cores", "all", "--configfile", str(overlay))
    assert not any("Qwen2.5-14B" in j.fields.get("output", "") for j in jobs)
