"""A workflow's start and end, apart from its jobs: the configuration checked and a named run's
own stages (before any rule is defined), what the user must supply (said at every start, checked
before a real run's first job), the expensive outputs a run would replace, and each failed job's
cause. ``workflow/rules/common.smk`` hands over what Snakemake knows (its config files, the jobs
it would run) and logs the lines these return.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from spader.config import Config, ConfigError, check_config, merge_files
from spader.infra.failures import failure_report
from spader.infra.named_runs import default_run_files, own_stages
from spader.infra.replace_guard import PlannedJob
from spader.infra.sources import changed_since_copy, digest_cache_dir
from spader.models.gated import HubTokenError, check_hub_token

from .jobs import DUMP, Jobs


def warnings(config: Config, jobs: Jobs) -> list[str]:
    """One line per thing the user must supply that some job will need: a release file without a
    source (its config key), a gated hub model that no hub token can download."""
    lines = [
        f"config key '{key}' is not set: {hint} (jobs that need it will fail)"
        for key, hint in config.missing_sources()
    ]
    for model in jobs.hub_models():
        try:
            check_hub_token(model, jobs.model_dir(model))
        except HubTokenError as exc:
            lines.append(f"{exc} (jobs that need it will fail)")
    return lines


def default_run_config(
    repo: Path, files: Sequence[str], *, replace_workflow_config: bool, verl_config_dir: Any
) -> tuple[dict[str, Any] | None, str | None]:
    """``(values, None)``: the resolved config of the default run a named run overlays (the
    workflow's file and the ``files`` given before the first that names a run); ``(None,
    warning)`` when it cannot be read or checked: the named run then builds every stage itself."""
    workflow_file = None if replace_workflow_config else repo / "config" / "config.yaml"
    try:
        merged = merge_files(default_run_files(workflow_file, files))
        default = check_config(merged, verl_config_dir=verl_config_dir, check_paths=False)
    except ConfigError as exc:
        return (
            None,
            f"the default run's config cannot be read ({exc}); this named run builds every stage itself",
        )
    return default.model_dump(mode="json"), None


def changed_local_sources(config: Config, repo: Path, default_dir: Path) -> dict[str, list[str]]:
    """``{stage: [what]}`` for the default run's copies (in ``default_dir``) of local sources whose
    content changed since they were made (:mod:`spader.infra.sources`): a named run makes its own."""
    suite, cache = config.suite, digest_cache_dir()
    values = config.model_dump(mode="json")
    datasets = [
        f"datasets.{d}.files.{f} (its content)"
        for d, spec in values["datasets"].items()
        for f, entry in spec["files"].items()
        if changed_since_copy(entry, repo, default_dir / f"resources/{suite}/datasets/{d}/{f}", cache)
    ]
    changed = {"download_dataset": datasets} if datasets else {}
    dump = default_dir / DUMP.format(suite=suite)
    if not config.corpus.sha256 and changed_since_copy(config.corpus.url, repo, dump, cache):
        changed["download_dump"] = ["corpus.url (its content)"]
    return changed


def named_run_stages(
    config: Config,
    repo: Path,
    run_dir: Path | None,
    shared: str,
    files: Sequence[str],
    *,
    replace_workflow_config: bool,
    verl_config_dir: Any,
) -> tuple[dict[str, list[str]], list[str]]:
    """``(stages, warnings)``: the shared stages a named run builds itself, each with why
    (:func:`spader.infra.named_runs.own_stages`), against the default run's config
    (:func:`default_run_config`) and the copies in its working directory (this process's when
    ``run_dir``, where the named run works, is still to be entered; else ``shared`` leads back to it)."""
    default, warning = default_run_config(
        repo, files, replace_workflow_config=replace_workflow_config, verl_config_dir=verl_config_dir
    )
    default_dir = Path.cwd() if run_dir is not None else Path(os.path.normpath(Path.cwd() / shared))
    changed = changed_local_sources(config, repo, default_dir)
    return own_stages(config.model_dump(mode="json"), default, changed), [warning] if warning else []


def missing_before_start(jobs: Iterable[Any], missing: Mapping[str, str]) -> list[str]:
    """One line per thing the user must supply before ``jobs`` (those the run would execute) can
    run: a release file without a configured source (its config key, among ``missing``), a gated
    model without a hub token."""
    problems = []
    for job in jobs:
        wc = job.wildcards
        if job.rule.name == "download_dataset":
            key = f"datasets.{wc.dataset}.files.{wc.file}.url"
            if key in missing:
                problems.append(f"config key '{key}' is not set: {missing[key]}")
        elif job.rule.name == "download_model":
            try:
                check_hub_token(wc.repo.replace("--", "/", 1), job.output[0])
            except HubTokenError as exc:
                problems.append(str(exc))
    return sorted(set(problems))


def planned_jobs(dag: Any) -> list[PlannedJob]:
    """The jobs a run would execute (``dag``: Snakemake's), as the expensive-output guard sees
    them (:mod:`spader.infra.replace_guard`)."""
    jobs = list(dag.needrun_jobs())
    keys = {job: str(i) for i, job in enumerate(jobs)}
    planned = []
    for job in jobs:
        incomplete = {str(f) for f in dag.reason(job).incomplete_output}
        wildcards = ", ".join(f"{k}={v}" for k, v in job.wildcards.items())
        existing = [str(f) for f in job.output if os.path.exists(f) and str(f) not in incomplete]
        upstream = [keys[d] for d in dag.job_dependencies(job) if d in keys]
        forced = bool(dag.reason(job).forced)
        label = f"{job.rule.name} ({wildcards})"
        planned.append(PlannedJob(keys[job], job.rule.name, label, existing, forced, upstream))
    return planned


def failed_job_lines(failed: Iterable[Any], said_of: Callable[[Any], str | None]) -> list[str]:
    """Each job of ``failed`` (a group job's members) with the one-line cause from its log, or
    what ``said_of`` the job (how the process of a job killed outright ended)."""
    jobs = [j for job in failed for j in getattr(job, "jobs", [job])]
    return failure_report(
        (
            job.rule.name,
            ", ".join(f"{k}={v}" for k, v in job.wildcards.items()),
            [str(f) for f in job.log],
            said_of(job),
        )
        for job in sorted(jobs, key=lambda j: (j.rule.name, str(j.wildcards)))
    )
