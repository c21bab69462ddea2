"""A training's plan against its allocations (spader.training.allocation)."""

from __future__ import annotations

from types import SimpleNamespace

from spader.training.allocation import memory_cap_warning, time_limit_problems


def test_a_run_beyond_its_allocations_is_refused_at_the_low_end_and_warned_at_the_high_end():
    ask = {"allocation_minutes": 2880, "retries": 5, "limit_source": "max_runtime 2880 min"}
    assert time_limit_problems("train b/v", run_hours=(200.0, 280.0), **ask) == (None, None)
    refusal, warning = time_limit_problems("train b/v", run_hours=(224.0, 324.0), **ask)
    assert (
        refusal is None
        and "the high end of its planned run (324 h) exceeds what 6 allocations of 48.0 h" in warning
    )
    refusal, warning = time_limit_problems("train b/v", run_hours=(300.0, 400.0), **ask)
    assert warning is None
    assert refusal.startswith("train b/v: its planned run takes 300-400 h but 6 allocations of 48.0 h")
    assert "give it 288 h" in refusal and "retries to at least 6" in refusal
    assert time_limit_problems("train b/v", run_hours=(None, None), **ask) == (None, None)  # no time planned


def test_every_capped_memory_request_is_warned():
    job = SimpleNamespace(name="train b/ppo", host_gib=200.0)
    assert memory_cap_warning(job, 200 * 1024) is not None  # below the plan with its headroom
    assert "asks for 153600 MB" in memory_cap_warning(job, 150 * 1024)
    assert memory_cap_warning(job, 400 * 1024) is None
    assert memory_cap_warning(SimpleNamespace(name="x", host_gib=None), 1) is None
