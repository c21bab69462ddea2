"""MLflow tracking for the workflow: one parent run per Snakemake invocation, one nested run per job.

The Snakefile's ``onstart`` hook calls :func:`start_pipeline_run`, which creates the experiment
(with an absolute artifact root, so laptop and cluster jobs agree) and the parent run, and writes
``<mlflow.state_dir>/pipeline_run.json``. Every job script wraps its work in :func:`job_run`,
which opens a child run under that parent with params, tags (git commit, config hash, input
fingerprints, rule, wildcards, SLURM job id) and the job's outputs, and marks it FAILED when the
job raises (KILLED when a stop signal ended it). ``onsuccess``/``onerror`` close the parent with
:func:`end_pipeline_run`.

Runs of processes that died without closing them (SIGKILL, a node crash) would stay RUNNING for
ever. Every run is tagged with the host, PID and PID start time of its process, and each
``onstart`` first marks as KILLED the RUNNING runs whose process on this host is gone (the start
time guards against a reused PID), and those of other hosts (cluster nodes, whose processes
cannot be checked from here) that are older than ``mlflow.stale_run_hours``
(:func:`mark_dead_runs`).

Tracking settings are the one part of the config that jobs read from ``snakemake.config`` rather
than from ``params``: where runs are recorded does not change any result, so editing it must not
rerun the pipeline.

The store follows its working tree. MLflow records artifact locations as absolute paths (the
experiment's, and each run's), so a tree copied or moved elsewhere would go on writing its jobs'
artifacts into the tree it came from. When the store lives in the tree (a relative
``mlflow.tracking_uri``, the default) and its locations name another tree's artifact directory, the
first start in the new place rewrites them to this tree's (:func:`follow_tree`): a copy then writes
only into itself, and finds the artifacts copied with it. A store outside the tree (an absolute
path, shared by several trees, or a server) is left as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from spader import __version__
from spader.config.model import MlflowConfig
from spader.infra.atomic import atomic_write

log = logging.getLogger(__name__)

__all__ = [
    "MlflowSettings",
    "TrackingStoreError",
    "check_store",
    "config_hash",
    "end_pipeline_run",
    "fingerprint",
    "flatten_params",
    "follow_tree",
    "git_state",
    "job_run",
    "log_dict",
    "log_metrics",
    "mark_dead_runs",
    "process_tags",
    "start_pipeline_run",
]

# Files up to this size are hashed whole; larger ones by size + first and last chunk.
_FULL_HASH_LIMIT = 64 * 1024**2
_PARTIAL_CHUNK = 8 * 1024**2
_MAX_ARTIFACT_BYTES = 16 * 1024**2
_MAX_PARAM_CHARS = 6000


class MlflowSettings:
    """Resolved tracking settings (the ``mlflow`` section), paths made absolute against ``root``."""

    def __init__(self, cfg: MlflowConfig | Mapping[str, Any], root: str | os.PathLike = "."):
        if not isinstance(cfg, MlflowConfig):
            cfg = MlflowConfig.model_validate(dict(cfg))
        root = Path(root).resolve()
        uri = cfg.tracking_uri
        self.database: Path | None = None  # the SQLite file, when the store is one
        self.store_in_tree = False  # a relative SQLite path: the store moves with the working tree
        if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
            db = root / uri[len("sqlite:///") :]
            db.parent.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{db}"
            self.database, self.store_in_tree = db, True
        elif uri.startswith("sqlite:////"):
            self.database = Path(uri[len("sqlite:///") :])
        self.tracking_uri = uri
        self.experiment = cfg.experiment
        self.artifact_root = (root / cfg.artifact_root).resolve()
        self.state_dir = (root / cfg.state_dir).resolve()
        self.enabled = cfg.enabled
        self.stale_run_hours = cfg.stale_run_hours

    @property
    def pipeline_file(self) -> Path:
        return self.state_dir / "pipeline_run.json"


def _active_mlflow():
    """The mlflow module when the job's run is active (tracking on), else None."""
    mlflow = sys.modules.get("mlflow")  # a run can only be active once mlflow is imported
    return mlflow if mlflow is not None and mlflow.active_run() is not None else None


def log_metrics(metrics: Mapping[str, float], *, series: Mapping[str, Sequence[float]] | None = None) -> None:
    """Log ``metrics``, and each of ``series`` as one value per step (0, 1, ...), to the job's
    MLflow run when one is active (tracking on); else nothing. The workflow's scripts log through
    this, never through mlflow itself."""
    mlflow = _active_mlflow()
    if mlflow is None:
        return
    mlflow.log_metrics(dict(metrics))
    for name, values in (series or {}).items():
        for step, value in enumerate(values):
            mlflow.log_metric(name, value, step=step)


