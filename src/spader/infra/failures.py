"""A failed job's cause, in one line, where the user looks: the console.

A job's script logs into the job's log file (:func:`spader.infra.glue.setup_logging`), so the
console of ``snakemake`` shows only "Error in rule ...: message: None" and a log path, and on a
cluster the job's own stderr goes to a SLURM log. So:

* the job glue ends a failed job's log with one marked line, ``<rule> failed: <cause>``
  (:func:`one_line` of the exception), and writes the same line to the job's original stderr,
  which is the console of a local run;
* under a cluster executor, where a job's stderr goes to its cluster log, the workflow prints that
  line from the job's log when Snakemake reports the job failed (:class:`JobErrors` with ``echo``);
* at the end of a failed run, the workflow's ``onerror`` hook prints, for every job that failed
  for good, that line from its log (:func:`failure_report`). A job killed outright writes nothing
  (SIGKILL, as the kernel's out-of-memory killer sends it, cannot be caught): its cause is what
  Snakemake saw of its process, the signal or exit status (:class:`JobErrors` keeps it from
  Snakemake's log records); a log with neither gives its last exception line, as Python prints a
  traceback.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "FAILED_MARK",
    "JobErrors",
    "cause_in_log",
    "console_causes",
    "failure_report",
    "one_line",
    "process_cause",
]

#: What precedes the cause in a failed job's marked log line (``<rule> failed: <cause>``).
FAILED_MARK = " failed: "
_MARKED = re.compile(r"\bERROR spader\.failure: (\S+) failed: (.+)$")
# the last line of a Python traceback: "package.module.SomeError: message"
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Fatal|Exit|Interrupt|Terminated)\w*): (.+)$")
_MAX_CHARS = 400
NO_CAUSE = "no cause recorded in its log"


def one_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line (a message of several lines is joined with ``; ``,
    a very long one cut)."""
    message = "; ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= _MAX_CHARS else text[: _MAX_CHARS - 3] + "..."


def cause_in_log(path: str | os.PathLike, *, marked_only: bool = False) -> str | None:
    """The cause of a failed job from its log: its marked line (the last one), else (unless
    ``marked_only``) the last exception line of a traceback; None when the log has neither (or
    does not exist)."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        match = _MARKED.search(line)
        if match:
            return match.group(2).strip()
    for line in reversed(lines if not marked_only else []):
        match = _EXCEPTION.match(line.strip())
        if match:
            return f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
    return None


_SIGNALLED = re.compile(r"died with <Signals\.(SIG[A-Z0-9]+): (\d+)>")
_EXIT_STATUS = re.compile(r"returned non-zero exit status (\d+)")


def process_cause(said: str | None) -> str | None:
    """How a job's process ended, from what Snakemake said of it (``died with <Signals.SIGKILL:
    9>``, ``returned non-zero exit status 3``); None when it said neither.

    >>> process_cause("Command 'python x.py' died with <Signals.SIGKILL: 9>.")
    "killed by SIGKILL (signal 9), which no process can catch: the kernel's out-of-memory killer sends it (see its memory, `dmesg`), as does kill -9"
    >>> process_cause("Command 'python x.py' returned non-zero exit status 3.")
    'its process exited with status 3 without writing a cause to its log'
    """
    if not said:
        return None
    if match := _SIGNALLED.search(said):
        name, number = match.group(1), int(match.group(2))
        why = (
            ", which no process can catch: the kernel's out-of-memory killer sends it (see its memory, "
            "`dmesg`), as does kill -9"
            if number == signal.SIGKILL
            else ""
        )
        return f"killed by {name} (signal {number}){why}"
    if match := _EXIT_STATUS.search(said):
        return f"its process exited with status {match.group(1)} without writing a cause to its log"
    return None


class JobErrors(logging.Handler):
    """A handler for Snakemake's logger that keeps, per failed job (by its id), the error Snakemake
    logged just before reporting the job: for a script job, how its process ended. Snakemake logs
    both from the thread that saw the job end, the error first.

    With ``echo`` (and ``when()`` true: a cluster executor, whose jobs' stderr goes to their
    cluster logs, not to this console), it also gives each failed job's cause to ``echo`` the moment
    Snakemake reports the job (:meth:`cause_line`), not only in the summary at the end of a run
    that goes on with its other jobs (``keep-going``) for days."""

    def __init__(
        self, echo: Callable[[str], Any] | None = None, when: Callable[[], bool] | None = None
    ) -> None:
        super().__init__(level=logging.ERROR)
        self._last: dict[int, str] = {}
        self.said: dict[int, str] = {}
        self.echo, self.when = echo, when

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(getattr(record, "event", None), "name", None)
        thread = threading.get_ident()
        if event == "JOB_ERROR":
            text = self._last.pop(thread, None)
            if text is not None and getattr(record, "jobid", None) is not None:
                self.said[record.jobid] = text
            if self.echo is not None and (self.when is None or self.when()):
                self.echo(self.cause_line(record, text))
        elif event == "ERROR":
            self._last[thread] = record.getMessage()

    @staticmethod
    def cause_line(record: logging.LogRecord, said: str | None = None) -> str:
        """``<rule> (jobid <n>) failed: <cause> [log: ...]`` of Snakemake's report of a failed job:
        the cause from its logs (the job's log and the cluster's, which Snakemake names with it),
        else what Snakemake or the executor said of it (a SLURM state such as TIMEOUT)."""
        logs = [str(f).split(" (", 1)[0] for f in (getattr(record, "log", None) or [])]
        label = f"jobid {getattr(record, 'jobid', '?')}"
        (line,) = failure_report([(str(getattr(record, "rule_name", "?")), label, logs, said)])
        msg = getattr(record, "rule_msg", None)
        if msg and NO_CAUSE in line:
            line = line.replace(NO_CAUSE, " ".join(str(msg).split())[:_MAX_CHARS], 1)
        return line.replace(f" ({label}): ", f" ({label}) failed: ", 1)


def console_causes(logger: logging.Logger, workflow: Any) -> JobErrors:
    """The workflow's :class:`JobErrors` on Snakemake's ``logger``, echoing a failed job's cause as
    it fails when ``workflow`` runs its jobs through a cluster executor (not on this machine)."""

    def cluster() -> bool:
        settings = getattr(getattr(workflow, "executor_plugin", None), "common_settings", None)
        return not getattr(settings, "local_exec", True)

    handler = JobErrors(echo=logger.error, when=cluster)
    logger.addHandler(handler)
    return handler


def failure_report(
    failed: Iterable[tuple[str, str, Sequence[str]] | tuple[str, str, Sequence[str], str | None]],
) -> list[str]:
    """One line per failed job: ``<rule> (<wildcards>): <cause> [log: <paths>]``.

    Args:
        failed: ``(rule, wildcards as text, log files)`` of each job that failed for good, with
            what Snakemake said of its process as a fourth item where known (:class:`JobErrors`).
    """
    lines = []
    for rule, wildcards, logs, *said in failed:
        cause = (
            next((c for c in (cause_in_log(p, marked_only=True) for p in logs) if c), None)
            or process_cause(said[0] if said else None)
            or next((c for c in map(cause_in_log, logs) if c), None)
        )
        where = f" [log: {', '.join(map(str, logs))}]" if logs else ""
        label = f"{rule} ({wildcards})" if wildcards else rule
        lines.append(f"{label}: {cause or NO_CAUSE}{where}")
    return lines
