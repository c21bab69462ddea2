"""The ``train_policy`` job: one verl run of one variant on one backbone.

Order of work (nothing touches a GPU before the checks pass):

1. preflight: pinned verl, base model directory, GPUs (:mod:`spader.training.preflight`);
2. resume point: the newest complete checkpoint in ``<workdir>/checkpoints``;
3. the verl command, composed and validated in-process with Hydra (a dry run of the launch);
4. MLflow: tags and ``snakemake/`` params on the job's run, which verl then attaches to;
5. the retrieval service for this job on this node, its ``/health`` checked, the tool YAML
   pointed at it;
6. verl, as its own process group, output into the job's log;
7. ``final.json``: steps done, the checkpoint to export, last metrics, hashes of config, data
   and index, verl version; logged with the config as artifacts.

The work directory holds everything that must survive a failed or killed job (checkpoints,
per-attempt metrics, the attempt history) and is never a Snakemake output, so a rerun resumes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spader.infra.glue import retrieval_settings
from spader.infra.tracking import MlflowSettings, config_hash, fingerprint
from spader.integrations.verl.overrides import AGENT_DEFAULTS, agent_overrides
from spader.training.checkpoints import (
    Checkpoint,
    latest_checkpoint,
    new_metrics_file,
    read_step_metrics,
    resume_overrides,
)
from spader.training.launch import (
    LaunchPlan,
    build_plan,
    compose_config,
    cpu_ray_slots,
    device_env,
    device_overrides,
    job_overrides,
    log_stream,
    run_command,
    write_plan,
)
from spader.training.lineage import RunLink, previous_attempts, record_attempt, verl_tracking_env
from spader.training.preflight import PreflightError, check_retrieval, static_checks
from spader.training.scorer_launch import BaselineLaunch, baseline_launch, judge_endpoint, judge_settings

log = logging.getLogger(__name__)

__all__ = ["TrainJob", "TrainingError", "input_hashes", "plan_launch", "run_training"]


class TrainingError(RuntimeError):
    """verl failed or left no usable checkpoint; the message says where the checkpoints are."""


@dataclass
class TrainJob:
    """Everything one training job needs (what the Snakemake rule hands over).

    ``backbone_spec``/``variant_spec``/``training``/``retrieval`` are the config sections
    (``backbones.<b>``, ``variants.<v>``, ``training``, ``retrieval`` with the reranker's local
    ``path``). ``entry`` replaces ``python -m spader.integrations.verl.main`` (tests run a fake
    trainer through it); ``extra_overrides`` are applied last (the GPU smoke test).
    """

    backbone: str
    variant: str
    backbone_spec: dict
    variant_spec: dict
    training: dict
    retrieval: dict
    train_file: Path
    val_file: Path
    index_dir: Path
    model_dir: Path
    verl_config_dir: Path
    workdir: Path
    final_json: Path
    threads: int = 1
    log_path: Path | None = None
    params_hash: str = ""
    tracking_uri: str | None = None
    experiment: str = "spader"
    extra_overrides: tuple[str, ...] = ()
    entry: tuple[str, ...] | None = None
    # the step-level baselines (spader.training.scorer_launch): StepSearch's evidence and settings,
    # R3-RAG's judge settings and model directory
    evidence: Path | None = None
    stepsearch: dict | None = None
    judge: dict | None = None
    judge_model_dir: Path | None = None
    # config.yaml `agent`: what one turn is, the same as in evaluation (per-turn token cap, stop
    # tags, turns, observation cap, queries per call)
    agent: dict = field(default_factory=lambda: dict(AGENT_DEFAULTS))

    @classmethod
    def from_snakemake(cls, smk) -> TrainJob:
        """Build the job from the ``snakemake`` object of rule ``train_policy``."""
        params = smk.params
        mlflow_cfg = smk.config.get("mlflow", {})
        settings = MlflowSettings(mlflow_cfg, ".") if mlflow_cfg.get("enabled", False) else None
        return cls(
            backbone=smk.wildcards.backbone,
            variant=smk.wildcards.variant,
            backbone_spec=dict(params.backbone),
            variant_spec=dict(params.variant),
            training=dict(params.training),
            retrieval=retrieval_settings(params.retrieval, smk.config),
            train_file=_single(smk.input.train, "train"),
            val_file=_single(smk.input.val, "val"),
            index_dir=_single(smk.input.index, "index"),
            model_dir=_single(smk.input.model, "model"),
            verl_config_dir=Path(smk.input.verl_configs[0]).parent,
            workdir=Path(params.workdir),
            final_json=Path(smk.output.final),
            threads=int(smk.threads),
            log_path=Path(smk.log[0]) if len(smk.log) else None,
            params_hash=config_hash(dict(params.items())),
            tracking_uri=settings.tracking_uri if settings else None,
            experiment=settings.experiment if settings else "spader",
            evidence=_optional(smk.input, "evidence"),
            stepsearch=smk.config.get("stepsearch"),
            judge=judge_settings(params.get("judge"), smk.config),
            judge_model_dir=_optional(smk.input, "judge_model"),
            agent={**AGENT_DEFAULTS, **dict(params.get("agent") or {})},
        )

    # Files in the work directory.
    @property
    def ckpt_dir(self) -> Path:
        return self.workdir / "checkpoints"

    @property
    def metrics_dir(self) -> Path:
        return self.workdir / "metrics"

    @property
    def tool_config(self) -> Path:
        return self.workdir / "tool_config.yaml"

    @property
    def resolved_config(self) -> Path:
        return self.workdir / "resolved_config.yaml"

    @property
    def launch_file(self) -> Path:
        return self.workdir / "launch.json"

    @property
    def service_log(self) -> Path:
        return self.workdir / "retrieval_service.log"

    @property
    def run_name(self) -> str:
        return f"{self.backbone}-{self.variant}"

    @property
    def baseline(self) -> BaselineLaunch:
        """What a StepSearch / R3-RAG variant adds to the launch (nothing for the others)."""
        return baseline_launch(
            self.variant_spec, evidence=self.evidence, stepsearch=self.stepsearch, judge=self.judge
        )

    @property
    def device(self) -> str:
        """``training.device``: ``cuda`` (default) or ``cpu``."""
        return str(self.training.get("device", "cuda"))

    @property
    def workers(self) -> int:
        """Training processes: the backbone's GPUs, or ``training.cpu_workers`` on a CPU."""
        if self.device == "cpu":
            return int(self.training.get("cpu_workers", 1))
        return int(self.backbone_spec["gpus"])


