"""The CPU demo end to end, as the README runs it, in a fresh copy of the repository; then the
rerun cases on the stages it ran.

One demo run (the session fixture ``demo_run``) is shared by the tests below, which then mutate
that copy in order.
"""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest
import yaml

from spader.core.metrics import authors_prf
from spader.evaluation.stats import smallest_p

pytestmark = pytest.mark.slow

DATASETS = ["qampari", "mintaka", "webqsp", "quest"]
# questions per dataset in the demo's evaluation (config/demo.yaml, mix.eval_limit)
_DEMO_CONFIG = Path(__file__).resolve().parents[2] / "config" / "demo.yaml"
EVAL_N = yaml.safe_load(_DEMO_CONFIG.read_text())["mix"]["eval_limit"]


def _scheduled(smk, workdir: Path, *extra: str) -> set[tuple[str, str]]:
    """(rule, wildcards) of the jobs a dry run of the demo would run now."""
    proc = smk.run(*smk.demo_args(), "-n", *extra, cwd=workdir)
    return {
        (j.rule, ",".join(f"{k}={v}" for k, v in sorted(j.wildcards.items())))
        for j in smk.parse_jobs(proc.stdout + proc.stderr)
    }


def _rules(jobs) -> set[str]:
    return {rule for rule, _ in jobs}


@pytest.fixture(scope="module")
def demo(demo_run):
    """The session's demo run (tests/conftest.py); the tests below mutate its copy in order."""
    return demo_run


