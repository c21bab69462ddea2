"""The train_policy job end to end on CPU, with a FAKE trainer in place of verl's GPU training
(tests/training/fake_verl_trainer.py) and everything else real: the job's MLflow run nested
under the pipeline run in a local SQLite store, verl's own Tracking attached to it, the retrieval
service started for the job on a real BM25 index, checkpoints in verl's layout, a failed attempt
and its resumed rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest

from spader.training.launch import Terminated, run_supervised

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

CHUNKS = [
    ("1001__0", "The Salt Orchard", "The Salt Orchard is a 1961 drama film directed by Ilse Varga."),
    ("1002__0", "Winter Quay", "Winter Quay is a 1964 film directed by Ilse Varga about dock workers."),
    ("2001__0", "Lake Ornes", "Lake Ornes is a glacial lake in Norway fed by the river Kvitelva."),
]


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory) -> Path:
    """A real Lucene index of three passages in the QAMPARI chunk format."""
    from spader.retrieval.index import build_bm25_index

    root = tmp_path_factory.mktemp("corpus")
    src = root / "wikipedia_chunks"
    src.mkdir()
    with open(src / "wikipedia_chunks_0.jsonl", "w") as f:
        for cid, title, text in CHUNKS:
            meta = {"title": title, "content": text, "chunk_id": cid, "page_id": cid.split("__")[0]}
            f.write(json.dumps({"id": cid, "contents": f"{title} {text}", "meta": meta}) + "\n")
    out = root / "index" / "bm25"
    build_bm25_index(src, out, threads=1)
    return out


def _namedlist(items: dict):
    """A Snakemake Namedlist as the job sees it (list values flattened under one name)."""
    from snakemake.iocontainers import Namedlist

    nl = Namedlist()
    for name, value in items.items():
        start = len(nl)
        if isinstance(value, list):
            nl.extend(value)
            nl._set_name(name, start, len(nl))
        else:
            nl.append(value)
            nl._set_name(name, start)
    return nl


def _git_init(path: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    for cmd in (["git", "init", "-q"], ["git", "commit", "-q", "--allow-empty", "-m", "scratch"]):
        subprocess.run(cmd, cwd=path, env=env, check=True)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def workflow_job(tmp_path, monkeypatch, paper_config, tiny_model, bm25_index):
    """A train_policy job in a scratch project: config, inputs and the snakemake object."""
    monkeypatch.chdir(tmp_path)
    commit = _git_init(tmp_path)
    config = json.loads(json.dumps(paper_config))
    # this machine stands in for a GPU node (a fake trainer): without the node's description the job
    # plans no time and checks no node (tests/training/test_node.py checks the node against a plan)
    del config["hardware"]
    config["mlflow"] = {
        "enabled": True,
        "tracking_uri": "sqlite:///results/mlflow/mlflow.db",
        "experiment": "spader-test",
        "artifact_root": "results/mlflow/artifacts",
        "state_dir": "results/mlflow",
    }
    config["backbones"]["tiny"] = {"model": "tiny:qwen3", "gpus": 1, "variants": ["spader"], "prompting": []}
    config["retrieval"]["reranker"]["model"] = None
    config["retrieval"]["service"]["startup_timeout_s"] = 120
    config["training"].update(save_freq=2, test_freq=2, train_batch_size=8, ppo_mini_batch_size=8,
                              ppo_micro_batch_size_per_gpu=1, rollout_n=2)  # fmt: skip
    data = Path("results/demo/data/verl")
    data.mkdir(parents=True)
    for split in ("train", "val"):
        pl.DataFrame(
            {
                "data_source": ["qampari"],
                "prompt": [[{"role": "user", "content": "Which films did Ilse Varga direct?"}]],
                "reward_model": [{"style": "rule", "ground_truth": {"target": ["The Salt Orchard"]}}],
            }
        ).write_parquet(data / f"{split}.parquet")

    from spader.infra.tracking import start_pipeline_run

    start_pipeline_run(config, targets=["results/tiny/f1.tsv"], root=tmp_path)
    verl_configs = [
        str(REPO / "config" / "verl" / "spader.yaml"),
        str(REPO / "config" / "verl" / "spader_base.yaml"),
    ]
    params = {
        "backbone": config["backbones"]["tiny"],
        "variant": config["variants"]["spader"],
        "training": config["training"],
        "retrieval": config["retrieval"],
        "workdir": "results/tiny/train/spader/work",
        "suite": "demo",
        "version": "0.1.0",
    }
    smk = type("Snakemake", (), {})()
    smk.config, smk.rule, smk.threads = config, "train_policy", 2
    smk.wildcards = _namedlist({"backbone": "tiny", "variant": "spader"})
    smk.params = _namedlist(params)
    smk.input = _namedlist(
        {
            "train": [str(data / "train.parquet")],  # as expand() gives it: a one-item list
            "val": str(data / "val.parquet"),
            "index": str(bm25_index),
            "model": str(tiny_model),
            "reranker": [],
            "verl_configs": verl_configs,
        }
    )
    smk.output = _namedlist({"final": "results/tiny/train/spader/final.json"})
    smk.log = _namedlist({})
    return smk, commit


def _attempt(smk, fsdp_actor):
    from spader.infra.tracking import job_run
    from spader.training.run import TrainJob, run_training

    with job_run(smk) as run:
        job = TrainJob.from_snakemake(smk)
        job.entry = (sys.executable, str(HERE / "fake_verl_trainer.py"))
        job.extra_overrides = ("trainer.total_training_steps=4",)
        return run.info.run_id, run_training(job, run=run, available_gpus=1)  # fake: no GPU on this machine


@pytest.mark.slow
def test_failed_attempt_then_resumed_rerun(workflow_job, fsdp_actor, monkeypatch, tmp_path):
    import mlflow

    from spader.training.node import tree_gib
    from spader.training.run import TrainingError

    smk, commit = workflow_job
    monkeypatch.setenv("FAKE_VERL_ACTOR", str(fsdp_actor))
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/results/mlflow/mlflow.db")
    pipeline_run = json.loads(Path("results/mlflow/pipeline_run.json").read_text())["run_id"]
    work = Path("results/tiny/train/spader/work")

    # attempt 1 crashes at step 4: the checkpoint of step 2 survives, the run is FAILED
    monkeypatch.setenv("FAKE_VERL_FAIL_AT_STEP", "4")
    with pytest.raises(TrainingError, match=r"verl exited with code 3.*rerun resumes from step 2"):
        _attempt(smk, fsdp_actor)
    monkeypatch.delenv("FAKE_VERL_FAIL_AT_STEP")
    assert not Path(smk.output.final).exists()
    assert (work / "checkpoints" / "global_step_2" / "data.pt").exists()
    (first,) = client.search_runs([client.get_experiment_by_name("spader-test").experiment_id],
                                  "tags.`snakemake.rule` = 'train_policy'")  # fmt: skip
    assert first.info.status == "FAILED"
    assert first.data.tags["mlflow.parentRunId"] == pipeline_run
    assert [m.step for m in client.get_metric_history(first.info.run_id, "actor/pg_loss")] == [1, 2, 3]

    # attempt 2 resumes from step 2 and finishes
    run_id, final = _attempt(smk, fsdp_actor)
    assert final == json.loads(Path(smk.output.final).read_text())
    assert (final["steps_done"], final["resumed_from_step"], final["attempt"]) == (4, 2, 2)
    # relocatable: paths relative to the working directory
    assert final["checkpoint"] == str(work / "checkpoints" / "global_step_4")
    assert final["actor_dir"] == str(work / "checkpoints" / "global_step_4" / "actor")
    # the launch records name the job's files relative to it too (verl itself got absolute paths)
    for record in ("launch.json", "resolved_config.yaml"):
        text = (work / record).read_text()
        assert str(
            Path.cwd().resolve()
        ) not in text and "=results/demo/data/verl/train.parquet" in text.replace(": ", "="), record
    assert final["metrics"]["actor/pg_loss"] == 0.25
    assert final["val_metrics"] == {"val-core/qampari/f1@1": 0.4, "step": 4}
    assert final["verl_version"] == "0.9.1" and final["mlflow_run_id"] == run_id
    assert len(final["config_hash"]) == 64 and final["index_hash"].startswith("dir:")

    second = client.get_run(run_id)
    assert second.info.status == "FINISHED"
    tags = second.data.tags
    assert tags["mlflow.parentRunId"] == pipeline_run
    assert tags["mlflow.source.git.commit"] == commit
    assert (tags["backbone"], tags["variant"]) == ("tiny", "spader")
    assert tags["data_hash"] == final["data_hash"] and tags["index_hash"] == final["index_hash"]
    assert tags["training.resume_step"] == "2"
    assert json.loads(tags["training.previous_runs"]) == [first.info.run_id]
    # one training across attempts: both runs carry the lineage of the attempt that started it
    assert tags["training.lineage"] == first.data.tags["training.lineage"] == first.info.run_id
    assert final["lineage"] == first.info.run_id
    params = second.data.params
    assert params["trainer/total_training_steps"] == "4"  # verl's logger: the resolved config
    assert params["algorithm/spader/beta"] == "4.0"
    assert params["snakemake/variant"] == "spader" and params["snakemake/resume_step"] == "2"
    assert [m.step for m in client.get_metric_history(run_id, "actor/pg_loss")] == [3, 4]
    assert [m.value for m in client.get_metric_history(run_id, "val-core/qampari/f1_at_1")] == [0.4]
    artifacts = {a.path for a in client.list_artifacts(run_id, "training")}
    assert {"training/final.json", "training/resolved_config.yaml", "training/launch.json",
            "training/tool_config.yaml", "training/attempt_002.jsonl"} <= artifacts  # fmt: skip

    history = [json.loads(line) for line in (work / "attempts.jsonl").read_text().splitlines()]
    assert [(h["event"], h["attempt"]) for h in history] == [
        ("start", 1),
        ("end", 1),
        ("start", 2),
        ("end", 2),
    ]
    assert history[1]["status"] == "failed" and history[3]["status"] == "finished"

    # it measured itself: the median step after the first (steps 2-4 take 2.5, 3.5, 4.5 s), each
    # phase, the checkpoint, the host; the plan of this job (a tiny model, no node description)
    # has its GPU peak, and says why it has no time
    measured, planned = final["measured"], final["planned"]
    assert measured["step_seconds"] == 3.5 and measured["run_hours"] == 3.5 * 4 / 3600
    assert measured["phase_seconds"] == {"generation": 3.25, "update_actor": 0.125}
    assert measured["checkpoint_gib"] == pytest.approx(tree_gib(final["checkpoint"]), abs=1e-6)
    assert measured["checkpoint_gib"] > 0
    assert measured["peak_host_gib"] > 0.05 and measured["peak_gpu_gib"] is None
    assert set(measured) - {"steps_measured"} <= set(planned), planned
    assert planned["step_seconds"] is None and "step_seconds" in planned["reason"], planned
    assert planned["peak_gpu_gib"] > 0 and planned["gpu_capacity_gib"] == 80, planned
    steps = [json.loads(line) for line in (work / "measured.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "step" in r] == [1, 2, 3, 4]  # once each, across the attempts
    assert [m.value for m in client.get_metric_history(run_id, "measured/step_seconds")] == [3.5]

    # what export_checkpoint merges (tests/training/test_export.py runs the merge)
    assert (Path(final["actor_dir"]) / "fsdp_config.json").is_file()


def test_sigterm_stops_the_whole_process_group(tmp_path):
    """A scheduler's SIGTERM (time limit, scancel) takes verl's process tree down with the job."""
    pid_file = tmp_path / "grandchild.pid"
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    with pytest.raises(Terminated, match="SIGTERM"):
        run_supervised(["sh", "-c", script], env={}, output=None, grace_s=5)
    assert time.monotonic() - t0 < 10
    grandchild = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(grandchild, 0)
            time.sleep(0.1)
    assert signal.getsignal(signal.SIGTERM) is before  # the job's own handler is back


def _when_step_logged(work: Path, step: int, action, timeout: float = 120.0) -> threading.Thread:
    """Run ``action`` in a thread once the job's metrics files hold ``step``."""
    from spader.training.checkpoints import read_step_metrics

    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (work / "metrics").is_dir() and step in read_step_metrics(work / "metrics"):
                action()
                return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_sigterm_stops_at_a_step_boundary_and_the_retry_resumes(
    workflow_job, fsdp_actor, monkeypatch, tmp_path
):
    """On a workstation a first SIGTERM stops training after the current step, with that step's
    checkpoint saved (a time limit's warning does the same); the job ends as resumable and an
    automatic retry resumes: every step is logged once, and MLflow shows one lineage."""
    import mlflow

    from spader.training.stop import StoppedForResume

    smk, _ = workflow_job
    monkeypatch.setenv("FAKE_VERL_ACTOR", str(fsdp_actor))
    monkeypatch.setenv("FAKE_VERL_STEP_S", "1.5")  # FAKE trainer: time to act mid-run
    work = Path("results/tiny/train/spader/work")
    _when_step_logged(work, 1, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(StoppedForResume) as stopped:
        _attempt(smk, fsdp_actor)
    step = stopped.value.step
    assert 1 <= step < 4  # stopped early, after the step that was running (not at save_freq 2 only)
    assert (work / "checkpoints" / f"global_step_{step}" / "data.pt").exists()
    assert not Path(smk.output.final).exists()
    history = [json.loads(line) for line in (work / "attempts.jsonl").read_text().splitlines()]
    assert history[-1]["status"] == "stopped" and history[-1]["checkpoint_step"] == step
    assert not (work / "stop_request").exists()  # a new attempt starts without it

    # the automatic retry (Snakemake's attempt 2) resumes from that step and finishes
    monkeypatch.setattr(smk, "resources", type("R", (), {"train_attempt": 2})(), raising=False)
    _, final = _attempt(smk, fsdp_actor)
    assert (final["steps_done"], final["resumed_from_step"]) == (4, step)
    logged = []
    for f in sorted((work / "metrics").glob("attempt_*.jsonl")):
        logged += [json.loads(line)["step"] for line in f.read_text().splitlines() if "actor/pg_loss" in line]
    assert logged == [1, 2, 3, 4][: len(logged)] and sorted(logged) == [1, 2, 3, 4]  # each step once
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/results/mlflow/mlflow.db")
    runs = client.search_runs(
        [client.get_experiment_by_name("spader-test").experiment_id],
        f"tags.`training.lineage` = '{final['lineage']}'",
    )
    assert len(runs) == 2 and {r.info.status for r in runs} == {"KILLED", "FINISHED"}
    steps = sorted(m.step for r in runs for m in client.get_metric_history(r.info.run_id, "actor/pg_loss"))
    assert steps == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_dead_retrieval_service_stops_training(workflow_job, fsdp_actor, monkeypatch):
    """verl's search tool turns failed searches into error observations and trains on; the job
    watches its service and stops verl, naming the service, once it died. (FAKE trainer.)"""
    import httpx
    import yaml

    from spader.training.run import TrainingError

    smk, _ = workflow_job
    monkeypatch.setenv("FAKE_VERL_ACTOR", str(fsdp_actor))
    monkeypatch.setenv("FAKE_VERL_STEP_S", "4")
    monkeypatch.setattr("spader.training.watch.SERVICE_CHECK_S", 0.5)
    work = Path("results/tiny/train/spader/work")

    killed = []

    def kill_service():
        tool = yaml.safe_load((work / "tool_config.yaml").read_text())
        url = tool["tools"][0]["config"]["retrieval_service_url"]
        os.kill(int(httpx.get(f"{url}/health", trust_env=False).json()["pid"]), signal.SIGKILL)
        killed.append(time.monotonic())

    _when_step_logged(work, 1, kill_service)
    with pytest.raises(
        TrainingError, match=r"the retrieval service at http://127\.0\.0\.1:\d+ \(pid \d+\) died"
    ):
        _attempt(smk, fsdp_actor)
    assert killed and time.monotonic() - killed[0] < 20
    from spader.training.checkpoints import read_step_metrics

    assert 4 not in read_step_metrics(work / "metrics")  # stopped mid-run, not after the last step
    history = [json.loads(line) for line in (work / "attempts.jsonl").read_text().splitlines()]
    assert history[-1]["status"] == "failed" and "retrieval service" in history[-1]["error"]
    assert not Path(smk.output.final).exists()


def test_an_automatic_retry_after_failures_is_refused(workflow_job, monkeypatch):
    """A training that failed for another reason than a stop is retried
    training.time_limit.failure_retries times at most, and the refusal costs nothing (it comes
    before the service or verl start); a rerun by hand (attempt 1) is never refused."""
    from spader.training.lineage import record_attempt
    from spader.training.run import TrainingError, claim_workdir

    smk, _ = workflow_job
    smk.config["training"]["time_limit"] = {
        **smk.config["training"].get("time_limit", {}),
        "failure_retries": 1,
    }
    work = Path("results/tiny/train/spader/work")
    work.mkdir(parents=True)
    for attempt in (1, 2):
        record_attempt(work, {"event": "start", "attempt": attempt, "resume_step": 0})
        record_attempt(work, {"event": "end", "attempt": attempt, "status": "failed", "error": "CUDA error"})
    monkeypatch.setattr(smk, "resources", type("R", (), {"train_attempt": 3})(), raising=False)
    from spader.training.run import TrainJob

    job = TrainJob.from_snakemake(smk)
    with pytest.raises(
        TrainingError, match=r"not retried automatically: the last 2 attempt\(s\) failed.*CUDA error"
    ):
        claim_workdir(job)
    history = [json.loads(line) for line in (work / "attempts.jsonl").read_text().splitlines()]
    assert history[-1]["event"] == "refused"
    assert not (work / "trainer.lock").exists()  # released
    # a stop or an interruption in between resets the count
    record_attempt(work, {"event": "start", "attempt": 3, "resume_step": 0})
    record_attempt(work, {"event": "end", "attempt": 3, "status": "stopped"})
    claim_workdir(job).release()
    # a rerun by hand always runs
    for _ in range(3):
        record_attempt(work, {"event": "end", "attempt": 9, "status": "failed"})
    job.attempt = 1
    claim_workdir(job).release()


def test_a_failure_before_verl_is_in_the_history_an_automatic_retry_reads(workflow_job):
    """SLURM records the same exit status for a stop and a failure, so the history decides: an attempt
    that fails before verl starts (here its preflight: a missing index) leaves its end in
    attempts.jsonl, and an automatic retry after more such failures than allowed is refused at once,
    naming the error (on the old code the failure left no record and every retry repeated it)."""
    from spader.training.preflight import PreflightError
    from spader.training.run import TrainingError, TrainJob, run_training

    smk, _ = workflow_job
    smk.config["training"]["time_limit"] = {
        **smk.config["training"].get("time_limit", {}),
        "failure_retries": 0,
    }
    job = TrainJob.from_snakemake(smk)
    job.index_dir = Path("results/demo/index/missing")
    with pytest.raises(PreflightError, match="training input index"):
        run_training(job, available_gpus=1)
    history = [json.loads(line) for line in (job.workdir / "attempts.jsonl").read_text().splitlines()]
    assert [(h["event"], h["status"], h["phase"]) for h in history] == [("end", "failed", "preflight")]
    assert "PreflightError: training input index" in history[0]["error"]
    job.attempt = 2  # Snakemake's retry
    with pytest.raises(TrainingError, match=r"not retried automatically.*training input index"):
        run_training(job, available_gpus=1)
    assert not (job.workdir / "trainer.lock").exists()
