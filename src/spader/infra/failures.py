"""A failed job's cause, in one line, where the user looks: the console.

A job's script logs into the job's log file (:func:`spader.infra.glue.setup_logging`), so the
console of ``snakemake`` shows only "Error in rule ...: message: None" and a log path, and on a
cluster the job's own stderr goes to a SLURM log. So:

* the job glue ends a failed job's log with one marked line, ``<rule> failed: <cause>``
  (:func:`one_line` of the exception), and writes the same line to the job's original stderr,
  which is the console of a local run;
* at the end of a failed run, the workflow's ``onerror`` hook prints, for every job that failed
  for good, that line from its log (:func:`failure_report`; a log without the mark gives its last
  exception line, as Python prints a traceback).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["FAILED_MARK", "cause_in_log", "failure_report", "one_line"]

#: What precedes the cause in a failed job's marked log line (``<rule> failed: <cause>``).
FAILED_MARK = " failed: "
_MARKED = re.compile(r"\bERROR spader\.failure: (\S+) failed: (.+)$")
# the last line of a Python traceback: "package.module.SomeError: message"
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Fatal|Exit|Interrupt|Terminated)\w*): (.+)$")
_MAX_CHARS = 400


def one_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line (a message of several lines is joined with ``; ``,
    a very long one cut)."""
    message = "; ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= _MAX_CHARS else text[: _MAX_CHARS - 3] + "..."


def cause_in_log(path: str | os.PathLike) -> str | None:
    """The cause of a failed job from its log: its marked line (the last one), else the last
    exception line of a traceback; None when the log has neither (or does not exist)."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        match = _MARKED.search(line)
        if match:
            return match.group(2).strip()
    for line in reversed(lines):
        match = _EXCEPTION.match(line.strip())
        if match:
            return f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
    return None


def failure_report(failed: Iterable[tuple[str, str, Sequence[str]]]) -> list[str]:
    """One line per failed job: ``<rule> (<wildcards>): <cause> [log: <paths>]``.

    Args:
        failed: ``(rule, wildcards as text, log files)`` of each job that failed for good.
    """
    lines = []
    for rule, wildcards, logs in failed:
        cause = next((c for c in map(cause_in_log, logs) if c), None)
        where = f" [log: {', '.join(map(str, logs))}]" if logs else ""
        label = f"{rule} ({wildcards})" if wildcards else rule
        lines.append(f"{label}: {cause or 'no cause recorded in its log'}{where}")
    return lines
