"""Stopping a training job so that its rerun resumes: time limits, SIGTERM, and the exit status the
workflow retries.

A cluster ends a job at its time limit: SLURM sends SIGTERM to every process of the job, then
SIGKILL after a short grace (``KillWait``, typically 30 s), far too short to save an 8B policy.
So the training rule asks SLURM for a warning signal ``training.time_limit.warning_s`` before the
limit (``--signal=URG@<seconds>``, see :func:`slurm_signal_option`), and on that warning the job
asks verl to stop at its next step boundary (:meth:`StopControl.request`: the file named by
``SPADER_STOP_REQUEST``, which the project's trainer modes check after every step's metrics:
they save that step's checkpoint and end the training loop there). verl then exits normally,
nothing half-written, every step logged once, and the job exits with :data:`RESUME_EXIT_CODE`;
Snakemake retries it (``retries:`` on the rule) and the retry resumes from that checkpoint.

Why SIGURG: SLURM delivers the warning to every process of the job step, not only to the job
(``B:`` would signal the batch shell alone, whose death ends the allocation). SIGUSR1 and SIGUSR2
terminate a process that does not handle them: Snakemake inside the allocation, verl and Ray's
workers would die with the warning (seen on SLURM 22.05: the step failed with "User defined
signal 1"). SIGURG is ignored by every process that does not ask for it, so only this job acts.

On a workstation the same stop-and-resume follows a first SIGTERM to the job (a second SIGTERM,
SIGINT or SIGHUP stops it at once, as before).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from spader.infra.procs import Terminated

log = logging.getLogger(__name__)

__all__ = [
    "RESUME_EXIT_CODE",
    "WARNING_SIGNAL",
    "StopControl",
    "StoppedForResume",
    "read_stop_ack",
    "slurm_signal_option",
]

#: Exit status of a job that stopped on purpose and can be resumed (sysexits' EX_TEMPFAIL: "a
#: temporary failure; the user is invited to retry").
RESUME_EXIT_CODE = 75
#: The signal SLURM sends ``training.time_limit.warning_s`` before a training job's time limit.
WARNING_SIGNAL = signal.SIGURG


def slurm_signal_option(warning_s: int) -> str:
    """The sbatch option asking for the warning (the rule's ``slurm_extra``).

    >>> slurm_signal_option(1800)
    '--signal=URG@1800'
    """
    return f"--signal={WARNING_SIGNAL.name.removeprefix('SIG')}@{int(warning_s)}"


def _ack_file(request_file: Path) -> Path:
    return request_file.with_name(request_file.name + ".ack")


def read_stop_ack(request_file: str | os.PathLike) -> dict | None:
    """What the training loop recorded when it stopped on request (``{"step", "early"}``,
    :func:`spader.infra.procs.acknowledge_stop`), or None when it did not."""
    try:
        return json.loads(_ack_file(Path(request_file)).read_text())
    except (FileNotFoundError, ValueError):
        return None


class StoppedForResume(Terminated):
    """The job stopped before its last step on purpose (a time limit ahead, a stop signal) and a
    rerun resumes it; the job's script exits with :data:`RESUME_EXIT_CODE`."""

    def __init__(self, reason: str, step: int | None):
        self.reason = reason
        self.step = step
        BaseException.__init__(
            self, f"{reason}; stopped after step {step}" if step is not None else f"{reason}; stopped"
        )
        self.signum = int(WARNING_SIGNAL)


class StopControl:
    """The job's side of a stop request.

    Args:
        request_file: the file whose existence asks verl's training loop to stop (the launch puts
            its path in ``SPADER_STOP_REQUEST``); removed at start so an old request does not stop
            a new attempt.
    """

    def __init__(self, request_file: str | os.PathLike):
        self.request_file = Path(request_file)
        self.reason: str | None = None
        self._lock = threading.Lock()
        self.clear()

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        """Ask verl to stop after its current step (once; later reasons are only logged)."""
        with self._lock:
            if self.reason is not None:
                log.info("stop already requested (%s); also: %s", self.reason, reason)
                return
            self.reason = reason
            self.request_file.parent.mkdir(parents=True, exist_ok=True)
            self.request_file.write_text(reason + "\n")
        log.warning("%s: asking verl to stop at its next step boundary, after a checkpoint", reason)

    def clear(self) -> None:
        """Remove the request and the training loop's acknowledgement (between attempts)."""
        for path in (self.request_file, _ack_file(self.request_file)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @contextlib.contextmanager
    def handling_signals(self, *, sigterm: bool = True) -> Iterator[None]:
        """Within the block: SIGURG (the scheduler's warning) and, with ``sigterm``, a first SIGTERM
        ask for a stop at the next step boundary; a SIGTERM after a stop was asked for raises
        :class:`Terminated` (the hard limit, or someone insisting). Without ``sigterm`` (before
        verl runs) SIGTERM keeps its handler: the job stops at once. Only in the main thread."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def warned(signum, frame):
            self.request(f"the scheduler's time-limit warning ({signal.Signals(signum).name})")

        def terminated(signum, frame):
            if self.requested:
                raise Terminated(signum)
            self.request("SIGTERM")

        previous = {WARNING_SIGNAL: signal.signal(WARNING_SIGNAL, warned)}
        if sigterm:
            previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, terminated)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