def test_demo_writes_the_tables(demo):
    results = demo["work"] / "results" / "demo"
    with open(results / "f1.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert [r["method"] for r in rows] == ["rag", "react", "spader", "grpo"]
    assert list(rows[0]) == ["method", *DATASETS, "avg"]
    for row in rows:
        values = [float(row[d]) for d in DATASETS]
        assert all(0.0 <= v <= 1.0 for v in values)
        assert float(row["avg"]) == pytest.approx(sum(values) / 4, abs=1e-3)
    for name in [
        "prf.tsv",
        "efficiency.tsv",
        "temporal.tsv",
        "ablation.tsv",
        "beta_sweep.tsv",
        "efficiency.png",
        "temporal.png",
    ]:
        assert (results / name).stat().st_size > 0, name
    # the training data of the scaled-down mix exists too
    assert (demo["work"] / "results/demo/data/verl/train.parquet").exists()


def test_every_demo_training_measured_itself_beside_its_plan(demo):
    """Each training's final.json has a measured and a planned section with the same keys: the
    measured step seconds and checkpoint size of the CPU run, and, the plan modelling GPU jobs only,
    a planned section of nulls that says why (docs/gpu.md, "A training measures itself")."""
    import json

    finals = sorted((demo["work"] / "results/demo/train").glob("*/final.json"))
    assert finals
    for path in finals:
        final = json.loads(path.read_text())
        measured, planned = final["measured"], final["planned"]
        assert {"step_seconds", "checkpoint_gib", "peak_host_gib"} <= set(measured) & set(planned), path
        assert measured["step_seconds"] > 0 and measured["checkpoint_gib"] > 0, (path, measured)
        assert planned["step_seconds"] is None and "CPU run has no plan" in planned["reason"], (path, planned)


def test_demo_sets_the_authors_run_beside_the_default_run(demo):
    """The README's second command: the prompting baselines evaluated with config/authors.yaml in
    results/runs/authors/, on the default run's index and data and a warm start of its own (the
    authors' prompt and turns are what a warm start is taught), and the table that compares the
    two runs dataset by dataset."""
    import json

    work = demo["work"]
    root = work / "results" / "runs" / "authors"
    with open(root / "results" / "demo" / "versus_default.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert {r["method"] for r in rows} == {"rag", "react"} and {r["run"] for r in rows} == {"authors"}
    assert {r["dataset"] for r in rows} == {*DATASETS, "avg"}
    assert {r["metric"] for r in rows} == {"precision", "recall", "f1"} and len(rows) == 2 * 5 * 3
    with open(work / "results" / "demo" / "f1.tsv", newline="") as f:
        default_f1 = {r["method"]: r for r in csv.DictReader(f, delimiter="\t")}
    for row in (r for r in rows if r["metric"] == "f1"):
        m, d = row["method"], row["dataset"]
        names = DATASETS if d == "avg" else [d]
        own = []
        for name in names:  # this run's score from its own records
            records = [json.loads(line) for line in (root / f"results/demo/eval/{m}/{name}.jsonl").open()]
            own.append(sum(r["f1"] for r in records) / len(records))
        assert float(row["this_run"]) == pytest.approx(sum(own) / len(own), abs=1e-3)
        assert float(row["default"]) == pytest.approx(float(default_f1[m][d]), abs=1e-3)
        assert float(row["diff"]) == pytest.approx(float(row["this_run"]) - float(row["default"]), abs=2e-3)
        assert int(row["n"]) == EVAL_N * len(names)
        for side in ("default", "this_run", "diff"):
            assert float(row[f"{side}_lo"]) <= float(row[side]) + 1e-3 <= float(row[f"{side}_hi"]) + 2e-3
    for row in rows:  # the difference's interval and the test agree, on the same units
        excludes = float(row["diff_lo"]) > 0 or float(row["diff_hi"]) < 0
        assert (
            excludes == (float(row["p_value"]) < 0.05) and float(row["p_value"]) >= float(row["p_min"]) - 5e-5
        )
        assert (
            int(row["units"]) < int(row["n"])
            if row["dataset"] == "avg"
            else int(row["units"]) == int(row["n"])
        )
    # it evaluated with the authors' options from its own warm start and shared the rest: no
    # download, index, data or tiny model of its own
    summary = json.loads((root / "results/demo/eval/react/qampari.json").read_text())
    assert (summary["settings"]["loop"], summary["settings"]["agent"]["parser"]) == ("authors", "authors")
    assert summary["prompt_template"] == "spader/core/prompts/authors.txt"
    assert not (root / "resources").exists() and not (root / "results" / "models").exists()
    assert (root / "results" / "demo" / "warmstart" / "summary.json").is_file()
    assert (
        not (root / "results" / "demo" / "index").exists()
        and not (root / "results" / "demo" / "data" / "mix").exists()
    )
    records = [json.loads(line) for line in (root / "results/demo/eval/react/qampari.jsonl").open()]
    assert all(r["conversation_queries"] >= 2 for r in records)  # the authors' prompt's example call
    # scored as their script scores (evaluation.metrics: authors)
    assert summary["settings"]["metrics"] == "authors"
    for r in records:
        assert (r["precision"], r["recall"], r["f1"]) == pytest.approx(
            authors_prf(r["predictions"], r["gold"])
        )


def test_demo_leaves_benchmark_files_of_the_costly_rules(demo):
    """Snakemake's `benchmark:` on the costly rules: one TSV per job (docs/cluster.md, "Costs")."""
    bench = demo["work"] / "results" / "benchmarks"
    costly = ("build_bm25_index", "warmstart_policy", "train_policy", "export_checkpoint", "evaluate_policy")
    for rule in costly:
        files = sorted((bench / rule).rglob("*.tsv"))
        assert files, rule
        with open(files[0], newline="") as f:
            row = next(csv.DictReader(f, delimiter="\t"))
        assert float(row["s"]) > 0 and float(row["max_rss"]) > 0, (rule, row)
    assert len(list((bench / "train_policy").rglob("*.tsv"))) == 2  # spader and grpo


def test_no_result_file_names_an_absolute_path_of_the_run(demo):
    """Results are relocatable: no file under results/ (tables, summaries, episodes, final.json,
    export metadata, launch records, integrity records, verl's metrics, ...) names the working
    directory by an absolute path. Logs are not results (a traceback names files where they are),
    and the MLflow database is MLflow's own store. The Python environment is named where it is:
    here it lies outside the copy, in a user's checkout inside it (and is then written relative)."""
    work = demo["work"]
    needles = {str(p).encode() for p in (work, work.resolve())}
    offending = []
    for path in sorted((work / "results").rglob("*")):
        if not path.is_file() or path.suffix in (".db", ".log"):
            continue
        data = path.read_bytes()
        if b"\0" in data[:4096]:  # binary (weights, parquet): paths are not stored in them
            continue
        if any(n in data for n in needles):
            offending.append(str(path.relative_to(work)))
    assert not offending, offending


def test_demo_says_the_model_is_tiny_and_random(demo):
    summaries = list((demo["work"] / "results" / "demo" / "eval").rglob("*.json"))
    assert summaries
    for path in summaries:
        assert "tiny" in path.read_text() and "random" in path.read_text()


def test_demo_logs_every_job_and_tracks_it(demo):
    # one log per job (evaluation jobs add the log of the retrieval service they started)
    logs = [p for p in (demo["work"] / "logs").rglob("*.log") if not p.name.endswith(".service.log")]
    rules = {p.relative_to(demo["work"] / "logs").parts[0] for p in logs}
    assert {
        "download_dump",
        "build_bm25_index",
        "download_dataset",
        "normalize_dataset",
        "mix_training_set",
        "export_rl_dataset",
        "export_eval_set",
        "warmstart_policy",
        "train_policy",
        "export_checkpoint",
        "evaluate_policy",
        "aggregate_results",
    } <= rules
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{demo['work']}/results/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("spader")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parent = [r for r in runs if r.data.tags.get("spader.kind") == "pipeline"]
    jobs = [r for r in runs if r.data.tags.get("spader.kind") == "job"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    assert all(r.info.status == "FINISHED" for r in jobs)
    assert all(r.data.tags["mlflow.parentRunId"] == parent[0].info.run_id for r in jobs)
    assert len(jobs) == len(logs)


# ---------------------------------------------------------------------------------------------
# Read-only checks of the demo's outputs go here, before test_demo_leaves_the_checkout_clean and
# the rerun tests below, which add files to the copy and change it.
# ---------------------------------------------------------------------------------------------


def _tsv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_no_row_of_the_demos_f1_table_is_zero(demo):
    """Every method of the demo scores above zero on the held-out questions: the warm-started tiny
    policy copies gold names out of the passages it reads, so a row of zeros points at a broken
    evaluation rather than a weak model. (A cell of one dataset can still be 0 in a run: the trained
    rows move with a few sampled training steps; docs/cpu-training.md has the measured rows.)"""
    rows = _tsv(demo["work"] / "results" / "demo" / "f1.tsv")
    print({r["method"]: {d: r[d] for d in [*DATASETS, "avg"]} for r in rows})
    assert len(rows) == 4 and all(float(row["avg"]) > 0 for row in rows), rows


def _differing(results: Path, method: str, dataset: str) -> int:
    """How many questions of ``dataset`` ``method`` and spader score differently (F1)."""
    import json

    def f1(m):
        return {r["id"]: r["f1"] for r in map(json.loads, (results / f"eval/{m}/{dataset}.jsonl").open())}

    mine, ref = f1(method), f1("spader")
    return sum(mine[q] != ref[q] for q in ref)


def test_demo_tables_carry_intervals_and_tests_against_spader(demo):
    results = demo["work"] / "results" / "demo"
    prf = _tsv(results / "prf.tsv")
    # every cell is over the configured questions of its dataset (50: mix.eval_limit)
    assert EVAL_N >= 50 and prf and all(int(row["n"]) == EVAL_N for row in prf), [
        (r["dataset"], r["n"]) for r in prf
    ]
    for row in prf:
        for metric in ("precision", "recall", "f1"):
            lo, value, hi = (float(row[f"{metric}_lo"]), float(row[metric]), float(row[f"{metric}_hi"]))
            assert 0.0 <= lo <= value <= hi <= 1.0, row
    significance = _tsv(results / "significance.tsv")
    assert {r["method"] for r in significance} == {"rag", "react", "grpo"}
    assert {r["dataset"] for r in significance} == {*DATASETS, "avg"} and {
        r["reference"] for r in significance
    } == {"spader"}
    assert all(0.0 < float(r["p_value"]) <= 1.0 for r in significance)
    # p_min is the floor of the row's test: 2 / 2**k over the k questions whose F1 differs from
    # spader's (1 for one), 1 / (samples + 1) beyond 13; no p-value is below it
    for r in (r for r in significance if r["metric"] == "f1" and r["dataset"] != "avg"):
        k = _differing(results, r["method"], r["dataset"])
        assert float(r["p_min"]) == pytest.approx(smallest_p(k, 10_000), abs=5e-5), (r, k)
    assert all(float(r["p_value"]) >= float(r["p_min"]) - 5e-5 for r in significance)
    # avg resamples the clusters of questions that share a topic (evaluation.topics)
    avg = [r for r in significance if r["dataset"] == "avg"]
    assert all(int(r["n"]) == 4 * EVAL_N and 1 < int(r["units"]) < int(r["n"]) for r in avg)
    # the difference's interval is the set of differences the test does not reject
    alpha = 0.05
    assert all(((float(r["diff_lo"]) > 0) or (float(r["diff_hi"]) < 0)) == (float(r["p_value"]) < alpha)
               for r in significance)  # fmt: skip
    shown = _tsv(results / "f1_ci.tsv")
    assert [r["method"] for r in shown] == ["rag", "react", "spader", "grpo"]
    assert all(re.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]( \(n\.s\.\))?", r["avg"]) for r in shown)
    assert (results / "f1.png").stat().st_size > 0


def test_demo_report_shows_the_learning_curves(demo, smk):
    """The learning curves of both trained variants, from their training runs' per-step metrics,
    in the tables and in the report."""
    results = demo["work"] / "results" / "demo"
    curves = _tsv(results / "learning_curves.tsv")
    runs = {r["run"] for r in curves}
    assert runs == {"spader", "grpo"}
    spader = {r["curve"] for r in curves if r["run"] == "spader"}
    grpo = {r["curve"] for r in curves if r["run"] == "grpo"}
    assert {
        "answer_f1",
        "step_reward",
        "format_valid",
        "searches",
        "entities",
        "response_length",
        "kl",
    } <= spader
    assert "answer_f1" in grpo and "step_reward" not in grpo  # terminal F1 only: no step reward
    assert {int(r["step"]) for r in curves} == {1, 2}
    assert (results / "learning_curves.png").stat().st_size > 10_000
    report = demo["work"] / "report.html"
    smk.run(*smk.demo_args(), "--report", str(report), cwd=demo["work"])
    html = report.read_text(encoding="utf-8")
    assert "learning_curves.png" in html and "Learning curves of the training runs" in html
    report.unlink()  # the checkout-is-clean test below lists what the demo leaves


def test_demo_leaves_the_checkout_clean(demo, smk):
    """Everything the demo generates (downloads, their records, results, logs) is ignored: a
    checkout of the copied files shows no change after the demo. Runs before the tests below,
    which add files of their own."""
    import subprocess

    def git(*args: str, stdin: str | None = None) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=demo["work"], input=stdin, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=smk.repo, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    copied = [f for f in listed if (demo["work"] / f).is_file() or (demo["work"] / f).is_symlink()]
    git("init", "-q")
    # the test harness points XDG_CACHE_HOME into the copy (tests/conftest.py); the README's command does not
    (demo["work"] / ".git" / "info" / "exclude").write_text(".cache/\n")
    git("add", "--pathspec-from-file=-", stdin="\n".join(copied) + "\n")
    git("commit", "-q", "-m", "checkout")
    assert git("status", "--porcelain", "--untracked-files=all") == ""


def test_second_run_does_nothing(demo, smk):
    assert _scheduled(smk, demo["work"]) == set()


def _edit_first_question(path: Path, key: str) -> None:
    """Change one raw record's question (Snakemake 9 compares checksums of small inputs, so a bare
    touch of an unchanged file is rightly not a change)."""
    text = path.read_text(encoding="utf-8")
    marker = f'"{key}": "'
    at = text.index(marker) + len(marker)
    path.write_text(text[:at] + "Edited: " + text[at:], encoding="utf-8")


def test_changing_one_raw_dataset_file_reruns_its_normalization_and_the_mix(demo, smk):
    work = demo["work"]
    raw = work / "resources/demo/datasets/mintaka/mintaka_train.json"
    original = raw.read_bytes()
    _edit_first_question(raw, "question")
    try:
        jobs = _scheduled(smk, work)
    finally:  # the original content back is no change at all (a real rerun would retrain everything)
        raw.write_bytes(original)
    assert ("normalize_dataset", "dataset=mintaka,split=train,suite=demo") in jobs
    # the mix feeds the warm start and the training, so every policy is retrained and evaluated
    assert {
        "mix_training_set",
        "export_rl_dataset",
        "warmstart_policy",
        "train_policy",
        "evaluate_policy",
    } <= _rules(jobs)
    assert not {j for j in jobs if j[0] == "normalize_dataset" and "mintaka" not in j[1]}
    assert not {"build_bm25_index", "download_dump", "export_eval_set"} & _rules(jobs)
    assert _scheduled(smk, work) == set()


def test_changing_an_eval_split_reruns_that_dataset_evaluations(demo, smk):
    work = demo["work"]
    raw = work / "resources/demo/datasets/quest/test.jsonl"
    original = raw.read_bytes()
    _edit_first_question(raw, "query")
    try:
        jobs = _scheduled(smk, work)
    finally:  # putting the original content back is no change at all (Snakemake compares checksums)
        raw.write_bytes(original)
    normalized = {j for j in jobs if j[0] == "normalize_dataset"}
    assert normalized and all("dataset=quest" in j[1] for j in normalized)
    # neither the training mix nor the warm start may hold an evaluation question, so both are
    # redone, and so is everything after them
    assert {"mix_training_set", "warmstart_policy", "train_policy", "evaluate_policy"} <= _rules(jobs)
    assert len({j for j in jobs if j[0] == "evaluate_policy"}) == 16
    assert not {"build_bm25_index", "download_dump"} & _rules(jobs)
    assert _scheduled(smk, work) == set()


def test_changing_the_corpus_reruns_index_and_downstream_not_datasets(demo, smk, tmp_path):
    work = demo["work"]
    other = work / "resources/demo/chunked_wikipedia_v2.tar.gz"
    shutil.copy(work / "resources/demo/chunked_wikipedia.tar.gz", other)
    overlay = tmp_path / "corpus.yaml"
    overlay.write_text("corpus:\n  url: file:resources/demo/chunked_wikipedia_v2.tar.gz\n")
    jobs = _scheduled(smk, work, "--configfile", "config/demo.yaml", str(overlay))
    assert {"download_dump", "build_bm25_index", "evaluate_policy", "aggregate_results"} <= _rules(jobs)
    assert len({j for j in jobs if j[0] == "evaluate_policy"}) == 16  # 4 methods x 4 datasets
    assert not {"normalize_dataset", "mix_training_set", "download_dataset"} & _rules(jobs)


def test_evaluation_setting_reruns_only_evaluation(demo, smk, tmp_path):
    overlay = tmp_path / "eval.yaml"
    # the demo's budget is training's (1024 + 1024 = 2048): a different value changes the params
    overlay.write_text("evaluation:\n  max_context_tokens: 1536\n")
    jobs = _scheduled(smk, demo["work"], "--configfile", "config/demo.yaml", str(overlay))
    assert _rules(jobs) - {"all"} == {"evaluate_policy", "aggregate_results"}
    assert len({j for j in jobs if j[0] == "evaluate_policy"}) == 16


def test_reward_setting_reruns_only_that_variants_training(demo, smk, tmp_path):
    overlay = tmp_path / "beta.yaml"
    overlay.write_text("variants:\n  spader:\n    beta: 2.0\n")
    jobs = _scheduled(smk, demo["work"], "--configfile", "config/demo.yaml", str(overlay))
    assert {j for j in jobs if j[0] in ("train_policy", "export_checkpoint")} == {
        ("train_policy", "backbone=demo,variant=spader"),
        ("export_checkpoint", "backbone=demo,variant=spader"),
    }
    evals = {j for j in jobs if j[0] == "evaluate_policy"}
    assert len(evals) == 4 and all("method=spader" in j[1] for j in evals)
    assert "warmstart_policy" not in _rules(jobs)


def test_a_run_that_would_replace_expensive_results_stops_before_any_job(demo, smk, tmp_path):
    """A setting that reruns the evaluations, in a real run (not a dry run): the 16 evaluations exist,
    so the run stops before its first job, naming them and the command that recomputes them on
    purpose; nothing is replaced."""
    work = demo["work"]
    overlay = tmp_path / "eval.yaml"
    overlay.write_text("evaluation:\n  max_context_tokens: 1536\n")
    summary = work / "results/demo/eval/spader/quest.json"
    before = summary.stat().st_mtime_ns
    proc = smk.run(*smk.demo_args(), str(overlay), cwd=work, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "this run would replace 16 expensive result(s) that exist" in out, out[-4000:]
    assert "evaluate_policy (" in out and "results/demo/eval/spader/quest.jsonl" in out
    assert "To recompute them on purpose: spader rerun results/demo/eval/" in out
    assert summary.stat().st_mtime_ns == before
    assert _scheduled(smk, work) == set()


def test_retraining_on_purpose_is_one_command(demo, smk):
    """Moving a finished training's record away plans nothing while the tables are up to date
    (Snakemake leaves a missing intermediate alone): `spader rerun <final.json> --from-scratch` (here
    its alias, `python -m spader.infra.replace_guard`) plans the training, its export, its evaluations and the tables, and nothing
    else; run for real (`--touch`: the jobs marked done, not run), the guard lets exactly those
    through."""
    import subprocess
    import sys

    work = demo["work"]
    final = work / "results/demo/train/spader/final.json"
    hidden = final.with_name("final.json.away")
    final.rename(hidden)
    try:
        assert _scheduled(smk, work) == set()
    finally:
        hidden.rename(final)

    def rerun(*snakemake_args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "spader.infra.replace_guard", "results/demo/train/spader/final.json"]
        return subprocess.run(
            [*command, "--from-scratch", "--", *smk.demo_args(), *snakemake_args],
            cwd=work, env=smk.env(work), capture_output=True, text=True, timeout=900,
        )  # fmt: skip

    proc = rerun("-n")
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = {
        (j.rule, ",".join(f"{k}={v}" for k, v in sorted(j.wildcards.items())))
        for j in smk.parse_jobs(proc.stdout + proc.stderr)
    }
    assert {j for j in jobs if j[0] in ("train_policy", "export_checkpoint")} == {
        ("train_policy", "backbone=demo,variant=spader"),
        ("export_checkpoint", "backbone=demo,variant=spader"),
    }
    evals = {j for j in jobs if j[0] == "evaluate_policy"}
    assert len(evals) == 4 and all("method=spader" in j[1] for j in evals)
    assert _rules(jobs) - {"all"} == {
        "train_policy",
        "export_checkpoint",
        "evaluate_policy",
        "aggregate_results",
    }
    assert (final.parent / "work").is_dir()  # a dry run moves nothing

    before = final.stat().st_mtime_ns
    proc = rerun("--touch")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert final.stat().st_mtime_ns > before
    (moved,) = final.parent.glob("work.replaced-*")  # from scratch: the checkpoints kept aside
    assert (moved / "checkpoints").is_dir()
    moved.rename(final.parent / "work")
    assert _scheduled(smk, work) == set()
