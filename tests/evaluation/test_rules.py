"""Rules evaluate_policy and aggregate_results run by the real snakemake CLI in a scratch work
directory (config overlaid with config/demo.yaml): outputs, reruns, the report.

Upstream inputs the tests do not exercise (evaluation sets, for the aggregation also the
evaluations themselves) are written by the test in their real formats, and ``--allowed-rules``
keeps Snakemake from rebuilding them. Everything else is real: the pyserini index built by rule
build_bm25_index from the demo's dump (QAMPARI chunk format), the retrieval service, the tiny
random Qwen3 (rule build_tiny_model) through the transformers engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
DATASETS = ["qampari", "mintaka", "webqsp", "quest"]


def snakemake(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [SNAKEMAKE, "-s", str(REPO / "workflow" / "Snakefile"), "--directory", str(work), "-c2"]
    cmd += ["--configfile", "config/demo.yaml", "test.yaml", *args]
    env = dict(os.environ, XDG_CACHE_HOME=str(work / ".cache"), HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text()[-3000:]}" for p in sorted((work / "logs").rglob("*.log")))
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stderr[-6000:]}\n{logs}")
    return proc


def workdir(tmp_path: Path, overlay: dict) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "config").symlink_to(REPO / "config")
    # the evaluation rules are tested on the tiny model as built (the warm start: tests/models/);
    # set in the caller's overlay, which some tests write again with a change
    overlay.setdefault("backbones", {}).setdefault("demo", {}).setdefault("warmstart", None)
    (work / "test.yaml").write_text(json.dumps({"mlflow": {"enabled": False}, **overlay}))
    return work


def scheduled(work: Path, *targets: str, allowed: tuple[str, ...]) -> list[str]:
    proc = snakemake(work, "-n", "--allowed-rules", *allowed, "--", *targets)
    out = proc.stdout + proc.stderr
    if "Nothing to be done" in out:
        return []
    return [
        line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith(("rule ", "localrule "))
    ]


# --------------------------------------------------------------------------------------------
# aggregate_results
# --------------------------------------------------------------------------------------------
def write_evaluation(work: Path, method: str, dataset: str, f1s: list[float]) -> None:
    out = work / "results" / "demo" / "eval" / method
    out.mkdir(parents=True, exist_ok=True)
    recs = [
        {
            "id": f"{dataset}-{i}", "precision": f, "recall": f, "f1": f, "format_valid": True, "status": "answered",
            "search_calls": 1, "queries_issued": 2, "entities_found": 1, "new_entities_per_turn": [1, 0],
            "queries_written": 2, "correct_entities": 1, "search_efficiency": 2.0, "budget_cut": i == 0,
        }
        for i, f in enumerate(f1s)
    ]  # fmt: skip
    (out / f"{dataset}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    summary = {"method": method, "dataset": dataset, "n": len(recs), "tiny_model": True}
    (out / f"{dataset}.json").write_text(json.dumps(summary))
    recorded(out / f"{dataset}.jsonl", out / f"{dataset}.json")


def recorded(*paths: Path) -> None:
    """Record files the test writes in place of their rules, as those rules' jobs would
    (every output under results/ has an integrity record its readers check)."""
    from spader.infra.integrity import record_outputs

    record_outputs(paths, producer="test")


def test_aggregate_results_tables_rerun_and_report(tmp_path):
    # the prompting baselines only: the tables must say that no variant was trained; question i of
    # every dataset asks about topic T<i> (evaluation.topics): avg and all resample the two topics
    topics = tmp_path / "topics.tsv"
    topics.write_text("id\ttopic\n" + "".join(f"{d}-{i}\tT{i}\n" for d in DATASETS for i in range(2)))
    work = workdir(tmp_path, {"backbones": {"demo": {"variants": []}}, "evaluation": {"topics": str(topics)}})
    for m in ("rag", "react"):
        for j, d in enumerate(DATASETS):
            write_evaluation(work, m, d, [0.1 * (j + 1), 0.0] if m == "rag" else [0.5, 0.5])
    allowed = ("aggregate_results",)
    snakemake(work, "--allowed-rules", *allowed, "--", "results/demo/f1.tsv")
    log = (work / "logs" / "aggregate_results" / "demo.log").read_text()
    assert "avg over 2 clusters of questions sharing a topic" in log
    res = work / "results" / "demo"
    f1 = pl.read_csv(res / "f1.tsv", separator="\t")
    assert f1.columns == ["method", *DATASETS, "avg"] and f1["method"].to_list() == ["rag", "react"]
    assert f1.row(0) == pytest.approx(("rag", 0.05, 0.1, 0.15, 0.2, 0.125))
    prf = pl.read_csv(res / "prf.tsv", separator="\t")
    assert prf.columns[:6] == ["method", "dataset", "precision", "recall", "f1", "n"] and prf.height == 8
    for name, rows in (
        ("ablation", ["spader", "no_spa", "no_np", "no_ig"]),
        ("beta_sweep", ["beta_0", "beta_1", "beta_4", "beta_8"]),
    ):
        table = pl.read_csv(res / f"{name}.tsv", separator="\t")
        assert table["method"].to_list() == rows and set(table["status"]) == {"not run for this backbone"}
        assert table["avg"].null_count() == 4  # nothing trained here: no number is made up
    eff = pl.read_csv(res / "efficiency.tsv", separator="\t")
    assert set(zip(eff["method"], eff["dataset"], strict=True)) == {
        (m, d) for m in ("rag", "react") for d in [*DATASETS, "all"]
    }
    assert eff["search_efficiency"].to_list() == [2.0] * 10  # the authors' figure: 2 queries / 1 entity
    assert eff["search_calls_per_surfaced_entity"].to_list() == [1.0] * 10
    assert eff.filter(pl.col("dataset") == "all")["budget_cut"].to_list() == [4, 4]
    tmp = pl.read_csv(res / "temporal.tsv", separator="\t")
    assert tmp.columns[:5] == ["method", "dataset", "turn", "cumulative_entities", "n"] and set(
        tmp["turn"]
    ) == {
        1,
        2,
    }
    for png in ("efficiency.png", "temporal.png"):
        assert (res / png).read_bytes()[:4] == b"\x89PNG"
    runs = pl.read_csv(res / "runs.tsv", separator="\t")
    assert runs.columns == ["method", "training_run", "shared_with"]

    assert scheduled(work, "results/demo/f1.tsv", allowed=allowed) == []  # unchanged: nothing reruns
    write_evaluation(work, "react", "quest", [0.25, 0.5])  # a re-evaluation changed one input
    assert scheduled(work, "results/demo/f1.tsv", allowed=allowed) == ["aggregate_results"]
    snakemake(work, "--allowed-rules", *allowed, "--", "results/demo/f1.tsv")

    snakemake(work, "--allowed-rules", *allowed, "--report", "report.html", "--", "results/demo/f1.tsv")
    html = (work / "report.html").read_text()
    assert "Macro-averaged F1 of every method of backbone" in html
    assert "tiny, randomly initialised model" in html and "queries the agent" in html


# --------------------------------------------------------------------------------------------
# evaluate_policy with the real retrieval service
# --------------------------------------------------------------------------------------------
DEMO_DUMP = REPO / "resources" / "demo" / "chunked_wikipedia.tar.gz"
QUESTIONS = [
    (
        "q1",
        "Which films were directed by Ilse Varga?",
        [
            ["The Salt Orchard", "Salt Orchard"],
            ["Saint-Malo Express"],
            ["Winter Quay"],
            ["What Price Courage?"],
        ],
    ),
    ("q2", "Which novels were written by Agata Ostner?", [["The Golden Compass", "Golden Compass"]]),
]


def test_evaluate_policy_with_the_real_service_and_no_rerun_when_unchanged(tmp_path):
    # the demo's dump; BM25 alone (no reranker) decides which passages come back, so the
    # passages found are known: the demo test runs the same path with the tiny reranker
    overlay = {
        "corpus": {"archive": str(DEMO_DUMP)},
        "retrieval": {"reranker": {"model": None}},
        "variants": {"r3rag": {"judge": "llm"}},  # the demo's R3-RAG judge is the (absent) reranker
        "agent": {"max_turns": 2, "max_turn_tokens": 16, "max_tool_response_chars": 11000},  # all 5 passages
        "evaluation": {"batch_size": 4},
    }
    work = workdir(tmp_path, overlay)
    eval_dir = work / "results" / "demo" / "data" / "eval"
    eval_dir.mkdir(parents=True)
    rows = [
        {"id": i, "question_text": q, "ground_truth": g, "data_source": "qampari"} for i, q, g in QUESTIONS
    ]
    (eval_dir / "qampari.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recorded(eval_dir / "qampari.jsonl")
    allowed = ("build_bm25_index", "build_tiny_model", "evaluate_policy")  # eval set: written above
    targets = ["results/demo/eval/rag/qampari.json", "results/demo/eval/react/qampari.json"]
    snakemake(work, "--allowed-rules", *allowed, "--", *targets)

    base = work / "results" / "demo" / "eval"
    rag = [json.loads(line) for line in (base / "rag" / "qampari.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rag] == ["q1", "q2"]
    films = rag[0]
    # rag's retrieval is the question itself; the "Ilse Varga" article names all four films
    assert films["steps"][0]["kind"] == "retrieval" and films["steps"][0]["queries"] == [QUESTIONS[0][1]]
    assert films["search_calls"] == 1 and len(films["steps"][0]["passage_ids"][0]) == 5
    assert "10148__0" in films["steps"][0]["passage_ids"][0]
    assert films["new_entities_per_turn"][0] == 4 and films["entities_found"] == 4
    summary = json.loads((base / "rag" / "qampari.json").read_text())
    assert summary["n"] == 2 and summary["tiny_model"] and "TINY RANDOM MODEL" in summary["note"]
    assert summary["engine"] == "transformers"
    react = json.loads((base / "react" / "qampari.json").read_text())
    assert react["n"] == 2 and 0.0 <= react["f1"] <= 1.0
    # the context budget is training's prompt + response budget (config/demo.yaml: 1024 + 1024)
    assert summary["settings"]["max_context_tokens"] == 2048 and summary["settings"]["temperature"] == 0.0
    assert {"budget_cut", "search_efficiency", "generation_errors"} <= set(react)

    assert scheduled(work, *targets, allowed=allowed) == []  # unchanged model, set and settings
    overlay["agent"]["max_turns"] = 3  # a setting that changes scores: both rerun
    (work / "test.yaml").write_text(json.dumps({"mlflow": {"enabled": False}, **overlay}))
    assert sorted(scheduled(work, *targets, allowed=allowed)) == ["evaluate_policy", "evaluate_policy"]
    # so does another prompt template (its hash is the param); the file is read by the job
    overlay["agent"]["max_turns"] = 2
    template = work / "authors_prompt.txt"
    template.write_text("Search, then answer as a JSON list.\nQuestion: {question}\n", encoding="utf-8")
    overlay["agent"]["prompt_template"] = str(template)
    (work / "test.yaml").write_text(json.dumps({"mlflow": {"enabled": False}, **overlay}))
    assert sorted(scheduled(work, *targets, allowed=allowed)) == ["evaluate_policy", "evaluate_policy"]
