"""The SLURM profile on a real single-node SLURM (Debian's slurmctld + slurmd, started by
.ci/slurm-up.sh; skipped where SLURM is not running).

* the CPU demo DAG runs through `snakemake --profile slurm` for real, every job as a SLURM job;
* a GPU job with the paper's training request (gpu=8) gets one task with 64 CPUs and starts
  once; the request plugin 2.6.1 would make without the profile's tasks_per_gpu: 0 is refused;
* a CPU training under a time limit shorter than itself stops at a step boundary on SLURM's
  warning and is resumed by the rule's retries in new allocations until it finishes;
* a job's Ray cluster starts over its nodes with srun and stops with the job.

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
import time
from pathlib import Path

import psutil
import pytest

from spader.config import resolved_config

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
    # the demo's release files only: a checkout that has run the demo also holds what its jobs
    # extracted there (without the integrity records of results/, which are not copied)
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "resources/demo"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if tracked.returncode == 0 and tracked.stdout:
        for name in filter(None, tracked.stdout.split("\0")):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    else:  # not a git checkout: the release files are all there is
        shutil.copytree(REPO / "resources" / "demo", dest / "resources" / "demo")
    os.symlink("profiles/slurm", dest / "slurm")
    return dest


def _slurm_conf_elsewhere(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of this cluster's slurm.conf at another path, with an `SrunProlog` that records every
    `srun` that read it: (the copy, the record)."""
    conf = tmp_path / "slurm-elsewhere" / "slurm.conf"
    conf.parent.mkdir()
    record = conf.parent / "srun-read-me.log"
    prolog = conf.parent / "srun_prolog.sh"
    prolog.write_text(f'#!/bin/sh\necho "$SLURM_JOB_ID" >> {record}\nexit 0\n')
    prolog.chmod(0o755)
    conf.write_text(Path("/etc/slurm/slurm.conf").read_text() + f"\nSrunProlog={prolog}\n")
    return conf, record