def log_dict(data: Mapping[str, Any], artifact: str) -> None:
    """Log ``data`` as the JSON artifact ``artifact`` of the job's active MLflow run (else nothing)."""
    mlflow = _active_mlflow()
    if mlflow is not None:
        mlflow.log_dict(dict(data), artifact)


def _mlflow():
    import mlflow  # heavy import, only when tracking is used

    return mlflow


class TrackingStoreError(ValueError):
    """The MLflow store cannot be used as it is; the message names it and what is wrong."""


_SQLITE_HEADER = b"SQLite format 3\x00"
_CHECKED_STORES: set[tuple[str, int, int]] = set()


def _store_problem(db: Path) -> str | None:
    """What is wrong with the SQLite MLflow store ``db`` (None: nothing SQLite or a look at its
    tables finds), read only."""
    if not db.is_file():
        return "is not a file"
    with open(db, "rb") as f:
        head = f.read(len(_SQLITE_HEADER))
    if not head:
        return "is empty (cut short?)"
    if head != _SQLITE_HEADER:
        return "is not a SQLite database (replaced by another file?)"
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=60)) as con:
            check = [row[0] for row in con.execute("PRAGMA quick_check")]
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return None  # another process writes it at length: MLflow waits its turn
        return f"is damaged: SQLite says {exc} (cut short or overwritten?)"
    except sqlite3.DatabaseError as exc:
        return f"is damaged: SQLite says {exc} (cut short or overwritten?)"
    if check != ["ok"]:
        return f"is damaged: SQLite's check finds {'; '.join(check[:3])} (cut short or overwritten?)"
    if not {"experiments", "runs"} <= tables:
        return "is a SQLite database without MLflow's tables (replaced by another database?)"
    return None


def check_store(settings: MlflowSettings) -> None:
    """Refuse an MLflow store that is damaged or is not one, naming it (MLflow's own errors are
    tracebacks of dozens of frames that do not name the file); once per process and file state.

    Raises:
        TrackingStoreError: the store's file is cut short, damaged, not SQLite or not MLflow's.
    """
    db = settings.database
    if db is None or not os.path.lexists(db):
        return  # a server, or a store MLflow creates
    stat = db.stat() if db.exists() else None
    key = (str(db), stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)
    if key in _CHECKED_STORES:
        return
    problem = _store_problem(db)
    if problem is not None:
        raise TrackingStoreError(
            f"MLflow store {db} {problem}: move it aside (a new store is started) or restore it, or "
            "set mlflow.enabled: false"
        )
    _CHECKED_STORES.add(key)


def _experiment_id(settings: MlflowSettings) -> str:
    check_store(settings)
    mlflow = _mlflow()
    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    exp = client.get_experiment_by_name(settings.experiment)
    if exp is not None:
        follow_tree(settings, exp.artifact_location)
        return exp.experiment_id
    settings.artifact_root.mkdir(parents=True, exist_ok=True)
    try:
        return client.create_experiment(
            settings.experiment, artifact_location=settings.artifact_root.as_uri()
        )
    except mlflow.exceptions.MlflowException:  # created concurrently by another job
        exp = client.get_experiment_by_name(settings.experiment)
        if exp is None:
            raise
        return exp.experiment_id


# Columns of MLflow's SQLite schema that hold artifact locations (a run's, an experiment's, a
# logged model's); a table or column a version lacks is skipped.
_LOCATION_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
)


def follow_tree(settings: MlflowSettings, recorded: str) -> bool:
    """Rewrite the artifact locations of a store that was copied or moved with its working tree.

    Args:
        settings: the tracking settings of this tree.
        recorded: the experiment's artifact location as the store records it.
    Returns:
        Whether locations were rewritten: only for a store kept in the tree (a relative SQLite
        path) whose recorded location is not this tree's artifact directory. Every location under
        the recorded one (the experiment's, its runs', its logged models') is moved to the same
        place under this tree's, in one transaction.
    """
    expected = settings.artifact_root.as_uri()
    if not settings.store_in_tree or settings.database is None or recorded.rstrip("/") == expected:
        return False
    old = recorded.rstrip("/")
    with contextlib.closing(sqlite3.connect(settings.database, timeout=60)) as con, con:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, column in _LOCATION_COLUMNS:
            if table not in tables or column not in {
                r[1] for r in con.execute(f"PRAGMA table_info({table})")
            }:
                continue
            con.execute(
                # table and column names come from _LOCATION_COLUMNS, values are parameters
                f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                f"WHERE {column} = ? OR substr({column}, 1, ?) = ?",
                (expected, len(old) + 1, old, len(old) + 1, old + "/"),
            )
    log.warning(
        "MLflow store %s was copied or moved with its working tree: its artifact locations now name %s "
        "(they named %s)",
        settings.database,
        expected,
        recorded,
    )
    return True


