"""The ``train_policy`` job: one verl run of one variant on one backbone.

:func:`run_training` goes through named phases, and nothing touches a GPU before the first four
pass:

1. :func:`claim_workdir` - the work directory's lock (one trainer at a time,
   :mod:`spader.training.workdir`) and, for an automatic retry, whether the history allows it
   (:func:`spader.training.lineage.retry_refusal`);
2. :func:`preflight` - pinned verl, base model directory, GPUs, the job's inputs;
3. :func:`resume_point` - the newest complete checkpoint in ``<workdir>/checkpoints``, older ones
   beyond the kept count deleted (:func:`spader.training.checkpoints.prune_checkpoints`);
4. :func:`record_start` - MLflow tags and ``snakemake/`` params on the job's run (verl attaches to
   it), the attempt in ``attempts.jsonl``;
5. :func:`prepare_launch` - the verl command, composed and validated in-process with Hydra (a dry
   run of the launch), written to ``launch.json`` and ``resolved_config.yaml``;
6. :func:`train` - the retrieval service for this job on this node, or one replica on each node
   of a multi-node job (:mod:`spader.training.node_search`; health checked, the tool YAML pointed
   at it), the R3-RAG judge where served, Ray's place (:mod:`spader.training.ray_cluster`),
   then verl under the job's watch (:mod:`spader.training.watch`) and stop control
   (:mod:`spader.training.stop`);
7. :func:`conclude` - ``final.json`` (steps done, the checkpoint to export, last metrics, hashes of
   config, data and index, verl version; paths relative to the working directory), or the
   reason the attempt ended early.

Every attempt that got the work directory ends with a record of how it ended in
``attempts.jsonl`` (a failed preflight too), which is what an automatic retry reads: SLURM records
the same exit status for a stop and a failure. From its first instant the job also reads the time
its SLURM allocation has left (:class:`spader.training.stop.TimeLimitWatch`).

The work directory holds everything that must survive a failed, stopped or killed job
(checkpoints, per-attempt metrics, the attempt history) and is never a Snakemake output, so a
rerun resumes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spader.config.model import (
    AgentConfig,
    BackboneConfig,
    HardwareConfig,
    JudgeConfig,
    MlflowConfig,
    RetrievalConfig,
    StepSearchConfig,
    TrainingConfig,
    VariantConfig,
)
from spader.infra.atomic import atomic_write
from spader.infra.glue import overlay, retrieval_settings
from spader.infra.procs import STOP_REQUEST_ENV, Terminated, deferring_workflow_loss
from spader.infra.tracking import MlflowSettings, config_hash, fingerprint, log_metrics
from spader.integrations.verl.device import device_overrides
from spader.integrations.verl.overrides import agent_overrides
from spader.training.checkpoints import (
    Checkpoint,
    latest_checkpoint,
    new_metrics_file,
    portable_path,
    portable_text,
    prune_checkpoints,
    read_step_metrics,
    resume_overrides,
)
from spader.training.launch import (
    LaunchPlan,
    build_plan,
    compose_config,
    device_env,
    job_overrides,
    log_stream,
    ray_cpu_slots,
    run_supervised,
    write_plan,
)
from spader.training.lineage import (
    RunLink,
    lineage_of,
    previous_attempts,
    record_attempt,
    retry_refusal,
    verl_tracking_env,
)
from spader.training.measure import (
    SelfMeasure,
    flat_metrics,
    measured_section,
    planned_section,
    read_planned,
    recorded_host_peak,
    write_planned,
)
from spader.training.preflight import PreflightError, check_job_memory, check_retrieval, static_checks
from spader.training.scorer_launch import ScorerLaunch, judge_endpoint, judge_settings, scorer_launch
from spader.training.stop import StopControl, StoppedForResume, TimeLimitWatch, read_stop_ack
from spader.training.workdir import WorkdirLock

log = logging.getLogger(__name__)

__all__ = [
    "TrainJob",
    "TrainingError",
    "claim_workdir",
    "conclude",
    "input_hashes",
    "plan_launch",
    "portable_path",
    "preflight",
    "prepare_launch",
    "record_start",
    "resume_point",
    "run_training",
    "search_nodes",
    "search_services",
    "train",
]


class TrainingError(RuntimeError):
    """verl failed or left no usable checkpoint; the message says where the checkpoints are."""


def _typed(cls, value):
    """``value`` as the config section ``cls`` (a plain dict from a rule's params, or one already)."""
    if value is None or isinstance(value, cls):
        return value
    return cls.model_validate(dict(value))


@dataclass
class TrainJob:
    """Everything one training job needs (what the Snakemake rule hands over).

    ``backbone_spec``/``variant_spec``/``training``/``retrieval``/``agent``/``stepsearch``/``judge``
    are the typed config sections (``backbones.<b>``, ``variants.<v>``, ``training``, ...); plain
    dicts, as rules pass them, are validated into them. A ``retrieval`` dict may carry the
    reranker's resolved local directory as ``reranker.path`` (:meth:`spader.dag.Jobs.retrieval_params`
    in the workflow); it moves to ``reranker_path``. ``entry`` replaces ``python -m
    spader.integrations.verl.main`` (tests run a fake trainer through it); ``extra_overrides`` are
    applied last (the GPU smoke test). ``attempt`` is Snakemake's attempt number (1: a first run
    or a rerun by hand; more: an automatic retry). ``ray_address`` names a running Ray cluster to
    train on (None: a private instance, or the cluster the job starts across its SLURM nodes).
    ``training.nodes`` is the job's own: the variant's ``nodes`` where it sets one.
    """

    backbone: str
    variant: str
    backbone_spec: BackboneConfig
    variant_spec: VariantConfig
    training: TrainingConfig
    retrieval: RetrievalConfig
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
    experiment: str = field(default_factory=lambda: MlflowConfig().experiment)
    extra_overrides: tuple[str, ...] = ()
    entry: tuple[str, ...] | None = None
    # the step-level scorers of StepSearch and R3-RAG (spader.training.scorer_launch): StepSearch's evidence and settings,
    # R3-RAG's judge settings and model directory
    evidence: Path | None = None
    stepsearch: StepSearchConfig | None = None
    judge: JudgeConfig | None = None
    judge_model_dir: Path | None = None
    # config.yaml `agent`: what one turn is, the same as in evaluation
    agent: AgentConfig = field(default_factory=AgentConfig)
    reranker_path: Path | None = None
    attempt: int = 1
    ray_address: str | None = None
    # config.yaml `hardware` (operational, no param): the node a GPU job is planned for; with it the
    # job plans its time, save cadence, host memory and disk and checks the node it landed on
    hardware: HardwareConfig | None = None
    # memory (MB) the job asked for on each node (the rule's mem_mb): what the steps it starts
    # inside its allocation ask SLURM for (spader.training.ray_cluster.step_request)
    mem_mb: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.retrieval, Mapping):
            retrieval = dict(self.retrieval)
            reranker = dict(retrieval.get("reranker") or {})
            path = reranker.pop("path", None)
            if path and self.reranker_path is None:
                self.reranker_path = Path(path)
            retrieval["reranker"] = reranker
            self.retrieval = retrieval
        self.backbone_spec = _typed(BackboneConfig, self.backbone_spec)
        self.variant_spec = _typed(VariantConfig, self.variant_spec)
        self.training = _typed(TrainingConfig, self.training)
        self.retrieval = _typed(RetrievalConfig, self.retrieval)
        self.stepsearch = _typed(StepSearchConfig, self.stepsearch)
        self.judge = _typed(JudgeConfig, self.judge)
        self.agent = _typed(AgentConfig, self.agent)
        self.hardware = _typed(HardwareConfig, self.hardware)
        nodes = self.variant_spec.nodes
        if nodes is not None and nodes != self.training.nodes:  # the variant's own node count
            self.training = self.training.model_copy(update={"nodes": nodes})

    @classmethod
    def from_snakemake(cls, smk) -> TrainJob:
        """Build the job from the ``snakemake`` object of rule ``train_policy``."""
        params = smk.params
        mlflow = MlflowConfig.model_validate(smk.config["mlflow"])
        settings = MlflowSettings(mlflow, ".") if mlflow.enabled else None
        # the config's section overlaid with the param: the operational keys are no param
        training = overlay(smk.config["training"], dict(params.training))
        return cls(
            backbone=smk.wildcards.backbone,
            variant=smk.wildcards.variant,
            backbone_spec=dict(params.backbone),
            variant_spec=dict(params.variant),
            training=training,
            retrieval=retrieval_settings(params.retrieval, smk.config),
            train_file=_single(smk.input.train, "train"),
            val_file=_single(smk.input.val, "val"),
            index_dir=_single(smk.input.index, "index"),
            model_dir=_single(smk.input.model, "model"),
            verl_config_dir=Path(smk.input.verl_configs[0]).parent,
            workdir=Path(params.workdir),
            final_json=Path(smk.output.final),
            threads=int(smk.threads),
            mem_mb=_mem_mb(smk),
            log_path=Path(smk.log[0]) if len(smk.log) else None,
            params_hash=config_hash(dict(params.items())),
            tracking_uri=settings.tracking_uri if settings else None,
            experiment=mlflow.experiment,
            evidence=_optional(smk.input, "evidence"),
            stepsearch=smk.config["stepsearch"],
            judge=judge_settings(params.get("judge"), smk.config),
            judge_model_dir=_optional(smk.input, "judge_model"),
            agent=dict(params.get("agent") or {}),
            attempt=int(getattr(getattr(smk, "resources", None), "train_attempt", 1) or 1),
            hardware=smk.config.get("hardware"),  # None: no node description, no time plan or node check
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
    def stop_file(self) -> Path:
        """Its existence asks verl to stop at the next step boundary (:mod:`spader.training.stop`)."""
        return self.workdir / "stop_request"

    @property
    def run_name(self) -> str:
        return f"{self.backbone}-{self.variant}"

    @property
    def retrieval_settings(self) -> dict[str, Any]:
        """The ``retrieval`` section as the retrieval service and tool config take it (the
        reranker's local directory as ``reranker.path``)."""
        settings = self.retrieval.model_dump()
        if self.reranker_path is not None:
            settings["reranker"]["path"] = str(self.reranker_path)
        return settings

    @property
    def scorer(self) -> ScorerLaunch:
        """What a StepSearch / R3-RAG variant adds to the launch (nothing for the others)."""
        return scorer_launch(
            self.variant_spec.model_dump(),
            evidence=self.evidence,
            stepsearch=self.stepsearch.model_dump() if self.stepsearch else None,
            judge=self.judge.model_dump() if self.judge else None,
        )

    @property
    def device(self) -> str:
        """``training.device``: ``cuda`` (default) or ``cpu``."""
        return self.training.device

    @property
    def workers(self) -> int:
        """Training processes per node: the backbone's GPUs, or ``training.cpu_workers`` on a CPU."""
        if self.device == "cpu":
            return self.training.cpu_workers
        return self.backbone_spec.gpus

    @property
    def judge_node(self) -> bool:
        """The LLM judge is served on a node of its own (the last one of a multi-node job)."""
        return self.training.nodes > 1 and self.scorer.judge_gpus > 0

    @property
    def train_nodes(self) -> int:
        """Nodes verl trains on (``trainer.nnodes``): the job's, less the judge's own."""
        return self.training.nodes - (1 if self.judge_node else 0)


def _mem_mb(smk) -> int | None:
    value = getattr(getattr(smk, "resources", None), "mem_mb", None)
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


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
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


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
    job: TrainJob,
    *,
    resume_from: Checkpoint | None,
    metrics_file: Path,
    link: RunLink,
    storage_units: int | None = None,
    save_every: int | None = None,
) -> LaunchPlan:
    """The verl launch of ``job``: method overrides, this job's paths/GPUs/nodes/loggers, resume point.

    Args:
        job: the job.
        resume_from: checkpoint to resume from (None: from scratch).
        metrics_file: where verl's ``file`` logger writes this attempt's per-step metrics.
        link: the job's MLflow run (verl's ``mlflow`` logger is enabled only when it is).
        storage_units: TransferQueue storage units, for the CPUs a private Ray instance advertises
            (None: one on a CPU, verl's 8 on GPUs; :func:`prepare_launch` reads the composed value).
        save_every: the plan's save cadence (``trainer.save_freq``), when it saves more often than
            ``training.save_freq`` (None: that key's).

    Returns:
        The plan; ``plan.argv`` is the command, ``plan.env`` what it adds to the environment.
    """
    scorer = job.scorer
    # a judge served on the training node takes GPUs from it; on a node of its own it takes none
    workers = job.workers - (0 if job.judge_node else scorer.judge_gpus)
    private_ray = job.ray_address is None and job.train_nodes == 1
    if storage_units is None:
        storage_units = 1 if job.device == "cpu" else 8
    env = {
        **verl_tracking_env(link.run_id, link.tracking_uri),
        "VERL_FILE_LOGGER_PATH": os.path.abspath(metrics_file),
        STOP_REQUEST_ENV: os.path.abspath(job.stop_file),
        "PYTHONUNBUFFERED": "1",
        "HYDRA_FULL_ERROR": "1",
        "HF_HUB_OFFLINE": "1",  # the base model is a local directory; compute nodes may have no network
        **device_env(job.training, threads=job.threads, workers=workers),
    }
    return build_plan(
        variant=job.variant_spec,
        training=job.training,
        config_dir=job.verl_config_dir,
        job=_launch_overrides(
            job,
            scorer,
            workers=workers,
            private_ray=private_ray,
            storage_units=storage_units,
            link=link,
            env=env,
        )
        + ([f"trainer.save_freq={int(save_every)}"] if save_every else []),
        resume=resume_overrides(resume_from),
        extra=job.extra_overrides,
        env=env,
        entry=job.entry,
    )