def _optional(inputs, name: str) -> Path | None:
    """An optional named input (an empty list when the rule's input function gives none)."""
    value = getattr(inputs, name, None)
    return None if value is None or (not isinstance(value, str) and not list(value)) else _single(value, name)


def _single(value, name: str) -> Path:
    """One path from a Snakemake input entry (a named entry built by ``expand`` is a list)."""
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    items = list(value)
    if len(items) != 1:
        raise ValueError(f"rule input {name!r} must be one path, got {items}")
    return Path(items[0])


def input_hashes(train_file, val_file, index_dir) -> dict[str, str]:
    """Fingerprints of the training data (train + val parquet) and of the index directory."""
    train, val = fingerprint(train_file), fingerprint(val_file)
    data = hashlib.sha256(f"{train}\n{val}".encode()).hexdigest()
    return {"data_hash": data, "train_hash": train, "val_hash": val, "index_hash": fingerprint(index_dir)}


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def _final_metrics(steps: Mapping[int, dict]) -> tuple[dict, dict]:
    """Last step's metrics, and the most recent validation metrics (``val-*`` keys)."""
    if not steps:
        return {}, {}
    last = dict(steps[max(steps)])
    val: dict = {}
    for step in sorted(steps, reverse=True):
        val = {k: v for k, v in steps[step].items() if k.startswith("val-")}
        if val:
            val["step"] = step
            break
    return last, val


