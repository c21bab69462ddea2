# Helpers of the training rules (train.smk): the resources a training job asks a scheduler for,
# and the check that a multi-node training has a cluster executor (docs/cluster.md).

from spader.training.allocation import memory_cap_warning, time_limit_problems
from spader.training.plan import load_record, plan_config
from spader.training.stop import slurm_signal_option

TRAINING = CONFIG.training


def profile_max_runtime(rule):
    """The `max_runtime` (minutes) that the profile's set-resources gives `rule` (the partition's
    time limit; None without one). Read from Snakemake's resource settings: a profile cannot set
    config values without taking `--config` away from the command line."""
    resources = workflow.resource_settings.overwrite_resources.get(rule) or {}
    limit = resources.get("max_runtime")
    value = getattr(limit, "value", limit)
    return None if value is None or callable(value) else int(value)


def training_runtime(wildcards):
    """The variant's wall-time estimate, capped by the partition limit the profile states."""
    estimate = TRAINING.time_limit.estimate_minutes(wildcards.variant)
    cap = profile_max_runtime("train_policy")
    return estimate if cap is None else min(estimate, cap)


def training_nodes(wildcards):
    """Nodes of the variant's training job: variants.<name>.nodes, else training.nodes."""
    return CONFIG.training_nodes(wildcards.variant)


def check_training_executor():
    """Refuse a multi-node training job when this run executes its jobs on this machine: only a
    cluster executor (the SLURM profile) gives a job several nodes. Called by the onstart hook
    (which runs before any job, never in dry runs or inside cluster jobs); the job itself refuses
    too outside an allocation (spader.training.run.preflight)."""
    plugin = workflow.executor_plugin
    if plugin is None or not plugin.common_settings.local_exec:
        return
    for job in workflow.dag.needrun_jobs():
        nodes = training_nodes(job.wildcards) if job.rule.name == "train_policy" else 1
        if nodes > 1:
            key = "training.nodes"
            if CONFIG.variants[job.wildcards.variant].nodes is not None:
                key = f"variants.{job.wildcards.variant}.nodes"
            raise WorkflowError(
                f"config key '{key}' is {nodes}, but this run executes jobs on this machine; a "
                "multi-node training job needs a cluster executor (snakemake --profile slurm), see "
                "docs/cluster.md"
            )


def training_gpus(wildcards):
    """GPUs of a single-node job (--gpus); a multi-node job asks per node (training_gres)."""
    return 0 if training_nodes(wildcards) > 1 else config["backbones"][wildcards.backbone]["gpus"]


def training_gres(wildcards):
    """`gpu:<n>` per node for a multi-node job (--gres; --gpus would count the whole job), else
    empty."""
    gpus = config["backbones"][wildcards.backbone]["gpus"]
    return f"gpu:{gpus}" if training_nodes(wildcards) > 1 and gpus > 0 else ""


_PLANNED = {}


def training_request(wildcards):
    """(cpus_per_task, mem_mb) of a training job on each of its nodes: its share of the node's cores
    (hardware.cores) and the host memory its plan needs with headroom, at most its share of
    hardware.host_memory_gib (spader.training.plan.job_request); a CPU training job asks for
    64 GB and its threads. The training jobs are planned together, once; a model the plan has no
    shape for yet (neither downloaded nor shipped) asks for its GPUs' share of the node."""
    spec = CONFIG.backbones[wildcards.backbone]
    if TRAINING.device != "cuda" or spec.gpus < 1:
        return None, 64000
    if not _PLANNED:
        try:
            calibration = load_record(CONFIG)
        except ValueError as exc:
            raise WorkflowError(str(exc))
        models = {b: model_dir(s.model) for b, s in CONFIG.backbones.items()}
        models[CONFIG.judge.model] = model_dir(CONFIG.judge.model)
        try:
            jobs = plan_config(
                CONFIG, VERL_CONFIG_DIR, models=models, calibration=calibration, only=lambda b, v: True
            )
        except ValueError as exc:
            logger.warning(f"the plan cannot size the training jobs ({exc}): they ask for the node's share")
            jobs = []
        _PLANNED["planned"] = True
        for job in jobs:
            if job.name.startswith("train "):  # not a served judge's job
                _PLANNED[job.name] = (job.threads, job.mem_mb)
                for problem in job.problems:
                    logger.warning(f"{job.name}: {problem} (python -m spader.training.plan)")
                check_allocation(job)
    share = min(spec.gpus, CONFIG.hardware.gpus) / CONFIG.hardware.gpus
    fallback = (gpu_job_cpus(spec.gpus), int(CONFIG.hardware.host_memory_gib * share * 1024))
    return _PLANNED.get(f"train {wildcards.backbone}/{wildcards.variant}", fallback)


def check_allocation(job):
    """Warn a capped memory request; under a profile that states the partition's time limit, refuse
    a run that cannot finish within its retries' allocations (spader.training.allocation)."""
    cap_warning = memory_cap_warning(job, job.mem_mb)
    if cap_warning:
        logger.warning(cap_warning)
    cap = profile_max_runtime("train_policy")
    if cap is None:
        return
    variant = job.name.split("/", 1)[1]
    refusal, warning = time_limit_problems(
        job.name,
        run_hours=(job.run_hours(), job.run_hours(end="high")),
        allocation_minutes=min(TRAINING.time_limit.estimate_minutes(variant), cap),
        retries=TRAINING.time_limit.retries,
        limit_source=f"training.time_limit.hours of {variant}, capped by the profile's max_runtime {cap} min",
    )
    if refusal:
        raise WorkflowError(refusal)
    if warning:
        logger.warning(warning)


def training_params():
    """The `training` section without the operational keys (time limits, search error rate):
    editing those retrains nothing (spader.infra.reruns)."""
    return section_params("train_policy", "training")


def training_retries():
    """training.time_limit.retries for the Snakemake process that schedules jobs; none inside a
    cluster job. Snakemake applies a rule's `retries` in the process that runs the job inside the
    allocation too, which would restart a job stopped for its time limit in the allocation that is
    about to end; the retry belongs in a new allocation, submitted by the main process."""
    return 0 if workflow.remote_exec else TRAINING.time_limit.retries
