"""The service's own timing: durations summarised as percentiles, and how late the event loop runs."""

from __future__ import annotations

import asyncio
import time

import pytest

from spader.retrieval.monitor import DurationWindow, LoopLagMonitor


def test_window_percentiles_cover_the_kept_durations_and_max_covers_all():
    w = DurationWindow(size=100)
    assert w.summary() == {"count": 0, "window": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    w.add(5.0)  # later pushed out of the window, still the lifetime maximum
    for i in range(1, 101):
        w.add(i / 1000)
    s = w.summary()
    assert (s["count"], s["window"]) == (101, 100)
    assert s["p50_ms"] == pytest.approx(50.5) and s["p99_ms"] == pytest.approx(99.01)
    assert s["max_ms"] == 5000.0
    with pytest.raises(ValueError, match="size"):
        DurationWindow(size=0)


def test_loop_lag_records_a_blocked_event_loop():
    async def main() -> dict:
        monitor = LoopLagMonitor(period_s=0.01)
        monitor.start()
        await asyncio.sleep(0.05)
        quiet = monitor.lag.summary()
        time.sleep(0.3)  # what a handler that blocks the loop does to every other request
        await asyncio.sleep(0.05)
        await monitor.stop()
        return {"quiet": quiet, "blocked": monitor.lag.summary()}

    out = asyncio.run(main())
    assert out["quiet"]["count"] >= 1
    assert out["blocked"]["max_ms"] >= 250  # the wake-up due during the block came ~300 ms late
    assert out["blocked"]["count"] > out["quiet"]["count"]
