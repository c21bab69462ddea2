"""What a training job asks a scheduler for (rule ``train_policy``): its nodes, GPUs, CPUs, host
memory and runtime, from the configuration and the plan of every training job
(:mod:`spader.planning.plan`), and the check that a multi-node training has a cluster executor
(docs/cluster.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from spader.config import Config
from spader.planning.plan import load_record, plan_config
from spader.training.allocation import memory_cap_warning, time_limit_problems
from spader.training.stop import slurm_signal_option

from .jobs import Jobs

log = logging.getLogger(__name__)


class AllocationError(ValueError):
    """A training cannot finish within its retries' allocations under the partition's limit."""


class TrainingResources:
    """The resources of the training jobs of ``dag``; the jobs are planned together, once, when
    the first job's request is asked for."""

    def __init__(self, dag: Jobs, max_runtime: int | None = None) -> None:
        """``max_runtime``: the partition's time limit in minutes that the profile states for rule
        ``train_policy`` (:meth:`profile_max_runtime`), None without one."""
        self.dag = dag
        self.config: Config = dag.config
        self.max_runtime = max_runtime
        self._planned: dict[str, tuple[int | None, int]] | None = None

    @staticmethod
    def profile_max_runtime(overwrite_resources: Mapping[str, Any]) -> int | None:
        """The ``max_runtime`` (minutes) the profile's set-resources gives rule ``train_policy``
        (``overwrite_resources``: Snakemake's resource settings), None without one."""
        limit = (overwrite_resources.get("train_policy") or {}).get("max_runtime")
        cap = getattr(limit, "value", limit)
        return None if cap is None or callable(cap) else int(cap)

    def nodes(self, wildcards) -> int:
        """Nodes of the variant's training job: variants.<name>.nodes, else training.nodes."""
        return self.config.training_nodes(wildcards.variant)

    def gpus(self, wildcards) -> int:
        """GPUs of a single-node job (--gpus); a multi-node job asks per node (:meth:`gres`)."""
        return 0 if self.nodes(wildcards) > 1 else self.config.backbones[wildcards.backbone].gpus

    def gres(self, wildcards) -> str:
        """``gpu:<n>`` per node for a multi-node job (--gres; --gpus would count the whole job),
        else empty."""
        gpus = self.config.backbones[wildcards.backbone].gpus
        return f"gpu:{gpus}" if self.nodes(wildcards) > 1 and gpus > 0 else ""

    def runtime(self, wildcards, overwrite_resources: Mapping[str, Any]) -> int:
        """The variant's wall-time estimate, capped by the partition's time limit: the
        ``max_runtime`` (minutes) that the profile's set-resources gives rule ``train_policy``
        (``overwrite_resources``: Snakemake's resource settings; a profile cannot set config values
        without taking ``--config`` away from the command line)."""
        estimate = self.config.training.time_limit.estimate_minutes(wildcards.variant)
        cap = self.profile_max_runtime(overwrite_resources)
        return estimate if cap is None else min(estimate, cap)

    def retries(self, remote_exec: bool) -> int:
        """training.time_limit.retries for the Snakemake process that schedules jobs; none inside a
        cluster job (a retry there would restart a job stopped for its time limit in the
        allocation that is about to end; it belongs in a new one, submitted by the main process)."""
        return 0 if remote_exec else self.config.training.time_limit.retries

    def signal_option(self) -> str:
        """The SLURM option that warns a job ``training.time_limit.warning_s`` before its limit."""
        return slurm_signal_option(self.config.training.time_limit.warning_s)

    def request(self, wildcards) -> tuple[int | None, int]:
        """(cpus_per_task, mem_mb) of a training job on each of its nodes: its share of the node's
        cores (hardware.cores) and the host memory its plan needs with headroom, at most its share
        of hardware.host_memory_gib (:func:`spader.planning.plan.job_request`); a CPU training job
        asks for 64 GB and its threads. A model the plan has no shape for yet (neither downloaded
        nor shipped) asks for its GPUs' share of the node.

        Raises:
            ValueError: the calibration record ``hardware.calibration`` names cannot be read.
        """
        config, spec = self.config, self.config.backbones[wildcards.backbone]
        if config.training.device != "cuda" or spec.gpus < 1:
            return None, 64000
        if self._planned is None:
            self._planned = self._plan()
        share = min(spec.gpus, config.hardware.gpus) / config.hardware.gpus
        fallback = (self.dag.gpu_job_cpus(spec.gpus), int(config.hardware.host_memory_gib * share * 1024))
        return self._planned.get(f"train {wildcards.backbone}/{wildcards.variant}", fallback)

    def _plan(self) -> dict[str, tuple[int | None, int]]:
        """``{job name: (threads, mem_mb)}`` of every training job the plan can size; its problems
        are logged."""
        config, dag = self.config, self.dag
        calibration = load_record(config)
        models = {b: dag.model_dir(s.model) for b, s in config.backbones.items()}
        models[config.judge.model] = dag.model_dir(config.judge.model)
        try:
            jobs = plan_config(
                config, dag.verl_config_dir, models=models, calibration=calibration, only=lambda b, v: True
            )
        except ValueError as exc:
            log.warning(f"the plan cannot size the training jobs ({exc}): they ask for the node's share")
            return {}
        planned = {}
        for job in jobs:
            if job.name.startswith("train "):  # not a served judge's job
                planned[job.name] = (job.threads, job.mem_mb)
                for problem in job.problems:
                    log.warning(f"{job.name}: {problem} (spader plan)")
                self._check_allocation(job)
        return planned

    def _check_allocation(self, job: Any) -> None:
        """Warn a capped memory request; under a profile that states the partition's time limit,
        refuse a run that cannot finish within its retries' allocations
        (:mod:`spader.training.allocation`).

        Raises:
            AllocationError: naming the run's planned hours and the allocations it would get.
        """
        cap_warning = memory_cap_warning(job, job.mem_mb)
        if cap_warning:
            log.warning(cap_warning)
        if self.max_runtime is None:
            return
        variant = job.name.split("/", 1)[1]
        time_limit = self.config.training.time_limit
        refusal, warning = time_limit_problems(
            job.name,
            run_hours=(job.run_hours(), job.run_hours(end="high")),
            allocation_minutes=min(time_limit.estimate_minutes(variant), self.max_runtime),
            retries=time_limit.retries,
            limit_source=f"training.time_limit.hours of {variant}, capped by the profile's max_runtime "
            f"{self.max_runtime} min",
        )
        if refusal:
            raise AllocationError(refusal)
        if warning:
            log.warning(warning)

    def executor_error(self, jobs: Any, local_exec: bool) -> str | None:
        """Why a multi-node training job among ``jobs`` (those a run would execute) cannot run when
        this run executes its jobs on this machine (``local_exec``): only a cluster executor (the
        SLURM profile) gives a job several nodes; None when none is refused."""
        if not local_exec:
            return None
        for job in jobs:
            nodes = self.nodes(job.wildcards) if job.rule.name == "train_policy" else 1
            if nodes > 1:
                key = "training.nodes"
                if self.config.variants[job.wildcards.variant].nodes is not None:
                    key = f"variants.{job.wildcards.variant}.nodes"
                return (
                    f"config key '{key}' is {nodes}, but this run executes jobs on this machine; a "
                    "multi-node training job needs a cluster executor (snakemake --profile slurm), "
                    "see docs/cluster.md"
                )
        return None
