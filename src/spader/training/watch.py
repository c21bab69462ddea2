"""What a training job keeps an eye on while verl runs, and stops verl for.

* **The workflow that started it.** A training job is a child of a Snakemake process: the local
  executor's (``snakemake --cores``) on a workstation, the job step's inside a SLURM allocation.
  If that process dies (``kill -9`` of snakemake), nobody will record the job's outputs, so the
  job stops verl, its retrieval service and Ray instead of training on for days. Under SLURM the
  *submitting* snakemake is deliberately not watched: a batch job outlives it by design (a login
  node's session may end), the scheduler owns the job and ``scancel`` stops it.
* **Its retrieval service.** verl's search tool turns a failed search into an error observation
  and trains on; a dead service would make every later rollout worthless. The job stops verl
  when the service's process exits, when it stops answering, or when the share of failed queries
  in a check interval exceeds ``training.max_search_error_rate``. A multi-node job has a replica
  on every node, each judged on its node the same way; the watch reads their verdicts
  (:class:`spader.training.node_search.RelayedHealth`) and any one failing stops verl.

The watch runs in a thread; when something is wrong it records why and stops verl's process tree
(SIGTERM to the process supervisor, :func:`spader.training.launch.run_supervised`'s ``started``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence

from spader.infra.procs import ProcessRef, workflow_process

log = logging.getLogger(__name__)

__all__ = ["SERVICE_CHECK_S", "JobWatch", "ProcessRef", "ServiceHealth", "workflow_process"]

#: Seconds between two looks at the retrieval service (its process is checked on each look).
SERVICE_CHECK_S = 30.0


class ServiceHealth:
    """The retrieval service as a job sees it: its process (``pid`` from ``/health``) and the
    failed share of its queries between two looks at ``/stats``.

    Args:
        url: the service's base URL.
        max_error_rate: the failed share of an interval's queries that counts as broken.
        min_queries: intervals with fewer queries are not judged (a few failures of a quiet
            interval say little).
        timeout_s: per request.
        max_silence_s: how long ``/stats`` may go unanswered before the service counts as hung.
        label: how the messages name the service (default: ``the retrieval service at <url>``).
    """

    def __init__(
        self,
        url: str,
        *,
        max_error_rate: float,
        min_queries: int = 50,
        timeout_s: float = 10.0,
        max_silence_s: float = 300.0,
        label: str | None = None,
    ):
        import httpx

        self.url = url
        self.label = label or f"the retrieval service at {url}"
        self.max_error_rate = float(max_error_rate)
        self.min_queries = int(min_queries)
        self.timeout_s = timeout_s
        self.max_silence_s = max_silence_s
        self.pid: int | None = None
        self._create_time: float | None = None
        self._last: tuple[int, int] | None = None
        self._answered: float | None = None  # silence counts only for a service that answered
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
            health = httpx.get(f"{url}/health", timeout=timeout_s, trust_env=False).json()
            self._answered = time.monotonic()
            self.pid = int(health["pid"])
            self._last = _counts(health.get("stats") or {})
            import psutil

            with contextlib.suppress(psutil.NoSuchProcess):
                self._create_time = psutil.Process(self.pid).create_time()

    def problem(self) -> str | None:
        """Why the service is unusable now, or None."""
        import httpx

        if self.pid is not None and self._create_time is not None:
            if not ProcessRef(self.pid, self._create_time).alive():
                return f"{self.label} (pid {self.pid}) died"
        try:
            stats = httpx.get(f"{self.url}/stats", timeout=self.timeout_s, trust_env=False).json()
        except (httpx.HTTPError, ValueError) as exc:
            if self._answered is None:
                return None
            silent = time.monotonic() - self._answered
            if silent > self.max_silence_s:
                return f"{self.label} has not answered for {silent:.0f} s ({type(exc).__name__})"
            return None
        self._answered = time.monotonic()
        counts = _counts(stats)
        if counts is None:
            return None
        if self._last is None:
            self._last = counts
            return None
        queries, failed = counts[0] - self._last[0], counts[1] - self._last[1]
        if queries < self.min_queries:
            return None  # too few to judge; keep accumulating from the same base
        self._last = counts
        rate = failed / queries
        if rate > self.max_error_rate:
            return (
                f"{self.label} failed {failed} of {queries} search queries "
                f"({rate:.0%}) in the last interval, above training.max_search_error_rate "
                f"({self.max_error_rate:.0%})"
            )
        return None


def _counts(stats: dict) -> tuple[int, int] | None:
    try:
        return int(stats["queries"]), int(stats.get("failed_queries", 0))
    except (KeyError, TypeError, ValueError):
        return None


class JobWatch:
    """Checks, every ``interval_s`` seconds in a thread, the workflow process and the service, and
    runs ``heartbeat`` (the work directory lock's) on every round.

    Args:
        workflow: the Snakemake process to outlive never (None: not watched).
        service: the retrieval service (None: not watched), or several (a multi-node job's
            replicas, one per node: any of them failing stops verl); each has ``problem()``.
        interval_s: seconds between checks of the workflow and the lock; the service is asked
            every ``service_interval_s`` (default :data:`SERVICE_CHECK_S`).
        heartbeat: called every round (exceptions are logged, never fatal).
    """

    def __init__(
        self,
        *,
        workflow: ProcessRef | None = None,
        service: ServiceHealth | Sequence[ServiceHealth] | None = None,
        interval_s: float = 1.0,
        service_interval_s: float | None = None,
        heartbeat: Callable[[], None] | None = None,
    ):
        self.workflow = workflow
        if service is None:
            self.services = []
        elif hasattr(service, "problem"):
            self.services = [service]
        else:
            self.services = list(service)
        self.interval_s = interval_s
        self.service_interval_s = SERVICE_CHECK_S if service_interval_s is None else service_interval_s
        self.heartbeat = heartbeat
        self.reason: str | None = None
        self.kind: str | None = None  # "workflow" | "service"
        self._proc = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, proc) -> None:
        """The process to stop (verl's supervisor); stops it at once if something already failed."""
        self._proc = proc
        if self.reason is not None:
            self._stop_proc()

    def _stop_proc(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)

    def _fail(self, kind: str, reason: str) -> None:
        if self.reason is not None:
            return
        self.kind, self.reason = kind, reason
        log.error("%s; stopping verl", reason)
        self._stop_proc()

    def _run(self) -> None:
        next_service = time.monotonic() + self.service_interval_s
        while not self._stop.wait(min(self.interval_s, self.service_interval_s)):
            if self.heartbeat is not None:
                try:
                    self.heartbeat()
                except Exception:
                    log.exception("work directory lock heartbeat failed")
            if self.reason is not None:
                continue
            if self.workflow is not None and not self.workflow.alive():
                self._fail(
                    "workflow",
                    f"the workflow that started this job (snakemake, pid {self.workflow.pid}) is gone",
                )
                continue
            if self.services and time.monotonic() >= next_service:
                next_service = time.monotonic() + self.service_interval_s
                for service in self.services:
                    problem = service.problem()
                    if problem:
                        self._fail("service", problem)
                        break

    def __enter__(self) -> JobWatch:
        self._thread = threading.Thread(target=self._run, name="job-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