def _launch_overrides(
    job: TrainJob,
    scorer: ScorerLaunch,
    *,
    workers: int,
    private_ray: bool,
    storage_units: int,
    link: RunLink,
    env: Mapping[str, str],
) -> list[str]:
    """The job's own overrides of its launch (paths, GPUs, nodes, loggers, device, agent, scorer)."""
    training = job.training
    return [
        *job_overrides(
            train_file=job.train_file,
            val_file=job.val_file,
            model_dir=job.model_dir,
            gpus=workers,
            ray_cpus=ray_cpu_slots(workers=workers, storage_units=storage_units, threads=job.threads)
            if private_ray
            else None,
            ckpt_dir=job.ckpt_dir,
            tool_config=job.tool_config,
            project=job.experiment,
            run_name=job.run_name,
            loggers=["console", "file", *(["mlflow"] if link.enabled else [])],
            env=env,
            nnodes=job.train_nodes,
            ray_address=job.ray_address,
        ),
        *device_overrides(
            training,
            threads=job.threads,
            workers=workers,
            private_ray=private_ray,
            nnodes=job.train_nodes,
        ),
        # operational (not a param of the rule): how long a generation may go unanswered
        f"++spader_agent.rollout_timeout_s={float(training.rollout_timeout_s)}",
        *agent_overrides(job.agent.model_dump()),
        *scorer.overrides,
    ]