def git_state(root: str | os.PathLike = ".") -> dict[str, str]:
    """``{"commit": sha, "dirty": "true"|"false"}``, or ``{}`` outside a git checkout."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"commit": sha, "dirty": "true" if dirty else "false"}


def _hash_file(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= _FULL_HASH_LIMIT:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return h.hexdigest()
        h.update(str(size).encode())
        h.update(f.read(_PARTIAL_CHUNK))
        f.seek(size - _PARTIAL_CHUNK)
        h.update(f.read(_PARTIAL_CHUNK))
    return "partial:" + h.hexdigest()


def fingerprint(path: str | os.PathLike) -> str:
    """Content fingerprint of a file or directory (sha256; large files by size + head + tail,
    marked ``partial:``; directories over sorted relative paths and file fingerprints)."""
    p = Path(path)
    if p.is_file():
        return _hash_file(p)
    if p.is_dir():
        h = hashlib.sha256()
        for f in sorted(x for x in p.rglob("*") if x.is_file()):
            h.update(str(f.relative_to(p)).encode())
            h.update(_hash_file(f).encode())
        return "dir:" + h.hexdigest()
    return "missing"


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def config_hash(params: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a job's params (what Snakemake's params trigger sees)."""
    blob = json.dumps(_jsonable(params), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested params to ``a/b/c`` keys with string values (lists as JSON), MLflow-sized."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, prefix=f"{name}/"))
        else:
            text = value if isinstance(value, str) else json.dumps(_jsonable(value), sort_keys=True)
            out[name] = text[:_MAX_PARAM_CHARS]
    return out


def _start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_tags() -> dict[str, str]:
    """Tags that identify this process: ``spader.host``, ``spader.pid``, ``spader.pid_start``."""
    pid = os.getpid()
    return {
        "spader.host": socket.gethostname(),
        "spader.pid": str(pid),
        "spader.pid_start": f"{_start_time(pid) or 0.0:.2f}",
    }


def _dead_reason(tags: Mapping[str, str], start_ms: int, now: float, max_age_s: float) -> str | None:
    """Why a RUNNING run is known to be dead, or None while it may be alive."""
    host, pid = tags.get("spader.host"), tags.get("spader.pid", "")
    if host == socket.gethostname() and pid.isdigit():
        started = _start_time(int(pid))
        if started is None:
            return f"process {pid} on {host} is gone"
        recorded = float(tags.get("spader.pid_start") or 0.0)
        if recorded and abs(started - recorded) > 2.0:
            return f"process {pid} on {host} is gone (the PID now belongs to a later process)"
        return None
    age = now - start_ms / 1000.0
    if age > max_age_s:
        where = f"on {host}" if host else "of unknown host"
        return f"run {where} still RUNNING after {age / 3600:.0f} h (mlflow.stale_run_hours)"
    return None


def mark_dead_runs(settings: MlflowSettings, *, now: float | None = None) -> list[str]:
    """Mark RUNNING runs whose process died as KILLED (see the module docstring).

    Args:
        settings: the tracking settings (experiment, ``stale_run_hours``).
        now: the current time in seconds since the epoch (tests).
    Returns:
        The ids of the runs marked KILLED; each gets a ``spader.killed_reason`` tag.
    """
    mlflow = _mlflow()
    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    exp = client.get_experiment_by_name(settings.experiment)
    if exp is None:
        return []
    now = time.time() if now is None else now
    marked, token = [], None
    while True:
        page = client.search_runs(
            [exp.experiment_id],
            filter_string="attributes.status = 'RUNNING'",
            max_results=1000,
            page_token=token,
        )
        for run in page:
            reason = _dead_reason(run.data.tags, run.info.start_time, now, settings.stale_run_hours * 3600)
            if reason is None:
                continue
            client.set_tag(run.info.run_id, "spader.killed_reason", reason)
            client.set_terminated(run.info.run_id, status="KILLED")
            marked.append(run.info.run_id)
            log.warning("MLflow run %s (%s) marked KILLED: %s", run.info.run_id, run.info.run_name, reason)
        token = page.token
        if not token:
            return marked


def start_pipeline_run(
    config: Mapping[str, Any],
    targets: list[str],
    root: str | os.PathLike = ".",
    code_root: str | os.PathLike | None = None,
) -> None:
    """Mark runs of dead processes KILLED, then create the parent run of this Snakemake invocation
    and record it for the jobs.

    Args:
        config: the workflow config. targets: the invocation's targets.
        root: the working directory (relative MLflow paths resolve against it).
        code_root: a directory of the workflow's repository, whose git commit is recorded
            (default: ``root``).
    """
    settings = MlflowSettings(config["mlflow"], root)
    if not settings.enabled:
        return
    check_store(settings)
    mlflow = _mlflow()
    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    exp_id = _experiment_id(settings)
    mark_dead_runs(settings)
    tags = {
        "spader.version": __version__,
        "spader.kind": "pipeline",
        "spader.targets": json.dumps(targets),
        **process_tags(),
    }
    git = git_state(code_root if code_root is not None else root)
    if git:
        tags["mlflow.source.git.commit"] = git["commit"]
        tags["git.dirty"] = git["dirty"]
    run = client.create_run(exp_id, run_name="pipeline", tags=tags)
    atomic_write(settings.pipeline_file, json.dumps({"experiment_id": exp_id, "run_id": run.info.run_id}))
    log.info("MLflow pipeline run %s in %s", run.info.run_id, settings.tracking_uri)


def end_pipeline_run(config: Mapping[str, Any], status: str, root: str | os.PathLike = ".") -> None:
    """Close the parent run with ``FINISHED`` or ``FAILED``."""
    settings = MlflowSettings(config["mlflow"], root)
    if not settings.enabled or not settings.pipeline_file.exists():
        return
    check_store(settings)
    run_id = json.loads(settings.pipeline_file.read_text())["run_id"]
    _mlflow().MlflowClient(tracking_uri=settings.tracking_uri).set_terminated(run_id, status=status)


def _parent_run_id(settings: MlflowSettings) -> str | None:
    if settings.pipeline_file.exists():
        return json.loads(settings.pipeline_file.read_text()).get("run_id")
    return None


def _named_items(io) -> list[tuple[str, str]]:
    """``(name, path)`` pairs of a Snakemake input/output container (positional ones as ``i``)."""
    named = dict(io.items()) if hasattr(io, "items") else {}
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, value in named.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for i, v in enumerate(values):
            key = name if len(values) == 1 else f"{name}.{i}"
            pairs.append((key, str(v)))
            seen.add(str(v))
    for i, v in enumerate(io):
        if str(v) not in seen:
            pairs.append((str(i), str(v)))
    return pairs


@contextlib.contextmanager
def job_run(smk, *, extra_tags: Mapping[str, str] | None = None) -> Iterator[Any]:
    """Track one Snakemake job as an MLflow run nested under the pipeline run.

    Yields the active ``mlflow.ActiveRun`` (or ``None`` when tracking is disabled), so the job
    can log metrics. The run is KILLED when a stop signal ends the body (:class:`Terminated`,
    ``KeyboardInterrupt``), FAILED when it raises anything else (the exception propagates).
    """
    settings = MlflowSettings(smk.config["mlflow"], ".")
    if not settings.enabled:
        yield None
        return
    check_store(settings)
    mlflow = _mlflow()
    mlflow.set_tracking_uri(settings.tracking_uri)
    exp_id = _experiment_id(settings)
    wildcards = dict(smk.wildcards.items())
    run_name = "-".join([smk.rule, *(str(v) for v in wildcards.values())])
    params = dict(smk.params.items())
    tags = {
        "snakemake.rule": smk.rule,
        "snakemake.wildcards": json.dumps(wildcards, sort_keys=True),
        "spader.version": __version__,
        "spader.kind": "job",
        "config_hash": config_hash(params),
        **process_tags(),
    }
    # the commit of the workflow's code: git finds the repository from the script's directory
    git = git_state(getattr(smk, "scriptdir", None) or ".")
    if git:
        tags["mlflow.source.git.commit"] = git["commit"]
        tags["git.dirty"] = git["dirty"]
    if os.environ.get("SLURM_JOB_ID"):
        tags["slurm.job_id"] = os.environ["SLURM_JOB_ID"]
    for name, path in _named_items(smk.input):
        tags[f"input.{name}.path"] = path
        tags[f"input.{name}.sha256"] = fingerprint(path)
    tags.update(extra_tags or {})

    run = mlflow.start_run(
        experiment_id=exp_id, run_name=run_name, parent_run_id=_parent_run_id(settings), tags=tags
    )
    try:
        mlflow.log_params(flatten_params(params, prefix="params/"))
        yield run
    except BaseException as exc:
        from spader.infra.procs import Terminated

        mlflow.end_run(status="KILLED" if isinstance(exc, (Terminated, KeyboardInterrupt)) else "FAILED")
        raise
    try:
        for name, path in _named_items(smk.output):
            p = Path(path)
            mlflow.set_tag(f"output.{name}.path", str(p.resolve()))
            if p.is_file() and p.stat().st_size <= _MAX_ARTIFACT_BYTES:
                mlflow.log_artifact(str(p), artifact_path="outputs")
    except Exception:  # the job's work is done; losing an artifact must not delete its outputs
        log.exception("could not log outputs of %s to MLflow", run_name)
    finally:
        mlflow.end_run(status="FINISHED")
