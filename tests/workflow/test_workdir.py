"""The workflow runs from any directory: `snakemake -s <repo>/workflow/Snakefile -d <workdir>`.

Files that ship with the workflow (default config, verl YAMLs, schema, scripts, the demo's bundled
release files) resolve against the repository; outputs, logs and the MLflow store go to the
working directory.
"""

from __future__ import annotations

import pytest


def _snakefile(smk) -> str:
    return str(smk.repo / "workflow" / "Snakefile")


@pytest.mark.parametrize("flag", ["-d", "--directory"])
def test_demo_dry_run_from_another_directory(smk, tmp_path, flag):
    jobs = smk.dry_run_jobs(
        "-s",
        _snakefile(smk),
        flag,
        str(tmp_path),
        "--configfile",
        str(smk.repo / "config" / "demo.yaml"),
        cwd=tmp_path.parent,
    )
    rules = {j.rule for j in jobs}
    assert {
        "download_dump",
        "build_bm25_index",
        "normalize_dataset",
        "evaluate_policy",
        "aggregate_results",
    } <= rules
    assert all(j.wildcards.get("suite", "demo") == "demo" for j in jobs)
    assert not (tmp_path / "config").exists()  # the default config was found in the repository


def test_paper_training_inputs_resolve_against_the_workflow(smk, tmp_path):
    """The verl YAMLs a training job reads are the repository's (absolute from elsewhere); with
    none, the job used to fail with an IndexError."""
    jobs = smk.dry_run_jobs(
        "-s", _snakefile(smk), "-d", str(tmp_path), "results/qwen3_8b/train/no_np/final.json"
    )
    (train,) = [j for j in jobs if j.rule == "train_policy"]
    inputs = train.fields["input"].split(", ")
    verl = [p for p in inputs if p.endswith(".yaml")]
    # no_np composes its method's YAML, SPADER's
    assert verl == [str(smk.repo / "config" / "verl" / f"{n}.yaml") for n in ("spader", "base")]
    assert "results/paper/data/verl/train.parquet" in inputs  # outputs stay relative to the workdir


def test_from_the_repository_the_inputs_stay_relative(smk):
    jobs = smk.dry_run_jobs("results/qwen3_8b/train/no_np/final.json")
    (train,) = [j for j in jobs if j.rule == "train_policy"]
    assert "config/verl/spader.yaml" in train.fields["input"].split(", ")  # no_np's: SPADER's


def test_dry_run_warns_at_once_about_the_webqsp_url(smk, tmp_path):
    proc = smk.run("-s", _snakefile(smk), "-d", str(tmp_path), "-n", "--nolock", cwd=tmp_path)
    head = (proc.stdout + proc.stderr).splitlines()[0]
    assert "datasets.webqsp.files.WebQSP.zip.url" in head and "not redistributable" in head


@pytest.mark.slow
def test_demo_first_stages_run_from_another_directory(smk, tmp_path):
    """The corpus and a dataset downloaded from the bundled files (relative `file:` URLs in
    config/demo.yaml) and normalized, for real, with outputs, logs and MLflow in the workdir."""
    work = tmp_path / "work"
    work.mkdir()
    smk.run(
        "results/demo/data/normalized/quest/train.jsonl", "resources/demo/corpus/chunked_wikipedia.tar.gz",
        "-s", _snakefile(smk), "-d", str(work), "--cores", "2",
        "--configfile", str(smk.repo / "config" / "demo.yaml"),
        cwd=tmp_path,
    )  # fmt: skip
    bundled = smk.repo / "resources" / "demo" / "chunked_wikipedia.tar.gz"
    assert (work / "resources/demo/corpus/chunked_wikipedia.tar.gz").read_bytes() == bundled.read_bytes()
    assert (work / "results/demo/data/normalized/quest/train.jsonl").stat().st_size > 0
    assert (work / "logs" / "normalize_dataset" / "demo" / "quest" / "train.log").exists()
    assert (work / "results" / "mlflow" / "mlflow.db").exists()
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()