# ---------------------------------------------------------------------------------------------
# The phases of run_training
# ---------------------------------------------------------------------------------------------
def preflight(job: TrainJob, available_gpus: int | None) -> str:
    """Checks before anything starts: pinned verl, base model, GPUs, the job's inputs.

    Returns:
        verl's version.
    Raises:
        PreflightError: a check failed.
    """
    verl_version = static_checks(
        backbone=job.backbone,
        model=str(job.backbone_spec.model or job.model_dir),
        model_dir=job.model_dir,
        gpus=job.backbone_spec.gpus,
        available_gpus=available_gpus,
        device=job.device,
    )
    for name, path in (("train", job.train_file), ("val", job.val_file), ("index", job.index_dir)):
        if not Path(path).exists():
            raise PreflightError(f"training input {name} {path} does not exist")
    if job.training.nodes > 1 and job.ray_address is None and not os.environ.get("SLURM_JOB_ID"):
        raise PreflightError(
            f"{job.variant} trains on {job.training.nodes} nodes (variants.{job.variant}.nodes, else "
            "training.nodes): a multi-node job runs inside a SLURM allocation "
            "(snakemake --profile slurm), which gives it its nodes; none is here"
        )
    return verl_version


def claim_workdir(job: TrainJob) -> WorkdirLock:
    """The work directory's lock, taken; for an automatic retry, the history's consent.

    Raises:
        spader.training.workdir.WorkdirBusyError: another trainer holds the work directory.
        TrainingError: an automatic retry that the history refuses (the lock is released).
    """
    job.workdir.mkdir(parents=True, exist_ok=True)
    lock = WorkdirLock(job.workdir).acquire()
    refusal = retry_refusal(
        previous_attempts(job.workdir),
        attempt=job.attempt,
        failure_retries=job.training.time_limit.failure_retries,
    )
    if refusal:
        record_attempt(job.workdir, {"event": "refused", "snakemake_attempt": job.attempt, "reason": refusal})
        lock.release()
        raise TrainingError(refusal)
    return lock


