"""What a training job's plan says of the allocation a cluster gives it: whether its run fits in the
allocations its retries allow, and whether its memory request was capped below what the plan needs.

The workflow asks these of every planned training job when it sizes the jobs' requests
(``spader.dag.TrainingResources``): a run that cannot finish even at the low end of its
planned time is refused before any job starts, naming the run time and the allocations; the high
end beyond them, and every capped memory request, is warned.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["memory_cap_warning", "time_limit_problems"]


def time_limit_problems(
    name: str,
    *,
    run_hours: tuple[float | None, float | None],
    allocation_minutes: float,
    retries: int,
    limit_source: str,
) -> tuple[str | None, str | None]:
    """``(refusal, warning)`` of a training whose planned run takes ``run_hours`` (low, high) when
    each allocation lasts ``allocation_minutes`` and the job may be submitted ``retries`` more
    times (``training.time_limit.retries``): it trains for at most ``(retries + 1)`` allocations.

    Args:
        name: the job (``train <backbone>/<variant>``).
        limit_source: what sets the allocation (named in the messages).
    """
    low, high = run_hours
    allocations = int(retries) + 1
    total_h = allocations * float(allocation_minutes) / 60
    within = (
        f"{allocations} allocations of {allocation_minutes / 60:.1f} h ({limit_source}; "
        f"training.time_limit.retries {retries} + 1) give it {total_h:.0f} h"
    )
    if low is not None and low > total_h:
        return (
            f"{name}: its planned run takes {low:.0f}-{(high or low):.0f} h but {within}: raise "
            f"training.time_limit.retries to at least {math.ceil(low * 60 / allocation_minutes) - 1}, or "
            "give it a longer allocation",
            None,
        )
    if high is not None and high > total_h:
        return None, (
            f"{name}: the high end of its planned run ({high:.0f} h) exceeds what {within}; it may end "
            "unfinished (raise training.time_limit.retries)"
        )
    return None, None


def memory_cap_warning(job: Any, mem_mb: int) -> str | None:
    """A warning when the memory a training ``job`` (:class:`spader.planning.plan.Job`) asks for,
    ``mem_mb``, is below its plan's host memory with the request's headroom (the request was capped
    at the node's share of ``hardware.host_memory_gib``); None otherwise."""
    from spader.planning.costs import HOST_CONSTANTS

    if job.host_gib is None:
        return None
    need_mb = math.ceil(job.host_gib * (1 + HOST_CONSTANTS["request_headroom"]) * 1024)
    if mem_mb >= need_mb:
        return None
    return (
        f"{job.name}: asks for {mem_mb} MB of host memory per node, capped at its share of "
        f"hardware.host_memory_gib; its plan needs {job.host_gib:.1f} GiB ({need_mb} MB with the "
        "request's headroom): a cluster that enforces memory may kill it (spader plan)"
    )
