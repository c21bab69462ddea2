import os
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from spader.config import (
    DATASETS,
    check_config,
    in_file_order,
    load_yaml,
    named_run_root,
    rebase_run_paths,
    verl_config_dir,
)
from spader.dag import Jobs, TrainingResources, start
from spader.infra.failures import console_causes
from spader.infra.named_runs import summary
from spader.infra.replace_guard import guard_message, unintended_replacements
from spader.infra.rerun_keys import canonical
from spader.infra.slurm_env import keep_slurm_conf_for_srun
from spader.infra.stage_code import code_cache_dir, planned_code, stage_fingerprints, stage_group

# The repository that holds this workflow. Files shipped with the workflow (default config, verl
# YAMLs, schemas, report captions, bundled demo files) resolve against it; outputs against the
# working directory (`snakemake -d DIR` or the current directory).
REPO = Path(workflow.basedir).parent

# Inside a SLURM job: the srun that the SLURM executor runs each job with keeps the allocation's
# SLURM_CONF, which the plugin removes (spader.infra.slurm_env; docs/cluster.md).
if workflow.remote_exec:
    keep_slurm_conf_for_srun(REPO / "profiles" / "slurm" / "bin")

# ---------------------------------------------------------------------------------------------
# Configuration (spader.config): checked against the typed model, every error naming its key,
# before any rule is defined. CONFIG is the configuration as typed objects, the only view the
# rules read, and `config` becomes its values (every default filled in, each value in its key's
# type: `beta: 4` reads 4.0), what the jobs' `snakemake.config` holds. Snakemake's YAML loader
# keeps the last of a key given twice: the config files are read again with one that refuses it.
# ---------------------------------------------------------------------------------------------
VERL_CONFIG_DIR = verl_config_dir(REPO)
for _configfile in workflow.configfiles:
    load_yaml(_configfile)
# variants in the order the files define them (Snakemake's merge puts an overlay's first)
config.update(in_file_order(config, [REPO / "config" / "config.yaml", *workflow.overwrite_configfiles]))
CONFIG = check_config(config, verl_config_dir=VERL_CONFIG_DIR)
config.clear()
config.update(CONFIG.model_dump(mode="json"))

# ---------------------------------------------------------------------------------------------
# A named run (config key `run`, e.g. config/authors.yaml) works in results/runs/<run>/: its
# outputs never overwrite the default run's. A stage that does not depend on what the run changes
# is shared with the default run, whose working directory SHARED leads back to; a stage one of
# whose settings differs, and every shared stage reading it, is the run's own (OWN_STAGES,
# spader.infra.named_runs). Their paths go through JOBS.stage(); config paths are rebased.
# ---------------------------------------------------------------------------------------------
_RUN_DIR, SHARED = named_run_root(CONFIG.run, Path.cwd())
OWN_STAGES = {}
if SHARED:
    OWN_STAGES, _warnings = start.named_run_stages(
        CONFIG,
        REPO,
        _RUN_DIR,
        SHARED,
        workflow.overwrite_configfiles,
        replace_workflow_config=workflow.config_settings.replace_workflow_config,
        verl_config_dir=VERL_CONFIG_DIR,
    )
    for _line in _warnings:
        logger.warning(_line)
    if not workflow.remote_exec:
        logger.info(summary(CONFIG.run, OWN_STAGES))
if _RUN_DIR is not None:
    _RUN_DIR.mkdir(parents=True, exist_ok=True)
    if workflow.overwrite_workdir is None:
        workflow.workdir(str(_RUN_DIR))
    else:  # `-d` disables Snakemake's workdir directive; the jobs it spawns get the same `-d`
        os.chdir(_RUN_DIR)
if SHARED:
    config.update(rebase_run_paths(config, SHARED))
    CONFIG = check_config(config, verl_config_dir=VERL_CONFIG_DIR)

# The jobs of the DAG: their inputs, params (what reruns them, spader.infra.rerun_keys), models,
# shared training runs and table rows (spader.dag), and what a training job asks for.
JOBS = Jobs(CONFIG, REPO, VERL_CONFIG_DIR, own_stages=OWN_STAGES, shared=SHARED)
TRAINING = TrainingResources(
    JOBS, TrainingResources.profile_max_runtime(workflow.resource_settings.overwrite_resources)
)
SUITE = CONFIG.suite
stage = JOBS.stage

