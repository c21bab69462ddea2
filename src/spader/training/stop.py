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

SLURM sends that warning once, to the processes that exist at that moment. A job can be warned
while it is still starting (Snakemake inside the allocation, then the job script's imports, take
tens of seconds on a loaded node), so nothing depends on catching it at the right time:

* the job script installs the warning's handler as its first statement
  (:func:`catch_stop_requests`), and a request that arrives before the job's
  :class:`StopControl` exists is kept until it does (it then asks verl at once);
* the job also reads the time its allocation has left from SLURM (``squeue -o %L``,
  :func:`slurm_time_left`), when it starts and every :data:`TIME_LEFT_CHECK_S` seconds after
  (:class:`TimeLimitWatch`), and asks for the stop itself once that is ``warning_s`` or less. A
  warning lost before the job's first instant is thus made up for within that interval.

On a workstation the same stop-and-resume follows a first SIGTERM to the job (a second SIGTERM,
SIGINT or SIGHUP stops it at once, as before).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from spader.infra.procs import Terminated

log = logging.getLogger(__name__)

__all__ = [
    "RESUME_EXIT_CODE",
    "TIME_LEFT_CHECK_S",
    "WARNING_SIGNAL",
    "StopControl",
    "StoppedForResume",
    "TimeLimitWatch",
    "catch_stop_requests",
    "parse_slurm_duration",
    "read_stop_ack",
    "request_stop",
    "slurm_signal_option",
    "slurm_time_left",
]

#: Exit status of a job that stopped on purpose and can be resumed (sysexits' EX_TEMPFAIL: "a
#: temporary failure; the user is invited to retry").
RESUME_EXIT_CODE = 75
#: The signal SLURM sends ``training.time_limit.warning_s`` before a training job's time limit.
WARNING_SIGNAL = signal.SIGURG
#: Seconds between two readings of the time the job's allocation has left (:class:`TimeLimitWatch`).
TIME_LEFT_CHECK_S = 30.0


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


# Stop requests of this process: the job's StopControl once it exists; before that, the first
# request is kept (a warning that arrives while the job is still starting) and handed over to it.
_requests_lock = threading.RLock()
_control: StopControl | None = None
_pending: str | None = None


def request_stop(reason: str) -> None:
    """Ask this job to stop at verl's next step boundary, from anywhere in the process (a signal
    handler, a watch thread): the job's :class:`StopControl` when one is active, else the request
    is kept until one starts."""
    global _pending
    with _requests_lock:
        control = _control
        if control is None:
            if _pending is None:
                _pending = reason
                log.warning("%s: the job will stop at verl's first step boundary", reason)
            return
    control.request(reason)


def _warned(signum, frame) -> None:
    request_stop(f"the scheduler's time-limit warning ({signal.Signals(signum).name})")


def catch_stop_requests() -> None:
    """Catch the scheduler's warning (:data:`WARNING_SIGNAL`) from now on, kept for the job's
    :class:`StopControl`. The job script's first statement: it imports nothing slow."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(WARNING_SIGNAL, _warned)


def parse_slurm_duration(text: str) -> float | None:
    """Seconds in SLURM's duration format (``[days-]hours:minutes:seconds``, ``minutes:seconds``);
    None for ``UNLIMITED``, ``NOT_SET``, ``INVALID`` and anything else.

    >>> parse_slurm_duration("1-02:03:04"), parse_slurm_duration("9:30"), parse_slurm_duration("UNLIMITED")
    (93784.0, 570.0, None)
    """
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def slurm_time_left(job_id: str, *, timeout_s: float = 30.0) -> float | None:
    """Seconds left before job ``job_id`` reaches its time limit, as SLURM reports it
    (``squeue -h -j <id> -o %L``); None without a limit or when SLURM does not answer."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%L"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not ask SLURM for the time left of job %s: %s", job_id, exc)
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or not lines:
        log.warning("squeue gave no time left for job %s: %s", job_id, (out.stderr or out.stdout).strip())
        return None
    return parse_slurm_duration(lines[0])


class TimeLimitWatch:
    """Reads, from the job's start, how long its SLURM allocation has left, and asks for the stop
    (:func:`request_stop`) once that is ``warning_s`` or less: the stop does not depend on
    catching SLURM's one warning signal. Does nothing outside a SLURM job.

    Args:
        warning_s: ``training.time_limit.warning_s``.
        job_id: the SLURM job (default ``$SLURM_JOB_ID``).
        interval_s: seconds between two readings.
        time_left: ``job_id -> seconds | None`` (default :func:`slurm_time_left`).
        request: called with the reason (default :func:`request_stop`).
    """

    def __init__(
        self,
        warning_s: float,
        *,
        job_id: str | None = None,
        interval_s: float = TIME_LEFT_CHECK_S,
        time_left: Callable[[str], float | None] = slurm_time_left,
        request: Callable[[str], None] = request_stop,
    ):
        self.warning_s = float(warning_s)
        self.job_id = job_id if job_id is not None else os.environ.get("SLURM_JOB_ID")
        self.interval_s = interval_s
        self.time_left = time_left
        self.request = request
        self.requested = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """One reading; True once the stop was asked for."""
        if self.requested or not self.job_id:
            return self.requested
        left = self.time_left(self.job_id)
        if left is not None and left <= self.warning_s:
            self.requested = True
            self.request(
                f"SLURM job {self.job_id} has {left:.0f} s left before its time limit "
                f"(training.time_limit.warning_s is {self.warning_s:.0f})"
            )
        return self.requested

    def _run(self) -> None:
        while not self.check() and not self._stop.wait(self.interval_s):
            pass

    def __enter__(self) -> TimeLimitWatch:
        if self.job_id:
            self._thread = threading.Thread(target=self._run, name="time-limit-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=35.0)  # a reading in flight ends within squeue's timeout


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
        self._lock = threading.RLock()
        self.clear()

    def __enter__(self) -> StopControl:
        """Become the process's stop control (:func:`request_stop` reaches it), taking over a
        request that arrived before it existed."""
        global _control, _pending
        with _requests_lock:
            _control, pending, _pending = self, _pending, None
        if pending is not None:
            self.request(pending)
        return self

    def __exit__(self, *exc) -> None:
        global _control
        with _requests_lock:
            if _control is self:
                _control = None

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
