import os
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from spader.config import (
    DATASETS,
    PROMPTING,
    ConfigError,
    check_config,
    hub_slug,
    load_yaml,
    merge_files,
    model_kind,
    named_run_root,
    rebase_run_paths,
    verl_config_chain,
    verl_config_dir,
)
from spader.core.prompt import load_template
from spader.methods import table_rows, verl_yaml
from spader.infra.failures import console_causes, failure_report
from spader.infra.rerun import PlannedJob, guard_message, unintended_replacements
from spader.infra.slurm_env import keep_slurm_conf_for_srun
from spader.models.gated import HubTokenError, check_hub_token
from spader.integrations.verl.overrides import shared_training_runs
from spader.infra.reruns import canonical, for_rule
from spader.infra.named_runs import default_run_files, own_stages, summary
from spader.infra.sources import changed_since_copy, digest_cache_dir, planned_sha256, source_sha256
from spader.infra.stage_code import code_cache_dir, planned_code, stage_fingerprints, stage_group
from spader.training.scorer_launch import judge_params

# The repository that holds this workflow. Files shipped with the workflow (default config, verl
# YAMLs, schemas, report captions, bundled demo files) resolve against it; outputs against the
# working directory (`snakemake -d DIR` or the current directory).
REPO = Path(workflow.basedir).parent

# Inside a SLURM job: the srun that the SLURM executor runs each job with keeps the allocation's
# SLURM_CONF, which the plugin removes (spader.infra.slurm_env; docs/cluster.md).
if workflow.remote_exec:
    keep_slurm_conf_for_srun(REPO / "profiles" / "slurm" / "bin")


