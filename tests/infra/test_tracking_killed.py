"""MLflow runs of processes that died: a job stopped by a signal ends its own run as KILLED; runs
left RUNNING by a SIGKILL (job or snakemake itself) are marked KILLED when the next invocation
starts, by host + PID (+ the PID's start time) on this host, by age for other hosts. The store is
a real MLflow SQLite database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlflow
import psutil
import pytest

from spader.infra.tracking import MlflowSettings, mark_dead_runs, process_tags, start_pipeline_run

HOST = socket.gethostname()


def _cfg(root: Path, **extra) -> dict:
    return {
        "mlflow": {
            "enabled": True,
            "tracking_uri": f"sqlite:///{root}/mlflow.db",
            "experiment": "killed-test",
            "artifact_root": str(root / "artifacts"),
            "state_dir": str(root / "state"),
            **extra,
        }
    }


def _client(root: Path) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")


def _dead_process() -> tuple[int, float]:
    """PID and start time of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = psutil.Process(proc.pid).create_time()
    proc.kill()
    proc.wait()
    return proc.pid, started


def test_dead_runs_are_marked_killed_at_the_next_start(tmp_path):
    cfg = _cfg(tmp_path, stale_run_hours=1)
    settings = MlflowSettings(cfg["mlflow"], tmp_path)
    client = _client(tmp_path)
    exp = client.create_experiment("killed-test", artifact_location=(tmp_path / "artifacts").as_uri())
    me = process_tags()
    dead_pid, dead_start = _dead_process()
    now_ms = int(time.time() * 1000)
    runs = {
        "dead_here": (
            {"spader.host": HOST, "spader.pid": str(dead_pid), "spader.pid_start": f"{dead_start:.2f}"},
            now_ms,
        ),
        "alive_here": (me, now_ms),
        "pid_reused": ({**me, "spader.pid_start": "1000.00"}, now_ms),  # our PID, someone else's start
        "old_elsewhere": ({"spader.host": "node7", "spader.pid": "1"}, now_ms - 2 * 3600_000),
        "recent_elsewhere": ({"spader.host": "node7", "spader.pid": "1"}, now_ms - 600_000),
        "old_untagged": ({}, now_ms - 5 * 3600_000),
    }
    ids = {}
    for name, (tags, start) in runs.items():
        ids[name] = client.create_run(exp, start_time=start, tags=tags, run_name=name).info.run_id
    finished = client.create_run(exp, tags=runs["dead_here"][0], run_name="finished").info.run_id
    client.set_terminated(finished, "FINISHED")

    start_pipeline_run(cfg, targets=["all"], root=tmp_path)

    status = {name: client.get_run(i).info.status for name, i in ids.items()}
    assert status == {
        "dead_here": "KILLED",
        "alive_here": "RUNNING",
        "pid_reused": "KILLED",
        "old_elsewhere": "KILLED",
        "recent_elsewhere": "RUNNING",
        "old_untagged": "KILLED",
    }
    assert client.get_run(finished).info.status == "FINISHED"
    reason = client.get_run(ids["dead_here"]).data.tags["spader.killed_reason"]
    assert reason == f"process {dead_pid} on {HOST} is gone"
    assert "mlflow.stale_run_hours" in client.get_run(ids["old_elsewhere"]).data.tags["spader.killed_reason"]
    # the new pipeline run carries what the next start needs to judge it
    pipeline = [r for r in client.search_runs([exp]) if r.data.tags.get("spader.kind") == "pipeline"]
    assert len(pipeline) == 1 and pipeline[0].data.tags["spader.pid"] == str(os.getpid())
    assert pipeline[0].data.tags["spader.host"] == HOST
    assert mark_dead_runs(settings) == []  # nothing left to mark


JOB = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from types import SimpleNamespace
    from spader.infra.glue import job

    root = Path(sys.argv[1])
    mlflow = {"enabled": True, "tracking_uri": f"sqlite:///{root}/mlflow.db", "experiment": "killed-test",
              "artifact_root": str(root / "artifacts"), "state_dir": str(root / "state")}
    smk = SimpleNamespace(rule="evaluate_policy", log=[str(root / "job.log")], input=[], output=[],
                          wildcards=SimpleNamespace(items=lambda: []), params=SimpleNamespace(items=lambda: []),
                          config={"mlflow": mlflow})
    with job(smk) as run:
        (root / "run_id").write_text(run.info.run_id)
        time.sleep(120)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_killed_job_run(tmp_path, signum):
    """A real job process (the workflow glue around a body that waits) is stopped by a signal and
    closes its own run as KILLED. (SIGKILL, which leaves the run RUNNING until the next start, is
    tested through snakemake in tests/robustness/test_workflow_faults.py.)"""
    proc = subprocess.Popen([sys.executable, "-c", JOB, str(tmp_path)])
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "run_id").exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "job.log").read_text()
            time.sleep(0.2)
        run_id = (tmp_path / "run_id").read_text()
        proc.send_signal(signum)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    client = _client(tmp_path)
    run = client.get_run(run_id)
    assert run.data.tags["spader.pid"] == str(proc.pid) and run.data.tags["spader.host"] == HOST
    if signum == signal.SIGKILL:
        assert run.info.status == "RUNNING"  # nobody could close it ...
        mark_dead_runs(MlflowSettings(_cfg(tmp_path)["mlflow"], tmp_path))
        run = client.get_run(run_id)
    assert run.info.status == "KILLED"  # ... until the next start; the others closed it themselves
