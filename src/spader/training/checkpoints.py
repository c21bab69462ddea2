"""verl checkpoints in a training work directory: which one a rerun resumes from, and the
per-step metrics of every attempt.

Layout written by verl 0.9.1 under ``trainer.default_local_dir`` (``PPOTrainer._save_checkpoint``)::

    latest_checkpointed_iteration.txt      # "N", written last, after a complete save
    global_step_N/actor/model_world_size_W_rank_R.pt  (one per rank), optim_..., extra_state_...,
                 actor/fsdp_config.json, actor/huggingface/ (config + tokenizer)
    global_step_N/critic/...               # PPO only
    global_step_N/data.pt                  # dataloader state, saved after actor and critic

verl's own ``resume_mode=auto`` trusts the tracker file blindly: a tracker that names a
directory which is gone makes it train from scratch, and a save interrupted by a kill leaves
a ``global_step_N`` that it would never consider. :func:`latest_checkpoint` instead returns the
newest *complete* checkpoint and the job passes it to verl explicitly
(``trainer.resume_mode=resume_path``), so the step a run resumes from is decided and logged here.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spader.config.model import MlflowConfig
from spader.integrations.verl.hydra import hydra_value

log = logging.getLogger(__name__)

__all__ = [
    "TRACKER_FILE",
    "Checkpoint",
    "complete_checkpoints",
    "latest_checkpoint",
    "new_metrics_file",
    "portable_path",
    "portable_text",
    "prune_checkpoints",
    "read_step_metrics",
    "resume_overrides",
    "retire_checkpoints",
    "training_steps",
]

TRACKER_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_MODEL_SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


@dataclass(frozen=True)
class Checkpoint:
    """One complete verl checkpoint: ``step`` and its ``global_step_<step>`` directory."""

    step: int
    path: Path

    @property
    def actor_dir(self) -> Path:
        """The FSDP actor shards that ``export_checkpoint`` merges into a Hugging Face model."""
        return self.path / "actor"


def _incomplete_reason(step_dir: Path) -> str | None:
    """Why ``step_dir`` cannot be resumed from, or None when it is complete."""
    if not (step_dir / "data.pt").is_file():
        return "no data.pt (verl writes it after the actor and critic shards)"
    actor = step_dir / "actor"
    config = actor / "fsdp_config.json"
    if not config.is_file():
        return "no actor/fsdp_config.json"
    try:
        world_size = int(json.loads(config.read_text())["world_size"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable actor/fsdp_config.json ({exc})"
    ranks = set()
    for f in actor.iterdir():
        m = _MODEL_SHARD.match(f.name)
        if m and int(m.group(1)) == world_size:
            ranks.add(int(m.group(2)))
    missing = sorted(set(range(world_size)) - ranks)
    if missing:
        return f"actor model shards missing for ranks {missing} of world size {world_size}"
    return None


def complete_checkpoints(ckpt_dir: str | os.PathLike) -> list[Checkpoint]:
    """Every complete ``global_step_N`` under ``ckpt_dir``, oldest first.

    Incomplete ones (a save interrupted by a kill) are skipped with a warning naming what is
    missing.
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = []
    for d in ckpt_dir.iterdir():
        m = _STEP_DIR.match(d.name)
        if not (m and d.is_dir()):
            continue
        reason = _incomplete_reason(d)
        if reason:
            log.warning("ignoring incomplete checkpoint %s: %s", d, reason)
            continue
        found.append(Checkpoint(int(m.group(1)), d))
    return sorted(found, key=lambda c: c.step)


def _tracked_step(ckpt_dir: Path) -> int | None:
    tracker = ckpt_dir / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        log.warning("%s holds %r, not a step number; ignoring it", tracker, text)
        return None
    return int(text)


