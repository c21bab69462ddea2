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
from collections.abc import Iterator
from typing import Any

from spader.infra.tracking import job_run

__all__ = ["job", "setup_logging"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(log_path: str | None) -> None:
    """Send stderr (tracebacks, tqdm bars) and the logging tree to the job's log file."""
    if log_path:
        sys.stderr = open(log_path, "w", buffering=1, encoding="utf-8")  # lives as long as the job
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=_FORMAT, force=True)


@contextlib.contextmanager
def job(smk) -> Iterator[Any]:
    """Log set-up plus the job's MLflow run (see :func:`spader.infra.tracking.job_run`)."""
    setup_logging(smk.log[0] if len(smk.log) else None)
    logging.getLogger("spader").info("rule %s, wildcards %s", smk.rule, dict(smk.wildcards.items()))
    try:
        with job_run(smk) as run:
            yield run
    except Exception:
        logging.getLogger("spader").exception("rule %s failed", smk.rule)
        raise
