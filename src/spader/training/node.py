"""The node a training lands on against its plan, and ``spader preflight``'s checks of a node
against a whole configuration's plan. The measuring and the comparison every job shares live in
:mod:`spader.infra.node`: :func:`node_checks` compares the node with a configuration's plan, every
check independent of the others (``spader preflight`` prints them all); :func:`check_job_node`
compares it with one training job's plan and stops the job, before any model loads, with one line
naming what is short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spader.infra.node import (
    GPU_WHEEL_GLIBC,
    SHM_MIN_GIB,
    Check,
    Gpu,
    Needs,
    Node,
    _at_least,
    _cgroup_memory_limit,  # noqa: F401  (the tests read a cgroup's limit through it)
    _claim,
    _gpu_checks,
    check_node,
    gpu_inventory,
    measure_node,
    tree_gib,
    wheel_tag,
)

__all__ = [
    "GPU_WHEEL_GLIBC",
    "SHM_MIN_GIB",
    "Check",
    "Gpu",
    "Node",
    "check_job_node",
    "gpu_inventory",
    "measure_node",
    "node_checks",
    "shm_need",
    "tree_gib",
    "wheel_tag",
]


def shm_need(jobs: Sequence[Any]) -> float:
    """GiB of /dev/shm the GPU jobs need: :data:`SHM_MIN_GIB`, or their step batch twice."""
    batch = [2 * j.host["training"].get("step batch", 0.0) for j in jobs if j.host]
    return max([SHM_MIN_GIB, *batch])


def node_checks(config: Any, node: Node, jobs: Sequence[Any], totals: Mapping[str, Any] | None, *,
                gpu: bool) -> list[Check]:  # fmt: skip
    """Every check of the node against ``config``'s plan (``jobs``, ``totals``: spader.planning.plan),
    each on its own. ``gpu`` False (a CPU configuration, or a machine that is not a GPU node): the
    GPU checks and the checks against ``hardware.*`` (which describes the GPU nodes) are skipped,
    saying so."""
    ok, line = wheel_tag(node.glibc)
    checks = [Check("glibc", "ok" if ok or not gpu else "fail", line, have=node.glibc)]
    if not gpu:
        found = "no GPU (nvidia-smi not found)" if node.gpus is None else f"{len(node.gpus)} GPU(s)"
        why = "none needed: training.device is cpu and evaluation.gpus is 0, or --cpu"
        checks += [Check(name, "skip", f"{found}; {why}" if name == "gpus" else why)
                   for name in ("driver", "gpus", "gpu memory", "nvcc", "host memory", "disk", "/dev/shm")]  # fmt: skip
        return checks
    hw = config.hardware
    training = [j for j in jobs if j.name.startswith("train ") and j.host]
    needed = max([s.gpus for s in config.backbones.values()] + [int(config.evaluation.gpus)])
    checks += _gpu_checks(node, gpus_needed=needed, peak_gib=max((j.peak for j in jobs), default=0.0))
    checks.append(_claim("host memory (hardware.host_memory_gib)", "hardware.host_memory_gib",
                         float(hw.host_memory_gib), node.ram_gib, what="the node's memory"))  # fmt: skip
    if training:
        worst = max(training, key=lambda j: j.host_gib)
        checks.append(_at_least("host memory", node.ram_usable_gib, worst.host_gib,
                                what=f"available (the plan's largest, {worst.name})"))  # fmt: skip
    space = None if node.disk_free_gib is None else node.disk_free_gib + node.disk_used_gib
    checks.append(_claim("disk (hardware.disk_gib)", "hardware.disk_gib", float(hw.disk_gib), space,
                         what=f"free at {node.disk_path} with what results/ and resources/ hold"))  # fmt: skip
    if totals and "disk_gib" in totals:
        checks.append(_at_least("disk", space, float(totals["disk_gib"]),
                                what=f"free at {node.disk_path} with what the DAG already holds (the DAG's total)"))  # fmt: skip
    checks.append(_at_least("/dev/shm", node.shm_gib, shm_need(training), what="shared memory"))
    return checks


def check_job_node(job: Any, node: Node, *, workdir_gib: float = 0.0) -> list[Check]:
    """A training job's plan (``job``: spader.planning.plan.Job with its costs) against the node it
    landed on (:func:`spader.infra.node.check_node`): host memory, free disk where it writes (its
    checkpoints at their peak, less those already there), /dev/shm. Returns the checks.

    Raises:
        spader.training.preflight.PreflightError: one line naming each shortage.
    """
    disk = None
    if job.disk:
        disk = max(0.0, job.disk_gib - job.disk.get("export (bf16)", 0.0) - workdir_gib)
    needs = Needs(
        job.name, host_gib=job.host_gib if job.host else None, disk_gib=disk, shm_gib=shm_need([job])
    )
    return check_node(needs, node)