def latest_checkpoint(ckpt_dir: str | os.PathLike) -> Checkpoint | None:
    """The checkpoint a rerun should resume from: the newest complete one, or None.

    verl writes the tracker file after a save completes, so normally the tracker names the
    newest complete checkpoint. When they disagree (tracker missing, naming a deleted or
    incomplete directory, or an older step than a complete newer save) the newest complete
    checkpoint wins and the disagreement is logged.

    Args:
        ckpt_dir: verl's ``trainer.default_local_dir``.

    Returns:
        The checkpoint, or None when there is nothing to resume from.
    """
    ckpt_dir = Path(ckpt_dir)
    complete = complete_checkpoints(ckpt_dir)
    tracked = _tracked_step(ckpt_dir)
    if not complete:
        if tracked is not None:
            log.warning(
                "%s names step %d but no complete checkpoint exists", ckpt_dir / TRACKER_FILE, tracked
            )
        return None
    latest = complete[-1]
    if tracked != latest.step:
        log.warning(
            "%s names step %s; resuming from the newest complete checkpoint, step %d",
            ckpt_dir / TRACKER_FILE,
            tracked,
            latest.step,
        )
    return latest


def prune_checkpoints(ckpt_dir: str | os.PathLike, keep: int | None) -> list[Path]:
    """Delete the checkpoints an attempt's retention would have deleted, before a new attempt.

    verl keeps ``trainer.max_actor_ckpt_to_keep`` checkpoints by deleting the oldest of the ones
    *this process* saved, so every resumed attempt leaves its predecessors' checkpoints behind
    (hundreds of GB each at paper scale). At the start of an attempt this keeps the newest
    ``keep`` complete checkpoints and deletes older step directories, complete or not (a step
    directory whose actor verl already deleted holds only its data loader state). Step
    directories newer than the newest complete checkpoint (a save cut short) are left to verl,
    which writes that step again.

    Args:
        ckpt_dir: verl's ``trainer.default_local_dir``.
        keep: complete checkpoints to keep (None: all).
    Returns:
        The deleted directories.
    """
    import shutil

    if keep is None:
        return []
    complete = complete_checkpoints(ckpt_dir)
    if not complete:
        return []
    kept = {c.step for c in complete[-int(keep) :]}
    oldest_kept = min(kept)
    removed = []
    for d in sorted(Path(ckpt_dir).iterdir()):
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir() and int(m.group(1)) < oldest_kept:
            shutil.rmtree(d)
            removed.append(d)
    if removed:
        log.info(
            "deleted %d checkpoint(s) older than the %d kept (%s): %s",
            len(removed),
            int(keep),
            ", ".join(f"step {s}" for s in sorted(kept)),
            ", ".join(d.name for d in removed),
        )
    return removed


def retire_checkpoints(final_checkpoint: str | os.PathLike) -> list[Path]:
    """Delete a finished training's intermediate checkpoints once its export is written: every
    ``global_step_N`` beside ``final_checkpoint`` with N below its step. The final one stays (a
    re-export reads it); a step directory newer than it is left alone with a warning.

    Guarded: ``final_checkpoint`` must be a complete ``global_step_N`` inside a ``checkpoints``
    directory (the training's work directory), else nothing is deleted.

    Returns:
        The deleted directories.
    """
    import shutil

    final = Path(final_checkpoint)
    m = _STEP_DIR.match(final.name)
    if m is None or final.parent.name != "checkpoints" or _incomplete_reason(final) is not None:
        log.warning(
            "not deleting checkpoints beside %s: not a complete global_step_N under checkpoints/", final
        )
        return []
    step = int(m.group(1))
    removed, freed = [], 0
    for d in sorted(final.parent.iterdir()):
        other = _STEP_DIR.match(d.name)
        if not (other and d.is_dir()) or d == final:
            continue
        if int(other.group(1)) > step:
            log.warning("leaving %s, newer than the final checkpoint (step %d)", d, step)
            continue
        freed += sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(d)
        removed.append(d)
    if removed:
        log.info(
            "deleted %d intermediate checkpoint(s) (%s, %.1f GiB) now that the export is written; kept the final "
            "one, step %d (training.keep_checkpoints: true keeps them)",
            len(removed), ", ".join(d.name for d in removed), freed / (1 << 30), step,
        )  # fmt: skip
    return removed


def resume_overrides(checkpoint: Checkpoint | None) -> list[str]:
    """verl overrides that resume from ``checkpoint`` (absolute path), or start from scratch.

    Starting from scratch uses ``resume_mode=disable`` rather than ``auto``, so that a stray
    tracker file can never make verl load a checkpoint this module rejected.
    """
    if checkpoint is None:
        return ["trainer.resume_mode=disable"]
    return [
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={hydra_value(os.path.abspath(checkpoint.path))}",
    ]