def resume_point(job: TrainJob) -> Checkpoint | None:
    """The newest complete checkpoint (None: from scratch), after deleting older checkpoints beyond
    ``training.max_actor_ckpt_to_keep`` (earlier attempts' retention)."""
    prune_checkpoints(job.ckpt_dir, job.training.max_actor_ckpt_to_keep)
    resume_from = latest_checkpoint(job.ckpt_dir)
    log.info(
        "%s: %s",
        job.run_name,
        f"resuming from step {resume_from.step}" if resume_from else "starting from scratch",
    )
    return resume_from


def prepare_launch(
    job: TrainJob, resume_from: Checkpoint | None, link: RunLink, watch: TimeLimitWatch | None = None
) -> LaunchPlan:
    """The verl launch, composed and validated with Hydra; ``launch.json`` and the resolved config
    written. The CPUs a private Ray instance advertises follow the composed TransferQueue size. A GPU
    job plans itself on its composed config (memory, time, save cadence, host memory, disk), saves
    as often as its plan says, stops as early before its time limit as its steps need (``watch``)
    and checks the node it landed on, before any model loads."""
    metrics_file = new_metrics_file(job.metrics_dir)
    launch = functools.partial(
        plan_launch, job, resume_from=resume_from, metrics_file=metrics_file, link=link
    )
    plan = launch()
    cfg = compose_config(plan)
    units = None
    if plan.get("ray_kwargs.ray_init.num_cpus") not in (None, "null"):
        units = int(cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units)
        resized = launch(storage_units=units)
        if resized.overrides != plan.overrides:
            plan, cfg = resized, compose_config(resized)
    planned = check_job_memory(job, cfg)  # the plan of this launch; refuses one that does not fit
    name = f"train {job.backbone}/{job.variant}"  # the plan's name of the job (a later plan reads it back)
    write_planned(job.workdir, planned_section(planned[0] if planned else None, device=job.device, name=name))
    every = planned_save_every(planned, cfg)
    if every is not None:
        log.info("%s: saving every %d steps (its plan; training.save_freq is %s)", job.run_name, every,
                 cfg.trainer.save_freq)  # fmt: skip
        plan = launch(storage_units=units, save_every=every)
        cfg = compose_config(plan)
    if planned and planned[0].host:
        _check_node(job, planned[0], watch)
    write_plan(plan, job.launch_file)
    job.launch_file.write_text(portable_text(job.launch_file.read_text()))
    from omegaconf import OmegaConf

    job.resolved_config.write_text(portable_text(OmegaConf.to_yaml(cfg, resolve=True)))
    return plan