workflow.global_wildcard_constraints(**JOBS.wildcard_constraints())

# What the user must supply (release files without a source, a gated model's hub token) is said at
# every start, a dry run included; a real run whose jobs need it stops before its first job
# (check_before_start).
if not workflow.remote_exec:
    for _line in start.warnings(CONFIG, JOBS):
        logger.warning(_line)

# ---------------------------------------------------------------------------------------------
# Code fingerprints: a param of every rule that computes something, so that editing the package
# reruns exactly the stages whose scripts can execute the edited module (spader.infra.stage_code).
# Downloads have none: their outputs are fixed by their source. What the fingerprints read of
# each source file is cached on its bytes in the user's cache directory.
# ---------------------------------------------------------------------------------------------
CODE = stage_fingerprints(Path(workflow.basedir) / "scripts", cache_dir=code_cache_dir())


def code_of(name):
    """The `code` param of the jobs of the rule called `name`, the fingerprint of its script and of the
    modules it runs. With `code_reruns.<its group>` off, a job whose output exists keeps the param
    it was built with (recorded with the output), so a code change reruns nothing."""
    if name not in CODE:
        raise WorkflowError(f"no script workflow/scripts/{name}.py to fingerprint")
    if getattr(CONFIG.code_reruns, stage_group(name)):
        return CODE[name]
    return lambda wildcards: planned_code(CODE[name], first_output(name, wildcards), reruns=False)


def first_output(name, wildcards):
    """The first output file of a job of the rule called `name` (where its integrity record is)."""
    return expand(getattr(rules, name).output[0], **dict(wildcards.items()))[0]


def gpu_job_threads():
    """GPU jobs take every core of a workstation run, so Snakemake runs them one at a time (it
    never assigns GPUs itself). A cluster job asks for its CPUs with the `cpus_per_task` resource
    and, inside its allocation, runs with the cores it was given (--cores all)."""
    try:
        return workflow.cores
    except WorkflowError:
        return 1


# ---------------------------------------------------------------------------------------------
# Before the first job, after it: what the user must supply, and why a job failed
# ---------------------------------------------------------------------------------------------
def check_before_start():
    """The onstart hook's checks (a real run, main process, before any job): a multi-node training
    needs a cluster executor, the jobs to run must have what only the user can supply, and no
    expensive output is replaced unless this run was asked to (spader.infra.replace_guard)."""
    plugin = workflow.executor_plugin
    local = plugin is not None and plugin.common_settings.local_exec
    refused = TRAINING.executor_error(workflow.dag.needrun_jobs(), local)
    if refused:
        raise WorkflowError(refused)
    problems = start.missing_before_start(workflow.dag.needrun_jobs(), dict(CONFIG.missing_sources()))
    if problems:
        raise WorkflowError("this run cannot start:\n" + "\n".join(problems))
    blocked = unintended_replacements(start.planned_jobs(workflow.dag))
    if blocked:
        raise WorkflowError(guard_message(blocked))


# What Snakemake logs of a failed job's process (a script killed by a signal): the cause of a job
# killed outright, which cannot write one (spader.infra.failures.JobErrors).
# Under a cluster executor a job's stderr is its cluster log: its cause is echoed as it fails.
JOB_ERRORS = console_causes(logger, workflow)


def _said_of(job):
    try:
        return JOB_ERRORS.said.get(workflow.dag.jobid(job))
    except Exception:  # noqa: BLE001 (a job the DAG no longer knows: its log alone)
        return None


def report_failed_jobs():
    """The onerror hook: each job that failed for good, with the one-line cause from its log (or,
    for a job killed outright, how its process ended)."""
    failed = getattr(getattr(workflow, "scheduler", None), "failed", None) or ()
    lines = start.failed_job_lines(failed, _said_of)
    if lines:
        logger.error("Failed jobs and their causes:\n  " + "\n  ".join(lines))
