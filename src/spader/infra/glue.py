"""Shared set-up for the thin ``workflow/scripts/*.py`` glue: per-job log file and MLflow run.

Every script does::

    from spader.infra.glue import job
    with job(snakemake):
        some_package_function(snakemake.input..., snakemake.output..., **snakemake.params...)
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from spader.infra import integrity
from spader.infra.failures import FAILED_MARK, one_line
from spader.infra.procs import Terminated, raise_on_signals, start_watchdog, watch_workflow
from spader.infra.tracking import job_run

__all__ = [
    "code_tags",
    "job",
    "overlay",
    "retrieval_settings",
    "setup_logging",
    "workflow_root",
]


_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(log_path: str | None) -> None:
    """Send stderr (tracebacks, tqdm bars) and the logging tree to the job's log file; a failed
    job's one-line cause (logger ``spader.failure``) goes to the job's original stderr as well (the
    console of a local run)."""
    console = sys.stderr
    if log_path:
        sys.stderr = open(log_path, "w", buffering=1, encoding="utf-8")  # lives as long as the job
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=_FORMAT, force=True)
    failure = logging.getLogger("spader.failure")
    for handler in list(failure.handlers):
        failure.removeHandler(handler)
    if log_path:
        handler = logging.StreamHandler(console)
        handler.setFormatter(logging.Formatter("Error: %(message)s"))
        failure.addHandler(handler)


@contextlib.contextmanager
def job(smk) -> Iterator[Any]:
    """Log set-up, the job's MLflow run (:func:`spader.infra.tracking.job_run`), stop signals and
    integrity records.

    SIGTERM, SIGINT and SIGHUP raise :class:`spader.infra.procs.Terminated` in the body, so
    services and child processes are stopped on the way out and the run is marked KILLED; should
    the job die without that chance (SIGKILL), a watchdog stops every process it had started
    (:func:`spader.infra.procs.start_watchdog`). The job dies with the Snakemake process that
    launched it, however that one died (:func:`spader.infra.procs.watch_workflow`). File
    inputs are checked against their integrity records before the body runs, and file outputs
    recorded after it succeeds (:mod:`spader.infra.integrity`).
    """
    setup_logging(smk.log[0] if len(smk.log) else None)
    logging.getLogger("spader").info("rule %s, wildcards %s", smk.rule, dict(smk.wildcards.items()))
    if type(smk).__module__.startswith("snakemake"):  # a job process of its own (not a test's stand-in)
        start_watchdog()
        watch_workflow()
    integrity.set_job_rule(smk.rule)
    try:
        with raise_on_signals(), job_run(smk, extra_tags=code_tags(smk)) as run:
            integrity.verify_inputs([str(p) for p in smk.input], rule=smk.rule)
            yield run
            integrity.record_outputs([str(p) for p in smk.output], producer=smk.rule)
            if "code" in dict(smk.params.items()):  # what the stage planned with (stage_code.planned_code)
                integrity.annotate([str(p) for p in smk.output], code=str(smk.params.code))
    except Terminated as stop:  # a stop signal, or the workflow is gone: why, not a traceback
        logging.getLogger("spader").error("rule %s stopped: %s", smk.rule, stop)
        raise
    except Exception as exc:
        logging.getLogger("spader").exception("rule %s failed", smk.rule)
        # the cause as the log's last line, found by the workflow's onerror hook (spader.infra.failures)
        logging.getLogger("spader.failure").error("%s%s%s", smk.rule, FAILED_MARK, one_line(exc))
        raise


def code_tags(smk) -> dict[str, str]:
    """MLflow tags of the code a job runs: ``code.fingerprint``, the fingerprint of its script and
    of the package modules it runs as they are now, recorded whether or not a code change reruns
    its stage (``code_reruns``); ``code.param``, the value of its ``code`` param (the fingerprint
    its outputs were planned with, which differs when its stage's switch is off)."""
    from spader.infra.stage_code import PackageGraph

    script = Path(getattr(smk, "scriptdir", "") or ".") / f"{smk.rule}.py"
    tags = {}
    if script.is_file():
        tags["code.fingerprint"] = PackageGraph().fingerprint(script)
    if "code" in dict(smk.params.items()):
        tags["code.param"] = str(smk.params.code)
    return tags


def overlay(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``top``'s values in their place, section by section (neither is changed).

    >>> overlay({"a": 1, "s": {"x": 1, "y": 2}}, {"s": {"y": 3}})
    {'a': 1, 's': {'x': 1, 'y': 3}}
    """
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        out[key] = (
            overlay(below, value) if isinstance(value, Mapping) and isinstance(below, Mapping) else value
        )
    return out


def retrieval_settings(params_retrieval: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """A job's full retrieval settings: the ``retrieval`` section of its config overlaid with its
    ``retrieval`` param. The param holds the settings that can change what its searches return
    (and the reranker's resolved directory); the config adds the operational ones, which are no
    param so that editing them reruns nothing (:mod:`spader.infra.rerun_keys`).

    Args:
        params_retrieval: ``snakemake.params.retrieval``.
        config: ``snakemake.config``.
    Returns:
        The settings with a complete ``service`` block.
    """
    return overlay(config.get("retrieval") or {}, params_retrieval)


def workflow_root(smk) -> Path:
    """The repository holding the running workflow (``workflow/scripts/`` is two levels down).

    Files shipped with the workflow (the demo's bundled releases) are named relative to it, while
    the job's outputs are relative to the working directory, which may be elsewhere.
    """
    return Path(smk.scriptdir).resolve().parents[1]