def planned_save_every(planned: list, cfg: Any) -> int | None:
    """The plan's save cadence when it saves more often than the composed ``trainer.save_freq``
    (``training.save_freq``, the most steps between two saves); None otherwise, and for a job
    without a plan (a CPU run, or no node description), which saves every ``training.save_freq``."""
    cadence = planned[0].cadence if planned else None
    if cadence is None or cadence.save_every_steps >= int(cfg.trainer.save_freq):
        return None
    return int(cadence.save_every_steps)


def _check_node(job: TrainJob, planned: Any, watch: TimeLimitWatch | None) -> None:
    """The node against the job's plan (one line naming what is short), and the stop moved earlier
    when a step and its save outlast the warning window."""
    from spader.training.node import check_job_node, measure_node, tree_gib

    node = measure_node(job.workdir, gpus=False)
    for check in check_job_node(
        planned, node, workdir_gib=tree_gib(job.ckpt_dir) if job.ckpt_dir.is_dir() else 0.0
    ):
        log.info("node: %s", check.line())
    if watch is not None and planned.cadence is not None:
        stop_earlier(watch, planned.cadence, job.run_name)


def stop_earlier(watch: TimeLimitWatch, cadence: Any, name: str) -> bool:
    """Move the job's stop before its time limit to the plan's (``cadence.stop_before_minutes``)
    when a step and its save outlast the warning window: the watch then asks verl to stop once the
    allocation has that much left, so that the step in flight and its save finish. Returns whether
    it moved."""
    if cadence.stop_before_minutes * 60 <= watch.warning_s:
        return False
    log.warning(
        "%s: a step (up to %.1f min) and its save (%.1f min) outlast the warning window (%.0f s, "
        "training.time_limit.warning_s): the job stops %.0f min before its time limit and saves every step",
        name, cadence.step_minutes, cadence.save_minutes, watch.warning_s, cadence.stop_before_minutes,
    )  # fmt: skip
    watch.warning_s = cadence.stop_before_minutes * 60
    return True


@dataclass
class Attempt:
    """One attempt of a job: its number in the work directory, where it resumed, its lineage."""

    number: int
    resume_step: int
    lineage: str | None
    hashes: dict[str, str]
    verl_version: str