def portable_path(path: str | os.PathLike) -> str:
    """``path`` relative to the working directory when it lies inside it, else absolute: what
    outputs (``final.json``, the export's metadata) record, so that a results tree moved or
    copied elsewhere still resolves. (verl's command line takes absolute paths; it is no output.)"""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(absolute)


def portable_text(text: str) -> str:
    """``text`` (a launch record: verl's argv, its resolved config) with every absolute path inside
    the working directory written relative to it, as :func:`portable_path` writes one path. The
    launch itself keeps the absolute paths verl needs; the records a user reads move with the tree.

    >>> import os
    >>> portable_text(f"data.train_files={os.getcwd()}/results/train.parquet")
    'data.train_files=results/train.parquet'

    """
    for root in dict.fromkeys([str(Path.cwd().resolve()), os.path.abspath(os.getcwd())]):
        text = text.replace(root + os.sep, "")
    return text


def new_metrics_file(metrics_dir: str | os.PathLike) -> Path:
    """Path for the next attempt's verl ``file`` logger output (``attempt_001.jsonl``, ...).

    verl's FileLogger truncates its file when it starts, so every attempt of a job (a rerun
    after a failure resumes from a checkpoint) writes its own file.
    """
    metrics_dir = Path(metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(metrics_dir.glob("attempt_*.jsonl"))) + 1
    return metrics_dir / f"attempt_{n:03d}.jsonl"


def read_step_metrics(metrics_dir: str | os.PathLike) -> dict[int, dict]:
    """Per-step metrics of all attempts, ``{step: {name: value}}``.

    A later attempt re-runs the steps after the checkpoint it resumed from, so for a step that
    several attempts logged, the last attempt's record wins - except a record of validation
    metrics only, which a resumed attempt logs at the step it resumed from (verl validates before
    training): it joins the training metrics the earlier attempt logged for that step. Lines that
    are not JSON (a process killed mid-write) are skipped and counted in a warning.
    """
    steps: dict[int, dict] = {}
    for f in sorted(Path(metrics_dir).glob("attempt_*.jsonl")):
        bad = 0
        attempt: dict[int, dict] = {}
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    step = int(record["step"])
                    data = dict(record["data"])
                except (ValueError, KeyError, TypeError):
                    bad += 1
                    continue
                attempt.setdefault(step, {}).update(data)  # verl may log one step in parts
        for step, data in attempt.items():
            if all(k.startswith("val-") for k in data):
                steps.setdefault(step, {}).update(data)
            else:
                steps[step] = data
        if bad:
            log.warning("%s: skipped %d unreadable line(s)", f, bad)
    return dict(sorted(steps.items()))


def training_steps(
    finals: list[str | os.PathLike], mlflow: MlflowConfig | Mapping[str, Any]
) -> dict[str, dict[int, dict]]:
    """Per training run, its per-step metrics (for the learning curves): from the metrics files of
    its work directory (the records verl also logs to the MLflow run), or from the MLflow run its
    ``final.json`` names when those files were deleted with the work directory.

    Args:
        finals: the ``final.json`` files of the runs.
        mlflow: the ``mlflow`` section (MLflow is read only when it is enabled).
    Returns:
        ``{variant: {step: {metric: value}}}``; a run without metrics is logged and left empty.
    """
    from spader.evaluation.curves import steps_from_mlflow
    from spader.infra.tracking import MlflowSettings

    settings = MlflowSettings(mlflow)
    out = {}
    for path in finals:
        final = json.loads(Path(path).read_text(encoding="utf-8"))
        metrics_dir = Path(path).parent / "work" / "metrics"
        steps = read_step_metrics(metrics_dir) if metrics_dir.is_dir() else {}
        if not steps and final.get("mlflow_run_id") and settings.enabled:
            steps = steps_from_mlflow(settings.tracking_uri, final["mlflow_run_id"])
        if not steps:
            log.warning("%s: no per-step metrics found for its learning curves", path)
        out[str(final.get("variant") or Path(path).parent.name)] = steps
    return out
