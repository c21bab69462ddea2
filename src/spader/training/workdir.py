"""One trainer per training work directory.

Two jobs training into one work directory (a rerun started while the first still runs, two
workflows over one results tree) would interleave checkpoints, metrics and the attempt history.
So a job holds ``<workdir>/trainer.lock`` while it trains:

* it is created atomically (``O_CREAT | O_EXCL``) and names its holder: host, PID, the PID's start
  time, and a random token;
* a second trainer finds it and refuses with :class:`WorkdirBusyError`, naming the holder;
* a lock left by a dead process is *stale* and taken over with a warning: on the same host the
  holder's PID is gone (or belongs to a newer process); from another host (a shared file system
  under SLURM) the holder has not refreshed the lock's time stamp for ``stale_after_s`` seconds
  (the holder refreshes it every ``heartbeat_s`` while it trains). A takeover renames the stale
  file first, which succeeds for one process only, so two trainers never both take it over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["LOCK_FILE", "WorkdirBusyError", "WorkdirLock"]

LOCK_FILE = "trainer.lock"


class WorkdirBusyError(RuntimeError):
    """Another training job holds the work directory; the message names it."""


def _start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


class WorkdirLock:
    """The lock of one work directory (a context manager: acquire on enter, release on exit).

    Args:
        workdir: the training work directory.
        stale_after_s: a lock of another host not refreshed for this long is stale.
        heartbeat_s: how often :meth:`heartbeat` really touches the file.
    """

    def __init__(
        self, workdir: str | os.PathLike, *, stale_after_s: float = 900.0, heartbeat_s: float = 60.0
    ):
        self.path = Path(workdir) / LOCK_FILE
        self.stale_after_s = stale_after_s
        self.heartbeat_s = heartbeat_s
        self.token = uuid.uuid4().hex
        self.held = False
        self._touched = 0.0

    def _record(self) -> dict:
        pid = os.getpid()
        return {
            "host": socket.gethostname(),
            "pid": pid,
            "pid_started": _start_time(pid),
            "token": self.token,
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # half-written or garbage: judged by its age below

    def _stale_reason(self, holder: dict) -> str | None:
        """Why ``holder``'s lock is stale, or None while its holder may still train."""
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            started = _start_time(holder["pid"])
            if started is None:
                return f"its holder (pid {holder['pid']} on this host) is gone"
            recorded = holder.get("pid_started")
            if recorded is not None and abs(started - float(recorded)) > 1.0:
                return f"pid {holder['pid']} now belongs to another process"
            return None
        try:
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return "it was removed meanwhile"
        if age > self.stale_after_s:
            return f"it was last refreshed {age:.0f} s ago (stale after {self.stale_after_s:.0f} s)"
        return None

    def acquire(self) -> WorkdirLock:
        """Take the lock (taking over a stale one, with a warning).

        Raises:
            WorkdirBusyError: a living trainer holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._read()
                if holder is None:
                    continue  # released meanwhile: try again
                reason = self._stale_reason(holder)
                if reason is None:
                    raise WorkdirBusyError(
                        f"training work directory {self.path.parent} is in use by another training job "
                        f"(pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}; "
                        f"lock {self.path}); wait for it to end, or stop it first"
                    ) from None
                stale = self.path.with_name(f"{LOCK_FILE}.stale-{self.token}")
                try:
                    os.rename(self.path, stale)  # one taker wins; the others find the winner's lock
                except FileNotFoundError:
                    continue
                log.warning(
                    "taking over the lock of %s from a dead trainer (pid %s on %s since %s): %s",
                    self.path.parent,
                    holder.get("pid"),
                    holder.get("host"),
                    holder.get("since"),
                    reason,
                )
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self._record(), f)
            self.held = True
            self._touched = time.monotonic()
            return self
        raise WorkdirBusyError(f"could not take the lock {self.path}: it keeps changing hands")

    def heartbeat(self) -> None:
        """Refresh the lock's time stamp (at most every ``heartbeat_s``) while it is ours."""
        if not self.held or time.monotonic() - self._touched < self.heartbeat_s:
            return
        self._touched = time.monotonic()
        holder = self._read()
        if holder and holder.get("token") == self.token:
            os.utime(self.path)
        else:
            log.error("the lock %s is no longer ours (%s)", self.path, holder)

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        holder = self._read()
        if holder and holder.get("token") == self.token:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