def record_start(job: TrainJob, link: RunLink, verl_version: str, resume_from: Checkpoint | None) -> Attempt:
    """Tags and params on the job's MLflow run, and the attempt's start in ``attempts.jsonl``.

    The attempts of one training - a first run and every resumed one, whatever ended them - share
    the tag ``training.lineage`` (the run id of the attempt that started from scratch), so MLflow
    shows them as one training.
    """
    hashes = input_hashes(job.train_file, job.val_file, job.index_dir)
    earlier = previous_attempts(job.workdir)
    number = 1 + sum(1 for a in earlier if a.get("event") == "start")
    resume_step = resume_from.step if resume_from else 0
    lineage = lineage_of(earlier, resume_step=resume_step, run_id=link.run_id)
    link.set_tags(
        {
            "backbone": job.backbone,
            "variant": job.variant,
            "data_hash": hashes["data_hash"],
            "index_hash": hashes["index_hash"],
            "verl_version": verl_version,
            "training.attempt": number,
            "training.resume_step": resume_step,
            "training.previous_runs": json.dumps([a["run_id"] for a in earlier if a.get("run_id")]),
            **({"training.lineage": lineage} if lineage else {}),
        }
    )
    link.log_params(
        {
            "backbone": job.backbone,
            "variant": job.variant,
            "model_dir": portable_path(job.model_dir),
            "workdir": portable_path(job.workdir),
            "resume_step": resume_step,
            "config_hash": job.params_hash,
        }
    )
    record_attempt(
        job.workdir,
        {
            "event": "start",
            "attempt": number,
            "run_id": link.run_id,
            "lineage": lineage,
            "resume_step": resume_step,
            "snakemake_attempt": job.attempt,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        },
    )
    return Attempt(number, resume_step, lineage, hashes, verl_version)


#: How long the job glue's workflow watch lets a training stop verl, Ray and its service by itself
#: once the workflow is gone (the job's own watch does; measured within two minutes on 2 cores).
_WORKFLOW_LOSS_DEFERRAL_S = 300.0


@dataclass
class TrainResult:
    """How verl ended: its exit code and what the job's watch and stop control saw."""

    returncode: int
    watch_kind: str | None = None
    watch_reason: str | None = None
    stop_reason: str | None = None


def _write_tool_config(job: TrainJob, service_url: str) -> None:
    """The search tool's YAML of the job (its service, turn settings and what it records)."""
    from spader.integrations.verl.tool_config import write_tool_config

    write_tool_config(
        job.tool_config,
        service_url=service_url,
        retrieval=job.retrieval_settings,
        max_chars=int(job.agent.max_tool_response_chars),
        max_queries_per_call=job.agent.max_queries_per_call,
        record_turns=job.scorer.record_turns,
        observation_format=job.agent.observation_format,
        discovery=job.training.divergences.discovery,
        denominator=job.training.divergences.denominator,
    )


def train(
    job: TrainJob, plan: LaunchPlan, stop: StopControl, lock: WorkdirLock, service: Callable | None = None
) -> TrainResult:
    """Run verl with its retrieval service, judge and Ray, under the job's watch.

    SIGTERM and the scheduler's warning (SIGURG) ask verl to stop after its current step
    (:class:`~spader.training.stop.StopControl`); SIGINT and SIGHUP stop it at once.
    """
    from spader.training.ray_cluster import judge_node, ray_for_job
    from spader.training.watch import JobWatch, workflow_process

    with search_services(job, service) as (service_url, services):
        _write_tool_config(job, service_url)
        with (
            judge_endpoint(
                job.scorer,
                job.judge.model_dump() if job.judge else None,
                model_dir=job.judge_model_dir,
                training_gpus=job.workers - (0 if job.judge_node else job.scorer.judge_gpus),
                environ=os.environ,
                log_path=job.workdir / "judge_server.log",
                node=judge_node(job),
            ) as (judge_overrides, judge_env),
            ray_for_job(job) as (ray_overrides, ray_env),
            # the watch stops verl when the workflow is gone, and records why: the job glue's own
            # watch of the workflow waits for it (it ends the job only if verl does not stop)
            deferring_workflow_loss(_WORKFLOW_LOSS_DEFERRAL_S),
            JobWatch(
                workflow=workflow_process(),
                service=services,
                heartbeat=lock.heartbeat,
            ) as watch,
            stop.handling_signals(),
        ):
            argv = [*plan.argv, *ray_overrides, *judge_overrides]
            log.info("launching verl: %s", " ".join(argv))
            with SelfMeasure(
                job.workdir,
                factor=job.training.over_plan_factor,
                stop=stop.request if job.training.stop_when_over_plan else None,
                name=job.run_name,
            ):
                rc = run_supervised(
                    argv,
                    env={**plan.env, **judge_env, **ray_env},
                    output=log_stream(),
                    signals=(signal.SIGINT, signal.SIGHUP),
                    started=watch.attach,
                )
    return TrainResult(rc, watch.kind, watch.reason, stop.reason)


