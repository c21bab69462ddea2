"""The jobs of a workflow DAG and what a change reruns, through Snakemake's API (no dry-run text).

Snakemake reruns a job when its params or inputs change, and then everything downstream of it.
:func:`dag_jobs` builds the DAG for a target with every job's params, inputs and dependencies;
:func:`affected` compares two builds (before and after a change) and closes the changed set over
the dependencies, which is the set of jobs a real run would execute again.

Run as a script (``python dag_jobs.py SPEC.json``) it builds the DAG of a copy of the repository
before and after each of a list of file edits and prints the affected jobs as JSON: the package
the copy's workflow imports must be the copy's own ``src/`` (``PYTHONPATH``), so that the code
fingerprints see the edits, which a test process that already imported ``spader`` cannot.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from snakemake.api import SnakemakeApi
from snakemake.settings.enums import Quietness
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

Key = tuple[str, tuple[tuple[str, str], ...]]


def _with_dag(config: dict, target: str, repo: Path, workdir: Path | None, visit):
    """Build the DAG of ``target`` and return ``visit(dag)``."""
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf_api = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(config=config, replace_workflow_config=True),
            snakefile=repo / "workflow" / "Snakefile",
            workdir=workdir or repo,
        )
        dag_api = wf_api.dag(DAGSettings(targets={target}, forceall=True))
        wf = dag_api.workflow_api._workflow  # internal, pinned snakemake 9.27.1 (as printdag does)
        wf._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
        wf._build_dag()
        return visit(wf.dag)


def dag_jobs(config: dict, target: str, repo: Path, workdir: Path | None = None) -> dict:
    """``{(rule, sorted wildcards): (params repr, input paths, dependency keys)}`` for ``target``.

    Args:
        config: the whole config (replaces the workflow's default config).
        target: file to build.
        repo: repository whose ``workflow/Snakefile`` is used.
        workdir: working directory (default: ``repo``).
    """

    def visit(dag):
        out = {}
        for job in dag.jobs:
            key = (job.rule.name, tuple(sorted(job.wildcards_dict.items())))
            params = repr(sorted((k, repr(v)) for k, v in job.params.items()))
            deps = {(d.rule.name, tuple(sorted(d.wildcards_dict.items()))) for d in dag.dependencies[job]}
            out[key] = (params, tuple(sorted(map(str, job.input))), deps)
        return out

    return _with_dag(config, target, repo, workdir, visit)


def record_as_built(config: dict, target: str, repo: Path) -> int:
    """Stand in for a finished run (none can run here: training needs GPUs): every computing job's
    first output is created and recorded as its job records it, with the code param it ran with."""
    from spader.infra import integrity

    def visit(dag):
        n = 0
        for job in dag.jobs:
            params = dict(job.params.items())
            if "code" not in params:
                continue
            out = Path(repo) / str(job.output[0])
            if out.exists():
                continue
            if getattr(job.output[0], "is_directory", False):
                out.mkdir(parents=True)
                (out / "stand-in").write_text("stand-in output\n")
            else:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text("stand-in output\n")
            integrity.write_record(out, producer=job.rule.name, rows=0, extra={"code": str(params["code"])})
            n += 1
        return n

    return _with_dag(config, target, repo, None, visit)


def affected(before: dict, after: dict, changed_input: str | None = None) -> set[tuple[str, str | None]]:
    """Jobs a rerun executes: changed params (or an input path containing ``changed_input``) plus
    everything downstream; as ``(rule, variant or method or dataset)``."""
    changed = {k for k in after if k not in before or before[k][0] != after[k][0]}
    if changed_input:
        changed |= {k for k, v in after.items() if changed_input in v[1]}
    grew = True
    while grew:
        grew = False
        for k, (_, _, deps) in after.items():
            if k not in changed and deps & changed:
                changed.add(k)
                grew = True
    return {
        (rule, dict(wc).get("variant") or dict(wc).get("method") or dict(wc).get("dataset"))
        for rule, wc in changed
    }


def _key(job: tuple[str, str | None]) -> tuple[str, str]:
    return job[0], job[1] or ""


def _edit_each(spec: dict) -> dict:
    """Build the DAG once, then once per edit, restoring the file after each. An edit is
    ``[path, text]`` (append ``text``) or ``[path, old, new]`` (replace the one occurrence).
    With ``spec["after_config"]``, the DAGs after the edits are built with that config (a switch
    turned off), once every job's output was recorded as built (:func:`record_as_built`).
    Returns ``{"all": every job, "edits": {name: the jobs the edit reruns}}``."""
    repo = Path(spec["repo"])
    before = dag_jobs(spec["config"], spec["target"], repo)
    after_config = spec.get("after_config") or spec["config"]
    if spec.get("after_config"):
        record_as_built(spec["config"], spec["target"], repo)
    everything = affected({}, before)  # every job is new to an empty DAG
    out = {}
    for name, (rel, *change) in spec["edits"].items():
        path = repo / rel
        original = path.read_text(encoding="utf-8")
        if len(change) == 1:
            edited = original + change[0]
        else:
            if original.count(change[0]) != 1:
                raise ValueError(f"edit {name!r}: {change[0]!r} is not in {rel} exactly once")
            edited = original.replace(change[0], change[1])
        path.write_text(edited, encoding="utf-8")
        try:
            after = dag_jobs(after_config, spec["target"], repo)
        finally:
            path.write_text(original, encoding="utf-8")
        out[name] = sorted(affected(before, after), key=_key)
    return {"all": sorted(everything, key=_key), "edits": out}


if __name__ == "__main__":
    json.dump(_edit_each(json.loads(Path(sys.argv[1]).read_text())), sys.stdout)