def workflow_file(path):
    """A file shipped with the workflow, relative to the working directory when it lies inside it
    (job inputs and params then do not change with where the repository is checked out), else
    absolute (running with `-d` elsewhere)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------
# Configuration (spader.config): checked against the typed model, every error naming its key,
# before any rule is defined. CONFIG is the configuration as typed objects, and `config` becomes
# its values (every default filled in, each value in its key's type: `beta: 4` reads 4.0), what
# the params below and the jobs' `snakemake.config` hold.
# ---------------------------------------------------------------------------------------------
VERL_CONFIG_DIR = verl_config_dir(REPO)
# Snakemake's YAML loader keeps the last of a key given twice (a section written twice loses the
# first silently): the config files are read again with a loader that refuses it, naming key and file.
for _configfile in workflow.configfiles:
    load_yaml(_configfile)
CONFIG = check_config(config, verl_config_dir=VERL_CONFIG_DIR)
config.clear()
config.update(CONFIG.model_dump(mode="json"))
# What the user must supply is said at every start (a dry run included); a real run whose jobs need
# it stops before its first job (check_before_start).
MISSING_SOURCES = dict(CONFIG.missing_sources())
if not workflow.remote_exec:
    for _key, _hint in MISSING_SOURCES.items():
        logger.warning(f"config key '{_key}' is not set: {_hint} (jobs that need it will fail)")


# ---------------------------------------------------------------------------------------------
# A named run (config key `run`, e.g. config/authors.yaml) works in a directory of its own,
# results/runs/<run>/ (its results/, logs/, .snakemake/): its outputs never overwrite the default
# run's, and the two can run at once. A stage that does not depend on what the run changes is
# shared with the default run, whose working directory SHARED leads back to (downloads, tiny
# models, the demo's warm start, results/<suite>/: index, normalized data, mix, evaluation sets,
# evidence); a stage one of whose settings differs from the default run's, and every shared stage
# reading it, is the run's own (OWN_STAGES, spader.infra.named_runs). Their paths go through
# stage(). Paths of the config that are relative to the default run's directory are rebased. A
# cluster job starting in the run's directory is already there.
# ---------------------------------------------------------------------------------------------
def default_run_config():
    """The resolved config of the default run this named run overlays (the workflow's file and the
    --configfile files before the first that names a run), or None when it cannot be read or
    checked: this run then builds every stage itself."""
    workflow_file = (
        None if workflow.config_settings.replace_workflow_config else REPO / "config" / "config.yaml"
    )
    try:
        files = default_run_files(workflow_file, workflow.overwrite_configfiles)
        default = check_config(merge_files(files), verl_config_dir=VERL_CONFIG_DIR, check_paths=False)
    except ConfigError as exc:
        logger.warning(
            f"the default run's config cannot be read ({exc}); this named run builds every stage itself"
        )
        return None
    return default.model_dump(mode="json")


def changed_local_sources(default_dir):
    """`{stage: [what]}` for the default run's copies (in `default_dir`) of local sources whose
    content changed since they were made (spader.infra.sources): this run makes its own."""
    suite, cache = config["suite"], digest_cache_dir()
    datasets = [
        f"datasets.{d}.files.{f} (its content)"
        for d, spec in config["datasets"].items()
        for f, entry in spec["files"].items()
        if changed_since_copy(entry, REPO, default_dir / f"resources/{suite}/datasets/{d}/{f}", cache)
    ]
    dump = default_dir / f"resources/{suite}/corpus/chunked_wikipedia.tar.gz"
    changed = {"download_dataset": datasets} if datasets else {}
    if not config["corpus"]["sha256"] and changed_since_copy(config["corpus"]["url"], REPO, dump, cache):
        changed["download_dump"] = ["corpus.url (its content)"]
    return changed


_RUN_DIR, SHARED = named_run_root(CONFIG.run, Path.cwd())
OWN_STAGES = {}
if SHARED:
    _DEFAULT_DIR = Path.cwd() if _RUN_DIR is not None else Path(os.path.normpath(Path.cwd() / SHARED))
    OWN_STAGES = own_stages(config, default_run_config(), changed_local_sources(_DEFAULT_DIR))
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


def shared(path):
    """`path` of the default run's working directory, seen from this run's (itself in the
    default run)."""
    return SHARED + path


def stage(rule, path):
    """`path`, an output of the shared stage `rule`: in the default run's working directory
    unless this named run builds that stage itself."""
    return path if rule in OWN_STAGES else shared(path)


SUITE = config["suite"]
VARIANTS = list(config["variants"])

# The prompt template (agent.prompt_template, or the project's default file) is read by the jobs,
# not imported: its hash is the param that reruns data export (and so training) and evaluation.
PROMPT = {
    "path": config["agent"]["prompt_template"],
    "version": load_template(config["agent"]["prompt_template"]).version,
}

# Variants whose resolved training config is identical (no_np and beta_0, spader and beta_4 in the
# paper setup) share one training run per backbone: the first of them in the backbone's list.
TRAINING_RUN = {
    b: shared_training_runs(spec["variants"], config["variants"], config["training"], VERL_CONFIG_DIR)
    for b, spec in config["backbones"].items()
}

# ---------------------------------------------------------------------------------------------
# Code fingerprints: a param of every rule that computes something, so that editing the package
# reruns exactly the stages whose scripts can execute the edited module (spader.infra.stage_code).
# Downloads have none: their outputs are fixed by their source. What the fingerprints read of each
# source file is cached on its bytes in the user's cache directory, so a start parses only what changed.
# ---------------------------------------------------------------------------------------------
CODE = stage_fingerprints(Path(workflow.basedir) / "scripts", cache_dir=code_cache_dir())


def code_of(name):
    """The `code` param of the jobs of rule `name`, i.e. the fingerprint of its script
    workflow/scripts/<name>.py and of the modules it runs. With `code_reruns.<its group>` off, a
    job whose output exists keeps the param it was built with (recorded with the output), so a
    code change reruns nothing."""
    if name not in CODE:
        raise WorkflowError(f"no script workflow/scripts/{name}.py to fingerprint")
    if getattr(CONFIG.code_reruns, stage_group(name)):
        return CODE[name]
    return lambda wildcards: planned_code(CODE[name], first_output(name, wildcards), reruns=False)


def first_output(name, wildcards):
    """The first output file of a job of the rule called `name` (where its integrity record is)."""
    pattern = getattr(rules, name).output[0]
    return expand(pattern, **dict(wildcards.items()))[0]


# ---------------------------------------------------------------------------------------------
# Params: what a job's outputs depend on, and nothing else (spader.infra.reruns). Snakemake reruns
# a job whose params changed (their repr, compared as text), so each one is canonical: maps with
# sorted keys, values in their keys' types, lists that act as sets sorted without repeats. A
# section a rule takes whole leaves out the keys that do not rerun that rule (operational
# settings, table-only settings); the jobs read those from their config.
# ---------------------------------------------------------------------------------------------
def section_params(rule, *path):
    """The config section at `path` (dotted parts) as rule `rule`'s param."""
    values = config
    for part in path:
        values = values[part]
    return canonical(for_rule(rule, path, values), path)


