"""MLflow lineage through a real Snakemake run: one parent run per invocation, one nested run per
job with params, tags (git commit, config hash, input fingerprints) and outputs; FAILED on error."""

from __future__ import annotations

import hashlib
import subprocess
import textwrap
from pathlib import Path

import mlflow

from spader.infra.tracking import config_hash, fingerprint, flatten_params

JOB_SCRIPT = textwrap.dedent(
    """
    from pathlib import Path
    from spader.infra.glue import job

    with job(snakemake) as run:
        if snakemake.params.fail:
            raise RuntimeError("boom from " + snakemake.rule)
        text = "".join(Path(p).read_text() for p in snakemake.input) + snakemake.rule + "\\n"
        Path(snakemake.output[0]).write_text(text)
        run_id = run.info.run_id if run else "none"
        Path(snakemake.output[0] + ".run").write_text(run_id)
    """
)


def _workflow(root: Path, repo: Path, fail_b: bool) -> None:
    (root / "config.yaml").write_text(
        textwrap.dedent(
            f"""
            mlflow:
              enabled: true
              tracking_uri: sqlite:///results/mlflow/mlflow.db
              experiment: tracking-test
              artifact_root: results/mlflow/artifacts
              state_dir: results/mlflow
            fail_b: {str(fail_b).lower()}
            """
        )
    )
    (root / "job.py").write_text(JOB_SCRIPT)
    (root / "Snakefile").write_text(
        textwrap.dedent(
            f"""
            configfile: "config.yaml"

            # the hooks also call common.smk's start-up checks and failure report (tested elsewhere)
            def check_before_start():
                pass

            def report_failed_jobs():
                pass

            include: "{repo}/workflow/rules/tracking.smk"

            rule all:
                input: "results/b.txt"

            rule a:
                output: "results/a.txt"
                params: fail=False, settings={{"k1": 0.9, "nested": {{"b": [1, 2]}}}}
                log: "logs/a.log"
                script: "job.py"

            rule b:
                input: data="results/a.txt"
                output: "results/b.txt"
                params: fail=config["fail_b"], seed=42
                log: "logs/b.log"
                script: "job.py"
            """
        )
    )


def _runs(root: Path):
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root}/results/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("tracking-test")
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def _git_init(root: Path) -> str:
    def git(*a):
        return subprocess.run(
            ["git", *a], cwd=root, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "init")
    return git("rev-parse", "HEAD")


def test_parent_and_nested_job_runs(tmp_path, smk):
    _workflow(tmp_path, smk.repo, fail_b=False)
    commit = _git_init(tmp_path)
    smk.run("--cores", "1", cwd=tmp_path)

    client, runs = _runs(tmp_path)
    parents = [r for r in runs if r.data.tags.get("spader.kind") == "pipeline"]
    jobs = {r.data.tags["snakemake.rule"]: r for r in runs if r.data.tags.get("spader.kind") == "job"}
    assert len(parents) == 1 and set(jobs) == {"a", "b"}
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["mlflow.source.git.commit"] == commit
    for rule, run in jobs.items():
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.source.git.commit"] == commit
        assert (tmp_path / f"results/{rule}.txt.run").read_text() == run.info.run_id
        artifacts = [f.path for f in client.list_artifacts(run.info.run_id, "outputs")]
        assert f"outputs/{rule}.txt" in artifacts

    a, b = jobs["a"], jobs["b"]
    assert a.data.params["params/settings/k1"] == "0.9"
    assert a.data.params["params/settings/nested/b"] == "[1, 2]"
    assert a.data.tags["config_hash"] == config_hash(
        {"fail": False, "settings": {"k1": 0.9, "nested": {"b": [1, 2]}}}
    )
    assert (
        b.data.tags["input.data.sha256"]
        == hashlib.sha256((tmp_path / "results/a.txt").read_bytes()).hexdigest()
    )
    assert b.data.tags["output.0.path"] == str(tmp_path / "results/b.txt")

    # A second invocation with nothing to do creates no new job run.
    smk.run("--cores", "1", cwd=tmp_path)
    _, again = _runs(tmp_path)
    assert len([r for r in again if r.data.tags.get("spader.kind") == "job"]) == 2


def test_failed_job_marks_runs_failed(tmp_path, smk):
    _workflow(tmp_path, smk.repo, fail_b=True)
    proc = smk.run("--cores", "1", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "boom from b" in (tmp_path / "logs/b.log").read_text()
    _, runs = _runs(tmp_path)
    status = {r.data.tags.get("snakemake.rule", "pipeline"): r.info.status for r in runs}
    assert status == {"pipeline": "FAILED", "a": "FINISHED", "b": "FAILED"}


def test_dry_run_creates_no_tracking(tmp_path, smk):
    _workflow(tmp_path, smk.repo, fail_b=False)
    smk.run("-n", "--cores", "1", cwd=tmp_path)
    assert not (tmp_path / "results").exists()


def test_fingerprint_and_flatten(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("hello")
    f1 = fingerprint(tmp_path / "d")
    (tmp_path / "d" / "x.txt").write_text("hellO")
    assert fingerprint(tmp_path / "d") != f1
    assert fingerprint(tmp_path / "missing") == "missing"
    assert flatten_params({"a": {"b": 1, "c": [1, "x"]}, "d": None}) == {
        "a/b": "1",
        "a/c": '[1, "x"]',
        "d": "null",
    }