def test_demo_dag_runs_through_the_slurm_profile(slurm_cluster, tmp_path):
    """The demo DAG through the profile. Its jobs see their SLURM configuration at another path than
    SLURM's built-in one, named by SLURM_CONF (as on a cluster whose slurmd runs with a config
    elsewhere; here set by a --precommand in the batch job, since this cluster's slurmd reads
    /etc/slurm): the srun that the jobstep plugin runs each job with, which the plugin strips of
    SLURM_CONF, still reads it (an SrunProlog only that copy has records every such srun)."""
    work = _copy_workflow(tmp_path / "repo")
    conf, srun_record = _slurm_conf_elsewhere(tmp_path)
    # The executor's plumbing is what is tested here: the demo's DAG with one prompting method (its
    # CPU training and the other methods run end to end in tests/workflow/test_demo.py).
    (work / "baselines_only.yaml").write_text(
        json.dumps({"backbones": {"demo": {"variants": [], "prompting": ["react"], "warmstart": None}}})
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
            "--precommand",
            f"export SLURM_CONF={conf}",
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
    # every job's srun read the configuration its allocation named (SLURM_CONF kept for it)
    assert srun_record.exists(), "no srun read the configuration named by SLURM_CONF"
    assert set(srun_record.read_text().split()) == set(tags.values())


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
    assert alloc["JOB_CPUS"] == "64"  # the allocation: one task of 64 CPUs (cpus_per_task)
    # the job step inside the allocation runs with the CPUs asked for; the job's Snakemake runs with
    # every core it can use there (--cores all), at most the CPUs this machine really has
    assert alloc["SLURM_CPUS_PER_TASK"] == "64", alloc
    assert alloc["TRES_PER_JOB"] == "gres:gpu:8"
    assert int(alloc["SNAKEMAKE_THREADS"]) == min(64, os.cpu_count()), alloc
    starts = (work / "results" / "starts.txt").read_text().splitlines()
    assert len(starts) == 1, starts


def test_a_failed_jobs_cause_reaches_the_console_as_it_fails(slurm_cluster, tmp_path):
    """Under the SLURM executor a job's stderr goes to its SLURM log; the workflow prints the cause
    from the job's log when SLURM reports the job failed, while the run goes on with its other jobs
    (keep-going), not only in the summary at its end."""
    work = tmp_path / "failing"
    work.mkdir()
    shutil.copy(HERE / "failing_workflow" / "Snakefile", work / "Snakefile")
    os.symlink(REPO / "profiles" / "slurm", work / "slurm")
    log = work / "snakemake.out"
    cause = "fails (jobid 1) failed: ValueError: the input is broken [log: logs/fails.log"
    seen_while_running = None
    with open(log, "w") as out:
        proc = subprocess.Popen([*SNAKEMAKE, "--profile", "slurm", *NO_ACCOUNTING], cwd=work, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline = time.monotonic() + 240
            while proc.poll() is None and time.monotonic() < deadline:
                text = log.read_text()
                if re.search(r"fails \(jobid \d+\) failed: ValueError: the input is broken", text):
                    seen_while_running = not (work / "results" / "slow.txt").exists()
                    break
                time.sleep(0.5)
            proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=60)
    text = log.read_text()
    assert seen_while_running is True, text[-4000:]
    assert proc.returncode != 0 and (work / "results" / "slow.txt").exists(), text[-4000:]
    assert re.search(re.escape(cause).replace("jobid 1", r"jobid \d+"), text), text[-4000:]


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


TIME_LIMITED_SNAKEFILE = """
configfile: "config.yaml"

W = config["world"]


rule train_policy:
    input:
        train=W + "/train.parquet",
        val=W + "/val.parquet",
        index=W + "/index",
        model=W + "/warm",
        verl_configs={verl_configs!r},
    output:
        final="results/{{backbone}}/train/{{variant}}/final.json",
    log:
        "logs/train_policy/{{backbone}}/{{variant}}.log",
    threads: 2
    retries: 0 if workflow.remote_exec else 3  # as spader.dag.TrainingResources.retries
    resources:
        runtime=10,
        mem_mb=6000,
        slurm_extra="--signal=URG@570",
        train_attempt=lambda wc, attempt: attempt,
    params:
        backbone=config["backbone"],
        variant=lambda wc: config["variants"][wc.variant],
        training=config["training"],
        agent=config["agent"],
        retrieval=config["retrieval"],
        workdir=lambda wc: f"results/{{wc.backbone}}/train/{{wc.variant}}/work",
        judge=None,
    script:
        {script!r}
"""


@pytest.fixture(scope="module")
def cpu_world(tmp_path_factory):
    """The CPU training world (tests/support/cpu_world.py; ``SPADER_CPU_WORLD`` reuses a built one)."""
    sys.path.insert(0, str(REPO / "tests" / "support"))
    from cpu_world import build_world

    root = os.environ.get("SPADER_CPU_WORLD")
    # the session's shared directory: tests/cpu_training's `world` builds the same one, and the
    # second build reuses the index and the warm-started model (the costly parts)
    return build_world(Path(root) if root else tmp_path_factory.getbasetemp() / "cpu_world")


@pytest.fixture
def cpu_hog():
    """Two busy loops beside the test, at the test's own priority: a loaded machine, on which SLURM's
    one warning can come while the job is still starting (before its handler was once installed,
    ~40 s into the job: the warning was lost and the training finished in one allocation)."""
    loop = [sys.executable, "-c", "while True: pass"]
    hogs = [subprocess.Popen(["nice", "-n", "0", *loop]) for _ in range(2)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


def test_a_training_outlives_its_time_limit_across_allocations(slurm_cluster, cpu_world, cpu_hog, tmp_path):
    """A CPU training job of 2 steps under a 10-minute limit, warned 9.5 minutes before it (so within
    its first minute: SLURM checks the warning times about once a minute; and a job that has
    started, which takes verl more than 30 s, reads that its allocation has less than the warning's
    time left at its first step boundary, however fast the machine: with 9 minutes a quiet machine
    finished its first step, before SLURM's check, with 551 s left and trained both steps in one
    allocation), beside a CPU hog: each
    allocation trains until the next step boundary after the warning (or after the job read that
    its allocation has less than the warning's time left), saves, exits with the resumable status,
    and the rule's retries resume it in a new allocation, until the configured step count. Every
    step is logged once; MLflow shows one training across the attempts."""
    import yaml
    from cpu_world import cpu_training

    work = tmp_path / "repo"
    work.mkdir()
    os.symlink(REPO / "profiles" / "slurm", work / "slurm")
    config = resolved_config(REPO / "config" / "config.yaml")
    steps = 2
    config.update(
        world=str(cpu_world.root),
        backbone={"model": "tiny:qwen3", "gpus": 0},
        training={**cpu_training(max_steps=steps, train_batch_size=2, ppo_mini_batch_size=2, rollout_n=2),
                  "time_limit": {"warning_s": 570}},  # as the rule's --signal=URG@570
        agent=cpu_world.agent,
        retrieval=cpu_world.retrieval,
        mlflow={"enabled": True, "tracking_uri": "sqlite:///results/mlflow/mlflow.db", "experiment": "spader",
                "artifact_root": "results/mlflow/artifacts", "state_dir": "results/mlflow"},
    )  # fmt: skip
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    (work / "Snakefile").write_text(
        TIME_LIMITED_SNAKEFILE.format(
            verl_configs=[str(REPO / "config" / "verl" / "grpo.yaml")],
            script=str(REPO / "workflow" / "scripts" / "train_policy.py"),
        )
    )
    target = "results/world/train/grpo/final.json"
    rc, out = _snakemake(
        [target, "--profile", "slurm", "--set-threads", "train_policy=2", *NO_ACCOUNTING, "--verbose"],
        cwd=work,
        timeout=1500,
    )
    wd = work / "results" / "world" / "train" / "grpo" / "work"
    history = (
        [json.loads(line) for line in (wd / "attempts.jsonl").read_text().splitlines()] if wd.exists() else []
    )
    assert rc == 0, out[-4000:] + "\n" + json.dumps(history, indent=1)
    final = json.loads((work / target).read_text())
    assert final["steps_done"] == steps

    starts = [h for h in history if h["event"] == "start"]
    ends = [h for h in history if h["event"] == "end"]
    assert len({s["slurm_job_id"] for s in starts}) == len(starts) >= 2  # one allocation per attempt
    assert [e["status"] for e in ends] == ["stopped"] * (len(ends) - 1) + ["finished"], history
    for end in ends[:-1]:  # the warning signal, or the time left that the job read from SLURM
        assert "time-limit warning (SIGURG)" in end["error"] or "left before its time limit" in end["error"]
    assert [s["snakemake_attempt"] for s in starts] == list(range(1, len(starts) + 1))  # the rule's retries
    assert len(_sbatch_calls(out)) == len(starts)

    # every step logged exactly once across the attempts (a resumed attempt validates at its
    # resume step first: validation only, no training metrics)
    trained = []
    for f in sorted((wd / "metrics").glob("attempt_*.jsonl")):
        trained += [
            r["step"] for r in map(json.loads, f.read_text().splitlines()) if "critic/score/mean" in r["data"]
        ]
    assert sorted(trained) == list(range(1, steps + 1))

    # MLflow: one training, its attempts' runs sharing the lineage of the first
    with sqlite3.connect(work / "results" / "mlflow" / "mlflow.db") as con:
        runs = con.execute(
            "select r.run_uuid, r.status from runs r join tags t on t.run_uuid = r.run_uuid "
            "where t.key = 'training.lineage' and t.value = ?",
            (final["lineage"],),
        ).fetchall()
        logged = sorted(
            step
            for (step,) in con.execute(
                "select step from metrics where key = 'critic/score/mean' and run_uuid in "
                f"({','.join('?' * len(runs))})",
                [r[0] for r in runs],
            )
        )
    assert len(runs) == len(starts) and final["lineage"] in {r[0] for r in runs}
    assert sorted(s for _, s in runs) == sorted(["KILLED"] * (len(runs) - 1) + ["FINISHED"])
    assert logged == list(range(1, steps + 1))


RAY_JOB = """
import json, os, subprocess, sys
from pathlib import Path

from spader.training.ray_cluster import slurm_nodes, slurm_ray_cluster

out = Path(sys.argv[1])
node = slurm_nodes()[0]
# a one-node cluster: the allocation's node twice (the head here, a worker node through srun)
with slurm_ray_cluster(nodes=[node, node], cpus=1, gpus=0, token_file=out / "token", log_dir=out / "ray",
                       start_timeout_s=240, grace_s=5, step={"cpus": 2, "mem_mb": 3000, "gpus": 0}) as (address, env):
    job = os.environ["SLURM_JOB_ID"]
    steps = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True)
    step = subprocess.run(["scontrol", "show", "step", f"{job}.0"], capture_output=True, text=True).stdout
    ray = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "status", f"--address={address}"],
                         capture_output=True, text=True, env={**os.environ, **env})
    stranger = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    anonymous = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "status", f"--address={address}"],
                               capture_output=True, text=True, env={**stranger, "RAY_AUTH_MODE": "token",
                               "RAY_AUTH_TOKEN": "0" * 64}, timeout=120)
    result = {"address": address, "steps": steps.stdout.split(), "step": step, "status": ray.stdout,
              "anonymous_rc": anonymous.returncode, "anonymous": anonymous.stdout + anonymous.stderr,
              "token_mode": oct(os.stat(out / "token").st_mode & 0o777)}
(out / "result.json").write_text(json.dumps({**result, "token_left": (out / "token").exists()}))
"""  # fmt: skip


def test_a_job_starts_its_ray_cluster_over_its_nodes_with_srun(slurm_cluster, tmp_path):
    """The multi-node path inside a real allocation: the head in the batch step, a worker node as
    an `srun --overlap` step asking for its CPUs and memory (on this single-node cluster, on the
    same node, which the job's own Ray temporary directory and ports let two nodes share), both in `ray status`,
    a client with another token refused, and everything gone when the block ends."""
    script = tmp_path / "ray_job.py"
    script.write_text(RAY_JOB)
    job_id = subprocess.run(
        ["sbatch", "--parsable", "-N1", "-c2", "--mem=4000", "-t5", f"--output={tmp_path}/job.out",
         f"--chdir={tmp_path}", f"--wrap={sys.executable} {script} {tmp_path}"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    deadline = time.monotonic() + 400  # (sbatch --wait polls at up to 32 s intervals)
    while time.monotonic() < deadline:
        if not subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
            break
        time.sleep(1)
    job_out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert (tmp_path / "result.json").exists(), job_out[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert f"{job_id}.0" in result["steps"], result["steps"]  # the worker node's srun step
    # the step asked for its CPUs and memory (what a cluster that confines steps gives it)
    assert "cpu=2" in result["step"] and "mem=3000M" in result["step"], result["step"]
    assert result["status"].count("1 node_") == 2, result["status"]
    assert result["anonymous_rc"] != 0, result["anonymous"]  # Ray's token authentication is on
    assert "auth" in result["anonymous"].lower() or "token" in result["anonymous"].lower(), result[
        "anonymous"
    ]
    assert result["token_mode"] == "0o600" and not result["token_left"]
    token = str(tmp_path / "token")
    left = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("RAY_AUTH_TOKEN_PATH") == token:
                left.append(f"{p.pid} {p.name()}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    assert left == []  # the head, the worker node and their processes stopped with the block