def _alternatives(names):
    return "|".join(re.escape(n) for n in names) if names else "(?!x)x"


wildcard_constraints:
    suite=re.escape(SUITE),
    dataset=_alternatives(DATASETS),
    split="train|test",
    backbone=_alternatives(config["backbones"]),
    variant=_alternatives(VARIANTS),
    method=_alternatives(VARIANTS + list(PROMPTING)),
    file="[A-Za-z0-9._-]+",
    repo="[A-Za-z0-9._-]+--[A-Za-z0-9._-]+",
    kind="qwen3|reranker",


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------
def get_final_output():
    """Tables of every target backbone, plus the training data of the suite (built even when no
    configured backbone trains, as in the CPU demo)."""
    return expand("results/{backbone}/f1.tsv", backbone=config["targets"]) + expand(
        "results/{suite}/data/verl/{split}.parquet", suite=SUITE, split=["train", "val"]
    )


def default_run_evaluations(backbone):
    """The default run's evaluation summaries and records of this (named) run's methods: what
    rule compare_runs compares against (the default run makes them; no rule here does)."""
    return expand(
        shared("results/{backbone}/eval/{method}/{dataset}.{ext}"),
        backbone=backbone,
        method=methods_of(backbone),
        dataset=DATASETS,
        ext=["json", "jsonl"],
    )


def methods_of(backbone):
    spec = config["backbones"][backbone]
    return list(spec["variants"]) + list(spec["prompting"])


# ---------------------------------------------------------------------------------------------
# Models: hub ids are downloaded once into resources/models/hub/, tiny:<kind> models are built
# locally (demo, smoke tests), local paths are used as they are.
# ---------------------------------------------------------------------------------------------
def model_dir(name):
    kind = model_kind(name)
    if kind == "tiny":
        return stage("build_tiny_model", f"results/models/tiny/{name.split(':', 1)[1]}")
    if kind == "hub":
        return stage("download_model", f"resources/models/hub/{hub_slug(name)}")
    return name


# A gated model (Llama) needs a hub token for its download: said at every start, a dry run included
# (a real run whose jobs download it stops before its first job: check_before_start).
if not workflow.remote_exec:
    _hub_models = {
        spec["model"]
        for spec in [*config["backbones"].values(), config["judge"], config["retrieval"]["reranker"]]
        if spec.get("model") and model_kind(spec["model"]) == "hub"
    }
    for _model in sorted(_hub_models):
        try:
            check_hub_token(_model, model_dir(_model))
        except HubTokenError as _exc:
            logger.warning(f"{_exc} (jobs that need it will fail)")