def search_nodes(job: TrainJob) -> list[str]:
    """The nodes that each run a retrieval replica of their own for their agent-loop workers: the
    training nodes of a multi-node job inside its allocation; none for a single-node job, whose
    service the job runs itself, and none on a cluster named by ``job.ray_address`` (the
    caller's, whose nodes must reach this machine's loopback, as the test's nodes on one machine do)."""
    if job.ray_address is not None or job.train_nodes <= 1:
        return []
    from spader.training.ray_cluster import training_nodes

    return training_nodes(job)


@contextlib.contextmanager
def search_services(job: TrainJob, service: Callable | None = None) -> Iterator[tuple[str | dict, list]]:
    """The job's retrieval service, started and healthy: on one node the job's own, on several one
    replica per training node, each on its node's loopback (:mod:`spader.training.node_search`).

    Every replica holds the job's search settings: an eighth of the job's CPUs serves BM25 and
    reranking beside verl, and one reranker replica sits on every GPU of its node (an equal
    footprint on each GPU).

    Args:
        job: the job.
        service: the single-node service's factory (default
            :func:`spader.retrieval.service.running_service`).
    Yields:
        ``(url, healths)``: the URL for the search tool (one, or host name -> URL) and what the
        job's watch checks (:class:`spader.training.watch.ServiceHealth` and the like).
    """
    from spader.retrieval.backend import SearchSettings
    from spader.retrieval.service import reranker_on_job_gpus
    from spader.training.node_search import SEARCH_DIR, node_replicas
    from spader.training.ray_cluster import step_request
    from spader.training.watch import ServiceHealth

    gpus = job.backbone_spec.gpus if job.device == "cuda" else 0
    search = SearchSettings.from_config(reranker_on_job_gpus(job.retrieval_settings, gpus))
    threads = max(1, job.threads // 8)
    max_error_rate = job.training.max_search_error_rate
    nodes = search_nodes(job)
    if nodes:
        with node_replicas(
            nodes,
            index_dir=job.index_dir,
            search=search,
            threads=threads,
            max_error_rate=max_error_rate,
            directory=job.workdir / SEARCH_DIR,
            step=step_request(job),
        ) as replicas:
            urls = replicas.wait_ready()
            log.info("retrieval replicas: %s", ", ".join(f"{h} {u}" for h, u in sorted(urls.items())))
            yield urls, replicas.healths()
        return
    start_service = service
    if start_service is None:
        from spader.retrieval.service import running_service as start_service
    with start_service(job.index_dir, search, log_path=job.service_log, threads=threads) as url:
        check_retrieval(url, timeout=float(job.retrieval.service.request_timeout_s))
        yield url, [ServiceHealth(url, max_error_rate=max_error_rate)]


def conclude(job: TrainJob, link: RunLink, attempt: Attempt, result: TrainResult) -> dict:
    """``final.json`` of a finished training, or the exception that says how the attempt ended.

    Raises:
        StoppedForResume: verl stopped at a step boundary on request (a time limit ahead, SIGTERM).
        TrainingError: verl failed, the watch stopped it, or it left no usable checkpoint.
    """
    latest = latest_checkpoint(job.ckpt_dir)
    resumes = f"step {latest.step}" if latest else "scratch (no complete checkpoint yet)"
    if result.watch_reason:
        raise TrainingError(
            f"{result.watch_reason}; verl was stopped. Checkpoints are kept in {job.ckpt_dir} and a rerun "
            f"resumes from {resumes}"
        )
    if result.returncode != 0:
        raise TrainingError(
            f"verl exited with code {result.returncode} (see {job.log_path or 'the log above'}); "
            f"checkpoints are kept in {job.ckpt_dir} and a rerun resumes from {resumes}"
        )
    ack = read_stop_ack(job.stop_file)
    if ack is not None and ack.get("early"):
        raise StoppedForResume(result.stop_reason or "stop requested", ack.get("step"))
    return finalize(job, link, attempt)


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
        service: context manager factory ``(index_dir, search settings, *, log_path, threads) -> url``
            (default :func:`spader.retrieval.service.running_service`).
        available_gpus: visible GPUs (None: counted with torch).

    Returns:
        The content of ``final.json``.

    Raises:
        PreflightError: a check failed; nothing was started.
        spader.training.workdir.WorkdirBusyError: another trainer holds the work directory.
        StoppedForResume: verl stopped at a step boundary on request; a rerun resumes.
        TrainingError: verl failed (checkpoints stay in the work directory for the rerun).
    """
    with TimeLimitWatch(job.training.time_limit.warning_s) as watch:  # SLURM's time left, from the start
        lock = claim_workdir(job)
        try:
            try:
                verl_version = preflight(job, available_gpus)
                resume_from = resume_point(job)
            except BaseException as exc:
                _record_early_end(job, exc)
                raise
            link = RunLink.from_active_run(run, job.tracking_uri)
            # a stop asked for before verl runs (the warning, the time left) is kept for it
            with StopControl(job.stop_file) as stop, stop.handling_signals(sigterm=False):
                return _attempt(job, link, stop, resume_from, verl_version, lock, service, watch)
        finally:
            lock.release()


def _record_early_end(job: TrainJob, exc: BaseException) -> None:
    """The end of an attempt that failed before it started verl (no ``start`` record)."""
    record_attempt(
        job.workdir,
        {
            "event": "end",
            "status": _status(exc),
            "phase": "preflight",
            "error": f"{type(exc).__name__}: {exc}",
            "snakemake_attempt": job.attempt,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        },
    )


def _attempt(
    job: TrainJob,
    link: RunLink,
    stop: StopControl,
    resume_from: Checkpoint | None,
    verl_version: str,
    lock: WorkdirLock,
    service: Callable | None,
    watch: TimeLimitWatch | None = None,
) -> dict:
    """One recorded attempt: its start recorded, the launch prepared, verl run, its outcome in
    ``attempts.jsonl`` (with the error and the newest checkpoint when it did not finish)."""
    attempt = record_start(job, link, verl_version, resume_from)
    outcome: dict[str, Any] = {"event": "end", "attempt": attempt.number, "status": "failed"}
    try:
        plan = prepare_launch(job, resume_from, link, watch)
        result = train(job, plan, stop, lock, service)
        outcome["returncode"] = result.returncode
        final = conclude(job, link, attempt, result)
        outcome["status"] = "finished"
        return final
    except BaseException as exc:
        outcome["status"] = _status(exc)
        outcome["error"] = f"{type(exc).__name__}: {exc}"
        latest = latest_checkpoint(job.ckpt_dir)
        outcome["checkpoint_step"] = latest.step if latest else 0
        try:  # what the attempt did, next to its run; never hides the error itself
            link.log_artifacts(
                [job.launch_file, job.resolved_config, *sorted(job.metrics_dir.glob("*.jsonl"))]
            )
        except Exception:
            log.exception("could not log the attempt's files to MLflow")
        raise
    finally:
        stop.clear()
        record_attempt(job.workdir, outcome)


def _status(exc: BaseException) -> str:
    """An attempt's end status in ``attempts.jsonl``: ``stopped`` (at a step boundary, on
    request), ``interrupted`` (a stop signal, a time limit or a lost workflow ended it at once)
    or ``failed`` (anything else: what an automatic retry counts, ``lineage.retry_refusal``)."""
    if isinstance(exc, StoppedForResume):
        return "stopped"
    if isinstance(exc, (Terminated, KeyboardInterrupt)):
        return "interrupted"
    if isinstance(exc, TrainingError) and "the workflow that started this job" in str(exc):
        return "interrupted"
    return "failed"


def measured_and_planned(job: TrainJob, steps: Mapping[int, dict], ckpt: Checkpoint) -> dict[str, dict]:
    """``final.json``'s ``measured`` and ``planned`` sections (:mod:`spader.training.measure`)."""
    planned = read_planned(job.workdir) or planned_section(
        None, device=job.device, name=f"train {job.backbone}/{job.variant}"
    )
    measured = measured_section(
        steps, checkpoint=ckpt.path, host_gib=recorded_host_peak(job.workdir), total_steps=ckpt.step
    )
    return {"measured": measured, "planned": planned}


def finalize(job: TrainJob, link: RunLink, attempt: Attempt) -> dict:
    """Write ``final.json`` of a finished training and log it with the attempt's files."""
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
        "checkpoint": portable_path(ckpt.path),
        "actor_dir": portable_path(ckpt.actor_dir),
        "base_model": str(job.backbone_spec.model),
        "model_dir": portable_path(job.model_dir),
        "config_hash": job.params_hash,
        **attempt.hashes,
        "verl_version": attempt.verl_version,
        "mlflow_run_id": link.run_id,
        "lineage": attempt.lineage,
        "attempt": attempt.number,
        "resumed_from_step": attempt.resume_step,
        "metrics": metrics,
        "val_metrics": val_metrics,
        **measured_and_planned(job, steps, ckpt),
    }
    _write_json(job.final_json, final)
    log_metrics(flat_metrics(final))
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
