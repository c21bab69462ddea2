"""The SLURM profile on a real single-node SLURM (Debian's slurmctld + slurmd, started by
.ci/slurm-up.sh; skipped where SLURM is not running).

* the CPU demo DAG runs through `snakemake --profile slurm` for real, every job as a SLURM job;
* a GPU job with the paper's training request (gpu=8) gets one task with 64 CPUs and starts
  once; the request plugin 2.6.1 would make without the profile's tasks_per_gpu: 0 is refused.

No slurmdbd runs here, so the plugin polls `squeue` (`--slurm-status-command squeue`; with the
default `sacct`, which needs accounting, it would wait forever).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
# Added to `--profile slurm` because this cluster has no accounting database.
NO_ACCOUNTING = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2"]
# The CPU demo DAG (README: `snakemake --cores 2 --configfile config/demo.yaml`).
DEMO_TARGETS = ["results/demo/f1.tsv"]

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _snakemake(args: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    """Run snakemake; on timeout interrupt it (SIGINT cancels its SLURM jobs) before failing."""
    log = cwd / "snakemake.out"
    with open(log, "w") as out:
        proc = subprocess.Popen([*SNAKEMAKE, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            pytest.fail(f"snakemake did not finish within {timeout} s:\n" + log.read_text()[-4000:])
    return rc, log.read_text()


def _sbatch_calls(output: str) -> list[str]:
    return [
        re.sub(r" --wrap=.*", "", line) for line in output.splitlines() if line.startswith("sbatch call:")
    ]


def _copy_workflow(dest: Path) -> Path:
    """The workflow, config, profile and demo files in a fresh directory (own results/, logs/)."""
    for name in ("workflow", "config", "profiles"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "resources" / "demo", dest / "resources" / "demo")
    os.symlink("profiles/slurm", dest / "slurm")
    return dest


def test_demo_dag_runs_through_the_slurm_profile(slurm_cluster, tmp_path):
    work = _copy_workflow(tmp_path / "repo")
    # The executor's plumbing is what is tested here: the demo's prompting baselines only (its CPU
    # training runs end to end in tests/workflow/test_demo.py).
    (work / "baselines_only.yaml").write_text(
        json.dumps({"backbones": {"demo": {"variants": [], "warmstart": None}}})
    )
    # targets first: --configfile takes every following word as a config file
    rc, out = _snakemake(
        [
            *DEMO_TARGETS,
            "--profile",
            "slurm",
            "--configfile",
            "config/demo.yaml",
            "baselines_only.yaml",
            *NO_ACCOUNTING,
            "--verbose",
        ],
        cwd=work,
        timeout=900,
    )
    assert rc == 0, out[-6000:]
    for target in DEMO_TARGETS:
        assert (work / target).exists(), target

    calls = _sbatch_calls(out)
    stats = re.search(r"Job stats:\n.*?\n-+\s+-+\n(.*?)\ntotal\s+(\d+)", out, re.S)
    counts = dict(line.split() for line in stats.group(1).splitlines())
    counts.pop("all", None)
    # downloads are localrules (compute nodes often have no network); everything else is submitted
    local = {"download_dump", "download_dataset", "download_model"}
    assert local & set(counts)
    submitted = {rule: int(c) for rule, c in counts.items() if rule not in local}
    assert len(calls) == sum(submitted.values()), "every other job is submitted to SLURM"
    for rule in submitted:
        assert any(f"--comment rule_{rule}" in c for c in calls), rule
    assert not any("--comment rule_download" in c for c in calls)
    index_call = next(c for c in calls if "--comment rule_build_bm25_index" in c)
    assert "--cpus-per-task=16" in index_call and "--mem 32000" in index_call  # the rule's
    assert not any("--gpus" in c for c in calls)  # the demo evaluates on the CPU

    # each job's MLflow run was recorded from inside its SLURM job
    db = work / "results" / "mlflow" / "mlflow.db"
    with sqlite3.connect(db) as con:
        tags = dict(
            con.execute(
                "select r.name, t.value from runs r join tags t on t.run_uuid = r.run_uuid where t.key = 'slurm.job_id'"
            ).fetchall()
        )
    assert len(tags) == len(calls) and all(v.isdigit() for v in tags.values()), tags


def test_gpu_training_request_gets_one_task(slurm_cluster, tmp_path):
    work = tmp_path / "gpu"
    work.mkdir()
    shutil.copy(HERE / "gpu_workflow" / "Snakefile", work / "Snakefile")
    os.symlink(REPO / "profiles" / "slurm", work / "slurm")
    rc, out = _snakemake(["--profile", "slurm", *NO_ACCOUNTING, "--verbose"], cwd=work, timeout=300)
    assert rc == 0, out[-6000:]
    (call,) = _sbatch_calls(out)
    assert " --gpus=8" in call and " --cpus-per-task=64" in call and " --nodes=1" in call
    assert "--ntasks" not in call

    alloc = dict(
        line.split("=", 1) for line in (work / "results" / "allocation.txt").read_text().split("\n") if line
    )
    assert alloc["SLURM_NTASKS"] == "1"
    assert alloc["JOB_CPUS"] == "64"  # the allocation: one task of 64 CPUs
    # set-threads: 64 (what verl's Ray gets), capped by Snakemake at the CPUs the node really has;
    # the job step inside the allocation runs with that many CPUs per task
    threads = min(64, os.cpu_count())
    assert alloc["SLURM_CPUS_PER_TASK"] == str(threads)
    assert alloc["TRES_PER_JOB"] == "gres:gpu:8"
    assert int(alloc["SNAKEMAKE_THREADS"]) == threads
    starts = (work / "results" / "starts.txt").read_text().splitlines()
    assert len(starts) == 1, starts


def test_plugin_default_gpu_request_is_unschedulable(slurm_cluster, sbatch_line):
    """The same job without tasks_per_gpu: 2.6.1 asks for one 64-CPU task per GPU (512 CPUs)."""
    profile = {"gpu": 8, "nodes": 1, "cpus_per_task": 64, "mem_mb": 4000, "runtime": 60}

    def test_only(resources: dict) -> subprocess.CompletedProcess:
        argv = shlex.split(sbatch_line(resources))
        argv = [a for a in argv if a != "--parsable"]
        return subprocess.run(
            [argv[0], "--test-only", *argv[1:], "--wrap=true"], capture_output=True, text=True, timeout=30
        )

    ours = test_only({**profile, "tasks_per_gpu": 0})
    assert ours.returncode == 0, ours.stderr
    default = test_only(profile)
    assert default.returncode != 0
    assert "Requested node configuration is not available" in default.stderr