def hub_revision(repo):
    """The pinned revision of hub repository `repo` (`org--name`), from the config entries that
    name it (backbones and the reranker share one download per repository)."""
    specs = [*config["backbones"].values(), config["retrieval"]["reranker"], config["judge"]]
    revisions = {
        s.get("revision")
        for s in specs
        if s.get("model") and model_kind(s["model"]) == "hub" and hub_slug(s["model"]) == repo
    }
    if len(revisions) > 1:
        raise WorkflowError(
            f"hub model {repo.replace('--', '/', 1)} is configured with revisions {revisions}"
        )
    return revisions.pop() if revisions else None


def backbone_params(backbone):
    """What training needs of `backbones.<backbone>` (not its method lists: adding a prompting baseline
    must not retrain)."""
    return section_params("train_policy", "backbones", backbone)


def get_base_model(wildcards):
    """The backbone's model as built (tiny) or released."""
    return model_dir(config["backbones"][wildcards.backbone]["model"])


def get_backbone_model(wildcards):
    """The policy the backbone's methods start from: its warm start (rule warmstart_policy) when
    `backbones.<name>.warmstart` is set (tiny models only), else the model itself."""
    if config["backbones"][wildcards.backbone].get("warmstart"):
        return stage("warmstart_policy", f"results/{wildcards.backbone}/warmstart/model")
    return get_base_model(wildcards)


def get_policy_model(wildcards):
    if wildcards.method in PROMPTING:
        return get_backbone_model(wildcards)
    return f"results/{wildcards.backbone}/models/{training_run(wildcards.backbone, wildcards.method)}"


def training_run(backbone, variant):
    """The variant whose training run `variant` evaluates (itself unless an identical one comes
    first in the backbone's variants)."""
    return TRAINING_RUN[backbone][variant]


def variant_params(variant):
    """A variant's training settings, its verl YAML resolved (its method's when it names none)."""
    params = section_params("train_policy", "variants", variant)
    return canonical({**params, "verl_config": verl_yaml(config["variants"][variant])})


def topics_file():
    """The evaluation questions' topics file (`evaluation.topics`, relative to the repository, as
    the demo's bundled files are) as the tables' input, or none."""
    topics = config["evaluation"]["topics"]
    return [workflow_file(REPO / topics)] if topics else []


def table_variants():
    """`[[variant, table row], ...]` of every configured variant in config order
    (spader.methods.table_rows): the ablation and beta-sweep rows and the plots' order, nothing of
    a variant's training, so that editing it does not rerun the tables of backbones that skip it."""
    return canonical(table_rows(config["variants"]))


def shared_runs_of(backbone):
    """`{variant: the variant whose training run it evaluates}` for the backbone's variants."""
    return {v: training_run(backbone, v) for v in config["backbones"][backbone]["variants"]}


def trained_runs_of(backbone):
    """The backbone's training runs (variants sharing one run count once)."""
    return list(dict.fromkeys(shared_runs_of(backbone).values()))


def agent_params():
    """The turn settings shared by training and evaluation (the template is a param of its own)."""
    return canonical({k: v for k, v in config["agent"].items() if k != "prompt_template"}, ("agent",))


def get_reranker(wildcards):
    name = config["retrieval"]["reranker"]["model"]
    return [] if name in (None, "none") else [model_dir(name)]


def retrieval_params(rule):
    """Search settings that can change what rule `rule`'s searches return (the reranker given by
    its resolved local directory); jobs add the operational ones (host, timeouts, retries, cache)
    from their config (spader.infra.glue.retrieval_settings)."""
    settings = section_params(rule, "retrieval")
    if config["retrieval"]["reranker"]["model"] not in (None, "none"):
        settings["reranker"]["path"] = model_dir(config["retrieval"]["reranker"]["model"])
    return canonical(settings)


# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------
def get_dump(wildcards):
    return config["corpus"]["archive"] or stage(
        "download_dump", f"resources/{SUITE}/corpus/chunked_wikipedia.tar.gz"
    )


