"""Where a request's time goes, as the service itself sees it (reported by ``/stats``).

* :class:`DurationWindow` keeps the last durations of something (requests answered, event-loop
  delays) and summarises them as percentiles, so a latency seen by a client can be compared with
  the time the service spent on the request;
* :class:`LoopLagMonitor` measures how late the event loop runs a callback it scheduled: time in
  which no request could be read, parsed or answered, because the loop was busy or the thread
  running it did not get the GIL or a core.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

import numpy as np

__all__ = ["DurationWindow", "LoopLagMonitor"]


class DurationWindow:
    """The last ``size`` durations (seconds) and a count of all of them.

    Args:
        size: durations kept for the percentiles (older ones are dropped; the count and the
            maximum cover the whole lifetime).
    """

    def __init__(self, size: int = 10_000):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self._recent: deque[float] = deque(maxlen=size)
        self.count = 0
        self.max_s = 0.0

    def add(self, seconds: float) -> None:
        """Record one duration."""
        self._recent.append(seconds)
        self.count += 1
        self.max_s = max(self.max_s, seconds)

    def summary(self) -> dict[str, float | int]:
        """``count`` (all recorded), ``window`` (kept), ``p50_ms``/``p99_ms`` of the kept ones and
        ``max_ms`` of all (0.0 while nothing was recorded)."""
        if not self._recent:
            return {"count": 0, "window": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        p50, p99 = np.percentile(np.fromiter(self._recent, dtype=float), [50, 99])
        return {
            "count": self.count,
            "window": len(self._recent),
            "p50_ms": round(float(p50) * 1e3, 3),
            "p99_ms": round(float(p99) * 1e3, 3),
            "max_ms": round(self.max_s * 1e3, 3),
        }


class LoopLagMonitor:
    """Wakes up every ``period_s`` on the running event loop and records how late it woke.

    Args:
        period_s: the wake-up period.
        window: :class:`DurationWindow` the delays go to.
    """

    def __init__(self, period_s: float = 0.05, window: DurationWindow | None = None):
        self.period_s = float(period_s)
        self.lag = window or DurationWindow()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start measuring on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop measuring."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            due = time.perf_counter() + self.period_s
            await asyncio.sleep(self.period_s)
            self.lag.add(max(0.0, time.perf_counter() - due))