def plan_launch(
    job: TrainJob, *, resume_from: Checkpoint | None, metrics_file: Path, link: RunLink
) -> LaunchPlan:
    """The verl launch of ``job``: method overrides, this job's paths/GPUs/loggers, resume point.

    Args:
        job: the job.
        resume_from: checkpoint to resume from (None: from scratch).
        metrics_file: where verl's ``file`` logger writes this attempt's per-step metrics.
        link: the job's MLflow run (verl's ``mlflow`` logger is enabled only when it is).

    Returns:
        The plan; ``plan.argv`` is the command, ``plan.env`` what it adds to the environment.
    """
    baseline = job.baseline
    workers = job.workers - baseline.judge_gpus  # a judge served on the node takes its GPUs
    env = {
        **verl_tracking_env(link.run_id, link.tracking_uri),
        "VERL_FILE_LOGGER_PATH": os.path.abspath(metrics_file),
        "PYTHONUNBUFFERED": "1",
        "HYDRA_FULL_ERROR": "1",
        "HF_HUB_OFFLINE": "1",  # the base model is a local directory; compute nodes may have no network
        **device_env(job.training, threads=job.threads, workers=workers),
    }
    return build_plan(
        variant=job.variant_spec,
        training=job.training,
        config_dir=job.verl_config_dir,
        job=[
            *job_overrides(
                train_file=job.train_file,
                val_file=job.val_file,
                model_dir=job.model_dir,
                gpus=workers,
                ray_cpus=cpu_ray_slots(workers, job.threads) if job.device == "cpu" else job.threads,
                ckpt_dir=job.ckpt_dir,
                tool_config=job.tool_config,
                project=job.experiment,
                run_name=job.run_name,
                loggers=["console", "file", *(["mlflow"] if link.enabled else [])],
                env=env,
            ),
            *device_overrides(job.training, threads=job.threads, workers=workers),
            *agent_overrides(job.agent),
            *baseline.overrides,
        ],
        resume=resume_overrides(resume_from),
        extra=job.extra_overrides,
        env=env,
        entry=job.entry,
    )


