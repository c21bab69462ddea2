"""MLflow lineage of a training job.

The job's run is the nested run :func:`spader.infra.tracking.job_run` opens under the pipeline run.
verl's own MLflow logger attaches to it (``MLFLOW_RUN_ID``), so verl logs the resolved config as
params (``data/...``, ``trainer/...``, flattened with ``/``) and every step's metrics into that
run. verl ends the run when it finishes; the job then keeps logging to it by run id (artifacts,
final metrics) and :func:`~spader.infra.tracking.job_run` sets the final status (FAILED when the job
raised).

The attempts of one training (a first run, then every rerun that resumed its checkpoints, after a
time limit, a stop or a failure) are one lineage: each attempt's run carries the tag
``training.lineage``, the run id of the attempt that started from scratch (:func:`lineage_of`),
with ``training.attempt`` and ``training.previous_runs``; ``attempts.jsonl`` in the work
directory keeps the same history, which also decides whether an automatic retry may run
(:func:`retry_refusal`).

The job's own params are logged under ``snakemake/`` (the job's params already sit under
``params/``): MLflow refuses to change a param value, and verl silently drops MLflow when its
param logging fails, so no key may collide with one verl logs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spader.infra.tracking import flatten_params

log = logging.getLogger(__name__)

__all__ = [
    "RESUMABLE",
    "RunLink",
    "lineage_of",
    "previous_attempts",
    "record_attempt",
    "retry_refusal",
    "verl_tracking_env",
]

#: End statuses after which a retry simply resumes: stopped at a step boundary on request, or
#: ended at once by a stop signal, a time limit or a lost workflow (an attempt killed outright has
#: no end record at all, and counts the same).
RESUMABLE = ("stopped", "interrupted")

_ATTEMPTS_FILE = "attempts.jsonl"


def verl_tracking_env(run_id: str | None, tracking_uri: str | None) -> dict[str, str]:
    """Environment that makes verl's MLflow logger attach to ``run_id`` in ``tracking_uri``.

    Empty when tracking is off: verl then gets no ``mlflow`` logger at all (its default store, a
    SQLite file in the node's temporary directory, would be lost on a cluster node).
    """
    if not run_id or not tracking_uri:
        return {}
    return {"MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_RUN_ID": run_id}


class RunLink:
    """Writes to one MLflow run by id, whether or not it is the active run of this process.

    Args:
        run_id: the job's run (None: tracking is off and every method does nothing).
        tracking_uri: the store holding it.
    """

    def __init__(self, run_id: str | None, tracking_uri: str | None):
        self.run_id = run_id
        self.tracking_uri = tracking_uri
        self._client = None
        if run_id and tracking_uri:
            import mlflow

            self._client = mlflow.MlflowClient(tracking_uri=tracking_uri)

    @classmethod
    def from_active_run(cls, run, tracking_uri: str | None) -> RunLink:
        """Link to the run yielded by :func:`spader.infra.glue.job` (None when tracking is off)."""
        return cls(run.info.run_id if run is not None else None, tracking_uri)

    @property
    def enabled(self) -> bool:
        return self._client is not None

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self._client is None:
            return
        for key, value in tags.items():
            self._client.set_tag(self.run_id, key, str(value))

    def log_params(self, params: Mapping[str, Any], prefix: str = "snakemake/") -> None:
        """Log ``params`` flattened under ``prefix`` (never colliding with verl's own keys)."""
        if self._client is None:
            return
        from mlflow.entities import Param

        flat = flatten_params(params, prefix=prefix)
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), 100):  # MLflow's per-request limit
            self._client.log_batch(self.run_id, params=items[i : i + 100])

    def log_artifacts(self, paths: Iterable[str | os.PathLike], artifact_path: str = "training") -> None:
        """Log existing files as artifacts (missing ones are reported, not fatal)."""
        if self._client is None:
            return
        for p in paths:
            p = Path(p)
            if p.is_file():
                self._client.log_artifact(self.run_id, str(p), artifact_path=artifact_path)
            else:
                log.warning("artifact %s does not exist; not logged", p)


def record_attempt(workdir: str | os.PathLike, entry: Mapping[str, Any]) -> None:
    """Append one attempt (run id, resume step, outcome) to the work directory's history."""
    path = Path(workdir) / _ATTEMPTS_FILE
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(dict(entry), sort_keys=True) + "\n")


def previous_attempts(workdir: str | os.PathLike) -> list[dict]:
    """Earlier attempts of this job (a rerun after a failure resumes their checkpoints)."""
    path = Path(workdir) / _ATTEMPTS_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            log.warning("%s: skipped an unreadable line", path)
    return out


def lineage_of(history: list[dict], *, resume_step: int, run_id: str | None) -> str | None:
    """The lineage of a new attempt: its own run id when it starts from scratch, else the lineage
    of the latest earlier attempt (that of the first attempt that recorded one)."""
    if resume_step == 0:
        return run_id
    for entry in reversed(history):
        if entry.get("event") == "start" and entry.get("lineage"):
            return entry["lineage"]
    return run_id


def retry_refusal(history: list[dict], *, attempt: int, failure_retries: int) -> str | None:
    """Why an automatic retry must not run, or None.

    A first run or a rerun by hand (``attempt`` 1) always runs. An automatic retry (Snakemake's
    ``attempt`` > 1, after ``retries:``) runs when the previous attempt stopped or was interrupted
    (:data:`RESUMABLE`, or has no end record: killed outright); after attempts that *failed*, only
    while the failures in a row (refused retries not counted) are at most ``failure_retries``. So a
    training that keeps failing for another reason than its time limit is not retried again and
    again, each retry costing an allocation's worth of GPU start-up.
    """
    if attempt <= 1:
        return None
    ends: list[dict | None] = []  # per attempt, its end record (None: killed outright)
    for entry in history:
        if entry.get("event") == "start":
            ends.append(None)
        elif entry.get("event") == "end":
            if ends and ends[-1] is None:
                ends[-1] = entry
            else:
                ends.append(entry)
    failures = 0
    last_error = None
    for end in reversed(ends):
        if end is None or end.get("status") != "failed":
            break
        failures += 1
        last_error = last_error or end.get("error")
    if failures > failure_retries:
        return (
            f"not retried automatically: the last {failures} attempt(s) failed for another reason than a "
            f"stop or a time limit (training.time_limit.failure_retries is {failure_retries}); last error: "
            f"{last_error}. Fix the cause and run the workflow again: the training resumes from its newest "
            "checkpoint"
        )
    return None