def dump_sha256():
    """The sha256 the dump's download must have, its param: `corpus.sha256`, else the content of a
    local file (spader.infra.sources: a dump replaced in place is copied again, and what is built
    from it rebuilt)."""
    if config["corpus"]["sha256"]:
        return config["corpus"]["sha256"]
    digest = source_sha256(config["corpus"]["url"], REPO, digest_cache_dir())
    return planned_sha256(
        digest, stage("download_dump", f"resources/{SUITE}/corpus/chunked_wikipedia.tar.gz")
    )


def get_index(wildcards=None):
    return config["corpus"]["prebuilt_index"] or stage("build_bm25_index", f"results/{SUITE}/index/bm25")


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------
def dataset_source(wildcards):
    """A release file's config entry as its download's param; a local file's with the sha256 of
    its content, which the copy must have (spader.infra.sources: a release edited or replaced in
    place is copied again, and what is built from it rebuilt)."""
    entry = config["datasets"][wildcards.dataset]["files"][wildcards.file]
    copy = stage("download_dataset", f"resources/{SUITE}/datasets/{wildcards.dataset}/{wildcards.file}")
    digest = planned_sha256(source_sha256(entry, REPO, digest_cache_dir()), copy)
    return canonical({**entry, "sha256": digest} if digest else entry)


def get_split_source(wildcards):
    split = config["datasets"][wildcards.dataset]["splits"][wildcards.split]
    return stage(
        "download_dataset", f"resources/{wildcards.suite}/datasets/{wildcards.dataset}/{split['file']}"
    )


def get_split_member(wildcards):
    return config["datasets"][wildcards.dataset]["splits"][wildcards.split].get("member")


def get_mix_datasets():
    """Datasets the mix draws from (mix.counts > 0); only their normalized files are inputs."""
    return CONFIG.mix.drawn


def get_mix_files(split):
    """Normalized files the mix reads: the train splits of the datasets it draws from, the test
    splits of every dataset (an evaluation question of any dataset stays out of the mix)."""
    return expand(
        stage("normalize_dataset", "results/{{suite}}/data/normalized/{dataset}/{split}.jsonl"),
        dataset=get_mix_datasets() if split == "train" else DATASETS,
        split=split,
    )


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def get_verl_configs(wildcards):
    """The variant's verl YAML and the project YAMLs it inherits from (shipped with the workflow)."""
    chain = verl_config_chain(verl_yaml(config["variants"][wildcards.variant]), VERL_CONFIG_DIR)
    return [workflow_file(p) for p in chain]


def evaluation_params():
    """The `evaluation` param of evaluate_policy, the settings that can change a score (not the
    tables' bootstrap, not the job's threads), with the context budget resolved."""
    budget = {"max_context_tokens": CONFIG.evaluation_context_tokens}
    return canonical({**section_params("evaluate_policy", "evaluation"), **budget})


def get_eval_threads():
    """Threads of an evaluation job: the node's share on a GPU, ``evaluation.cpu_threads`` without."""
    if config["evaluation"]["gpus"] > 0:
        return get_gpu_job_threads()
    return CONFIG.evaluation.cpu_threads


def get_gpu_job_threads():
    """GPU jobs take every core of a workstation run, so Snakemake runs them one at a time
    (it never assigns GPUs itself). A cluster job asks for its CPUs with the `cpus_per_task`
    resource (gpu_job_cpus, training_request) and, inside its allocation, runs with the cores it
    was given (the job's Snakemake runs with --cores all)."""
    try:
        return workflow.cores
    except WorkflowError:
        return 1