def run_training(
    job: TrainJob,
    *,
    run=None,
    service: Callable | None = None,
    available_gpus: int | None = None,
) -> dict:
    """Train ``job.variant`` on ``job.backbone`` with verl; write and return ``final.json``.

    Args:
        job: the job.
        run: the job's MLflow run (``spader.infra.glue.job`` yields it; None: tracking off).
        service: context manager factory ``(index_dir, settings, *, log_path, threads) -> url``
            (default :func:`spader.retrieval.service.running_service`).
        available_gpus: visible GPUs (None: counted with torch).

    Returns:
        The content of ``final.json``.

    Raises:
        PreflightError: a check failed; nothing was started.
        TrainingError: verl failed (checkpoints stay in the work directory for the rerun).
    """
    gpus = int(job.backbone_spec["gpus"])
    verl_version = static_checks(
        backbone=job.backbone,
        model=str(job.backbone_spec.get("model", job.model_dir)),
        model_dir=job.model_dir,
        gpus=gpus,
        available_gpus=available_gpus,
        device=job.device,
    )
    for name, path in (("train", job.train_file), ("val", job.val_file), ("index", job.index_dir)):
        if not Path(path).exists():
            raise PreflightError(f"training input {name} {path} does not exist")

    job.workdir.mkdir(parents=True, exist_ok=True)
    resume_from = latest_checkpoint(job.ckpt_dir)
    log.info(
        "%s: %s",
        job.run_name,
        f"resuming from step {resume_from.step}" if resume_from else "starting from scratch",
    )
    link = RunLink.from_active_run(run, job.tracking_uri)
    metrics_file = new_metrics_file(job.metrics_dir)
    plan = plan_launch(job, resume_from=resume_from, metrics_file=metrics_file, link=link)
    write_plan(plan, job.launch_file)
    cfg = compose_config(plan)
    from omegaconf import OmegaConf

    job.resolved_config.write_text(OmegaConf.to_yaml(cfg, resolve=True))

    hashes = input_hashes(job.train_file, job.val_file, job.index_dir)
    earlier = previous_attempts(job.workdir)
    attempt = 1 + sum(1 for a in earlier if a.get("event") == "start")
    resume_step = resume_from.step if resume_from else 0
    link.set_tags(
        {
            "backbone": job.backbone,
            "variant": job.variant,
            "data_hash": hashes["data_hash"],
            "index_hash": hashes["index_hash"],
            "verl_version": verl_version,
            "training.attempt": attempt,
            "training.resume_step": resume_step,
            "training.previous_runs": json.dumps([a["run_id"] for a in earlier if a.get("run_id")]),
        }
    )
    link.log_params(
        {
            "backbone": job.backbone,
            "variant": job.variant,
            "model_dir": os.path.abspath(job.model_dir),
            "workdir": os.path.abspath(job.workdir),
            "resume_step": resume_step,
            "config_hash": job.params_hash,
        }
    )
    record_attempt(
        job.workdir, {"event": "start", "attempt": attempt, "run_id": link.run_id, "resume_step": resume_step}
    )

    from spader.integrations.verl.tool_config import write_tool_config

    start_service = service
    if start_service is None:
        from spader.retrieval.service import running_service as start_service
    outcome: dict[str, Any] = {"event": "end", "attempt": attempt, "status": "failed"}
    try:
        # The service shares the node with verl; an eighth of the job's CPUs serves BM25 + reranking,
        # and one reranker replica sits on every GPU of the job (equal footprint on each GPU).
        from spader.retrieval.service import reranker_on_job_gpus

        service_settings = reranker_on_job_gpus(job.retrieval, gpus if job.device == "cuda" else 0)
        with start_service(
            job.index_dir, service_settings, log_path=job.service_log, threads=max(1, job.threads // 8)
        ) as url:
            check_retrieval(url, timeout=float(job.retrieval.get("service", {}).get("request_timeout_s", 30)))
            write_tool_config(
                job.tool_config,
                service_url=url,
                retrieval=job.retrieval,
                max_chars=int(job.agent["max_tool_response_chars"]),
                max_queries_per_call=int(job.agent["max_queries_per_call"]),
                record_turns=job.baseline.record_turns,
            )
            with judge_endpoint(
                job.baseline,
                job.judge,
                model_dir=job.judge_model_dir,
                training_gpus=job.workers - job.baseline.judge_gpus,
                environ=os.environ,
                log_path=job.workdir / "judge_server.log",
            ) as (judge_overrides, judge_env):
                argv = [*plan.argv, *judge_overrides]
                log.info("launching verl: %s", " ".join(argv))
                rc = run_command(argv, env={**plan.env, **judge_env}, output=log_stream())
        outcome["returncode"] = rc
        if rc != 0:
            latest = latest_checkpoint(job.ckpt_dir)
            raise TrainingError(
                f"verl exited with code {rc} (see {job.log_path or 'the log above'}); checkpoints are kept in "
                f"{job.ckpt_dir} and a rerun resumes from "
                + (f"step {latest.step}" if latest else "scratch (no complete checkpoint yet)")
            )
        final = _finalize(job, link, hashes, verl_version, attempt, resume_step)
        outcome["status"] = "finished"
        return final
    except BaseException as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"
        try:  # what the failed attempt did, next to its FAILED run; never hides the error itself
            link.log_artifacts(
                [job.launch_file, job.resolved_config, *sorted(job.metrics_dir.glob("*.jsonl"))]
            )
        except Exception:
            log.exception("could not log the failed attempt's files to MLflow")
        raise
    finally:
        record_attempt(job.workdir, outcome)


def _finalize(
    job: TrainJob, link: RunLink, hashes: dict, verl_version: str, attempt: int, resume_step: int
) -> dict:
    ckpt = latest_checkpoint(job.ckpt_dir)
    if ckpt is None:
        raise TrainingError(
            f"verl exited normally but left no complete checkpoint in {job.ckpt_dir} "
            "(training.save_freq must be >= 1; verl saves at the last step)"
        )
    steps = read_step_metrics(job.metrics_dir)
    last_logged = max((s for s in steps if s > 0), default=0)
    if last_logged > ckpt.step:
        raise TrainingError(
            f"verl logged step {last_logged} but the newest complete checkpoint is step {ckpt.step}; "
            "the final checkpoint is missing"
        )
    metrics, val_metrics = _final_metrics(steps)
    final = {
        "backbone": job.backbone,
        "variant": job.variant,
        "steps_done": ckpt.step,
        "checkpoint": os.path.abspath(ckpt.path),
        "actor_dir": os.path.abspath(ckpt.actor_dir),
        "base_model": str(job.backbone_spec.get("model", "")),
        "model_dir": os.path.abspath(job.model_dir),
        "config_hash": job.params_hash,
        **hashes,
        "verl_version": verl_version,
        "mlflow_run_id": link.run_id,
        "attempt": attempt,
        "resumed_from_step": resume_step,
        "metrics": metrics,
        "val_metrics": val_metrics,
    }
    _write_json(job.final_json, final)
    link.log_artifacts(
        [
            job.final_json,
            job.resolved_config,
            job.launch_file,
            job.tool_config,
            *sorted(job.metrics_dir.glob("*.jsonl")),
        ]
    )
    log.info("%s: trained %d steps; checkpoint %s", job.run_name, ckpt.step, ckpt.path)
    return final
