"""Numbers the docs quote outside docs/benchmarks.md stay tied to what produced them: the GPU memory
plan's reranker constants to the latest measurement of a replica (bench/reranker_gpu.py's record),
docs/gpu.md's table of the paper jobs to the plan's own output, and the plan's time, host memory
and disk figures (bench/plan.py's record, which the docs quote) to what the plan computes now.
(Tables and results rendered from benchmark records are held by tests/workflow/test_benchmarks.py.)"""

from __future__ import annotations

import fnmatch
import importlib.util
import re
from pathlib import Path

import pytest

from spader.config import load_config
from spader.planning import plan

REPO = Path(__file__).resolve().parents[2]


def _latest_record(bench: str) -> dict:
    spec = importlib.util.spec_from_file_location("bench_records", REPO / "bench" / "records.py")
    records = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(records)
    runs = [r for r in records.load_records() if r["bench"] == bench]
    assert runs, f"no record of {bench}"
    return runs[-1]


def _latest_row(bench: str, row_id: str) -> dict:
    spec = importlib.util.spec_from_file_location("bench_records", REPO / "bench" / "records.py")
    records = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(records)
    for record in reversed(records.load_records()):
        for row in record["rows"] if record["bench"] == bench else ():
            if row.get("id") == row_id:
                return row
    raise AssertionError(f"no record of {bench} has a row '{row_id}'")


def test_the_plans_reranker_terms_cover_the_measured_replica():
    measured = _latest_row("bench/reranker_gpu.py", "replica-memory")["numbers"]
    c = plan.CONSTANTS
    assert c["reranker_mib_per_token"] >= measured["mib_per_token"] * 0.995
    assert c["reranker_slack"] * 1024 >= measured["slack_mib"]
    assert c["cuda_context"] * 1024 >= measured["context_mib"]
    # the whole replica as the plan counts it for the measured pass, against the measured sum
    retrieval = {"reranker": {"model": "BAAI/bge-reranker-v2-m3", "fp16": True}}
    retrieval["reranker"]["max_batch_tokens"] = measured["max_batch_tokens"]
    planned = plan.reranker_gib(retrieval) * 1024
    assert measured["worst_case_mib"] <= planned <= measured["worst_case_mib"] * 1.15


# docs/gpu.md's table: the first cell names the jobs (backbone and variants in backticks)
_KINDS = {
    "Qwen3-8B": "train qwen3_8b/",
    "Llama-3.1-8B": "train llama3_1_8b/",
    "R3-RAG's judge": "judge ",
    "evaluation": "evaluate ",
    "StepSearch's evidence": "build_evidence",
}
_ABLATIONS = ["no_spa", "no_np", "no_ig"]


def _gpu_page_rows() -> list[list[str]]:
    text = (REPO / "docs" / "gpu.md").read_text()
    table = text.split("(`spader plan`):\n\n", 1)[1].split("\n\n", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def _matches(label: str, job: str) -> bool:
    kind = next(k for k in _KINDS if label.startswith(k))
    if not job.startswith(_KINDS[kind]):
        return False
    if not job.startswith("train "):
        return True
    variants = re.findall(r"`([^`]+)`", label) + (_ABLATIONS if "ablations" in label else [])
    return any(fnmatch.fnmatch(job.split("/", 1)[1], v) for v in variants)


@pytest.fixture(scope="module")
def paper_plan() -> list[plan.Job]:
    config = load_config(REPO / "config" / "config.yaml", verl_config_dir=REPO / "config" / "verl")
    return plan.plan_config(config, REPO / "config" / "verl")


def test_the_gpu_pages_plan_table_is_the_plans_output(paper_plan):
    rows = _gpu_page_rows()
    assert len(rows) >= 9
    covered = set()
    for label, gpus, _before, now, phase, margin in rows:
        jobs = [j for j in paper_plan if _matches(label, j.name)]
        assert jobs, f"docs/gpu.md names jobs the plan does not have: {label}"
        for job in jobs:
            got = (job.gpus, f"{job.peak:.1f}", f"{job.margin:.1f}")
            assert got == (int(gpus), now, margin), f"{label}: {job.name} plans {got}"
            # the phase where the page names one (a one-phase job's is its name)
            assert not phase or job.peak_phase == phase.split(" (")[0], (
                f"{label}: {job.name}: {job.peak_phase}"
            )
            covered.add(job.name)
    missing = sorted({j.name for j in paper_plan} - covered)
    assert not missing, f"jobs of the plan missing from docs/gpu.md's table: {missing}"


def test_the_plans_record_is_what_the_plan_computes_now(paper_plan):
    """The docs and the README quote per-step, per-run, host-memory and disk figures from the latest
    bench/plan.py record; after a change to the plan or config/config.yaml the record is stale until
    `python bench/plan.py` and `python bench/report.py write` run again."""
    import sys

    spec = importlib.util.spec_from_file_location("bench_plan", REPO / "bench" / "plan.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "bench"))
    config = load_config(REPO / "config" / "config.yaml", verl_config_dir=REPO / "config" / "verl")
    rows, tables = module.build(config, paper_plan)
    latest = _latest_record("bench/plan.py")
    assert latest["tables"] == tables, "bench/plan.py's record is stale: run python bench/plan.py"
    assert [(r["id"], r["result"]) for r in latest["rows"]] == [(r["id"], r["result"]) for r in rows], (
        "bench/plan.py's record is stale: run python bench/plan.py"
    )