def gpu_job_cpus(gpus):
    """--cpus-per-task of a job holding `gpus` GPUs of a node: its share of the node's cores
    (hardware.cores x gpus / hardware.gpus); None without GPUs (SLURM follows the job's threads)."""
    if gpus < 1:
        return None
    hardware = CONFIG.hardware
    return max(1, hardware.cores * min(gpus, hardware.gpus) // hardware.gpus)


# ---------------------------------------------------------------------------------------------
# Step-level baselines (docs/baselines.md): StepSearch's evidence, R3-RAG's judge
# ---------------------------------------------------------------------------------------------
def get_evidence(wildcards):
    """StepSearch's evidence for a variant that needs it, else nothing."""
    if config["variants"][wildcards.variant]["reward"] != "stepsearch":
        return []
    return stage("build_evidence", f"results/{SUITE}/data/evidence/train.jsonl")


def get_judge_model(wildcards):
    """The judge model directory for a variant that serves the LLM judge, else nothing."""
    params = judge_params(config["variants"][wildcards.variant], config["judge"])
    if params is None or config["judge"]["url"]:
        return []
    return model_dir(config["judge"]["model"])


def get_evidence_release(wildcards):
    """The QAMPARI train release when evidence comes from its proof_text, else nothing."""
    if not config["stepsearch"]["evidence"]["qampari_proof_text"]:
        return []
    split = config["datasets"]["qampari"]["splits"]["train"]
    return stage("download_dataset", f"resources/{SUITE}/datasets/qampari/{split['file']}")


# ---------------------------------------------------------------------------------------------
# Before the first job, after it: what the user must supply, and why a job failed
# ---------------------------------------------------------------------------------------------
def missing_before_start(jobs):
    """One line per thing the user must supply before `jobs` (those the run would execute) can run:
    a release file without a configured source (its config key), a gated model without a hub token."""
    problems = []
    for job in jobs:
        wc = job.wildcards
        if job.rule.name == "download_dataset":
            key = f"datasets.{wc.dataset}.files.{wc.file}.url"
            if key in MISSING_SOURCES:
                problems.append(f"config key '{key}' is not set: {MISSING_SOURCES[key]}")
        elif job.rule.name == "download_model":
            try:
                check_hub_token(wc.repo.replace("--", "/", 1), job.output[0])
            except HubTokenError as exc:
                problems.append(str(exc))
    return sorted(set(problems))


def planned_jobs(dag):
    """The jobs this run would execute, as the expensive-output guard sees them
    (spader.infra.rerun)."""
    jobs = list(dag.needrun_jobs())
    keys = {job: str(i) for i, job in enumerate(jobs)}
    planned = []
    for job in jobs:
        incomplete = {str(f) for f in dag.reason(job).incomplete_output}
        wildcards = ", ".join(f"{k}={v}" for k, v in job.wildcards.items())
        existing = [str(f) for f in job.output if os.path.exists(f) and str(f) not in incomplete]
        upstream = [keys[d] for d in dag.job_dependencies(job) if d in keys]
        forced = bool(dag.reason(job).forced)
        # (key, rule, label, existing outputs, forced, upstream keys)
        planned.append(
            PlannedJob(keys[job], job.rule.name, f"{job.rule.name} ({wildcards})", existing, forced, upstream)
        )
    return planned


def check_before_start():
    """The onstart hook's checks (a real run, main process, before any job): a multi-node training
    needs a cluster executor, the jobs to run must have what only the user can supply, and no
    expensive output is replaced unless this run was asked to (spader.infra.rerun)."""
    check_training_executor()
    problems = missing_before_start(workflow.dag.needrun_jobs())
    if problems:
        raise WorkflowError("this run cannot start:\n" + "\n".join(problems))
    blocked = unintended_replacements(planned_jobs(workflow.dag))
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
    jobs = [j for job in failed for j in getattr(job, "jobs", [job])]  # a group job's members
    lines = failure_report(
        (
            job.rule.name,
            ", ".join(f"{k}={v}" for k, v in job.wildcards.items()),
            [str(f) for f in job.log],
            _said_of(job),
        )
        for job in sorted(jobs, key=lambda j: (j.rule.name, str(j.wildcards)))
    )
    if lines:
        logger.error("Failed jobs and their causes:\n  " + "\n  ".join(lines))
