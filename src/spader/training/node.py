"""The node a job landed on, measured, and compared with the plan: free disk where it writes, host
memory, ``/dev/shm``, the GPUs and their memory, glibc and the wheel tag pip will need, the NVIDIA
driver and ``nvcc``.

:func:`measure_node` reads the machine (``/proc/meminfo``, the process's memory cgroup,
``statvfs``, ``nvidia-smi``, ``os.confstr``, ``nvcc --version``); it needs neither torch nor
the `gpu` extra, so it runs before pip installs anything. :func:`node_checks` compares it with a
configuration's plan, every check independent of the others (``spader preflight`` prints them
all); :func:`check_job_node` compares it with one training job's plan and stops the job, before any
model loads, with one line naming what is short.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SHM_MIN_GIB",
    "Check",
    "Gpu",
    "Node",
    "check_job_node",
    "measure_node",
    "node_checks",
    "wheel_tag",
]

GIB = float(1 << 30)
#: Shared memory a GPU training needs at least: NCCL's intra-node transport and Ray's object store
#: (which falls back to a slow /tmp without it) live in /dev/shm; a container's default of 64 MiB
#: makes NCCL fail. The plan's step batch (twice) when that is more.
SHM_MIN_GIB = 1.0
#: The wheel tag of the `gpu` extra's wheels (sglang 0.5.14 ships only these).
GPU_WHEEL_GLIBC = (2, 34)


@dataclass(frozen=True)
class Gpu:
    """One GPU as ``nvidia-smi`` reports it."""

    name: str
    memory_gib: float


@dataclass
class Node:
    """What :func:`measure_node` read (GiB; None where it could not be read)."""

    ram_total_gib: float | None
    ram_available_gib: float | None
    cgroup_limit_gib: float | None
    shm_gib: float | None
    disk_path: str
    disk_free_gib: float | None
    glibc: str | None
    gpus: list[Gpu] | None = None  # None: no nvidia-smi (or it failed)
    driver: str | None = None
    nvcc_path: str | None = None
    nvcc_output: str | None = None
    #: GiB the DAG's trees (results/, resources/) already hold on that file system
    disk_used_gib: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ram_gib(self) -> float | None:
        """Host memory the node gives its jobs: its total, or the memory cgroup's limit when lower."""
        return _lower(self.ram_total_gib, self.cgroup_limit_gib)

    @property
    def ram_usable_gib(self) -> float | None:
        """Host memory a job may still take: available now, or the cgroup's limit when lower."""
        return _lower(self.ram_available_gib, self.cgroup_limit_gib)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["gpus"] = None if self.gpus is None else [asdict(g) for g in self.gpus]
        out.pop("nvcc_output")
        out["ram_gib"], out["ram_usable_gib"] = self.ram_gib, self.ram_usable_gib
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def _lower(a: float | None, b: float | None) -> float | None:
    values = [v for v in (a, b) if v is not None]
    return min(values) if values else None


def _meminfo(path: str = "/proc/meminfo") -> dict[str, float]:
    """``/proc/meminfo`` in GiB (``MemTotal``, ``MemAvailable``, ...); empty when unreadable."""
    out: dict[str, float] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * 1024 / GIB
    return out


def _cgroup_memory_limit(root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup") -> float | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``)
    in GiB; None without one (``max``, or v1's huge sentinel)."""
    try:
        lines = Path(proc).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates = [Path(root, path.lstrip("/"), "memory.max")]
        elif "memory" in controllers.split(","):
            candidates = [Path(root, "memory", path.lstrip("/"), "memory.limit_in_bytes")]
        else:
            continue
        for file in candidates:
            try:
                text = file.read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < 1 << 60:
                return int(text) / GIB
    return None


def _statvfs_gib(path: str | os.PathLike) -> float | None:
    try:
        return shutil.disk_usage(path).free / GIB
    except OSError:
        return None


def _existing(path: str | os.PathLike) -> Path:
    """``path``, or its nearest existing parent (where it would be created)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def tree_gib(*roots: str | os.PathLike) -> float:
    """GiB the files under ``roots`` take (links not followed)."""
    total = 0
    for root in roots:
        for top, _dirs, files in os.walk(root):
            for name in files:
                try:
                    total += os.lstat(os.path.join(top, name)).st_size
                except OSError:
                    pass
    return total / GIB


def gpu_inventory(run: Callable[..., Any] = subprocess.run) -> tuple[str | None, list[Gpu] | None]:
    """``(driver, GPUs)`` from ``nvidia-smi``; ``(None, None)`` without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, None
    try:
        proc = run(
            [exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if proc.returncode != 0:
        return None, None
    gpus, driver = [], None
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1].replace(".", "", 1).isdigit():
            gpus.append(Gpu(parts[0], float(parts[1]) / 1024))  # MiB
            driver = parts[2]
    return driver, gpus


def measure_node(
    path: str | os.PathLike = ".", *, trees: Sequence[str | os.PathLike] = (), gpus: bool = True
) -> Node:
    """The node as this process sees it.

    Args:
        path: where the job writes (its free space is measured on that file system).
        trees: directories whose size counts as the DAG's own (``results/``, ``resources/``).
        gpus: read ``nvidia-smi`` and ``nvcc`` (False on a machine that runs no GPU job).
    """
    from spader.training.preflight import glibc_version, nvcc_version

    mem = _meminfo()
    where = _existing(path)
    node = Node(
        ram_total_gib=mem.get("MemTotal"),
        ram_available_gib=mem.get("MemAvailable"),
        cgroup_limit_gib=_cgroup_memory_limit(),
        shm_gib=shutil.disk_usage("/dev/shm").total / GIB if os.path.isdir("/dev/shm") else None,
        disk_path=str(where),
        disk_free_gib=_statvfs_gib(where),
        glibc=glibc_version(),
        disk_used_gib=tree_gib(*[t for t in trees if os.path.isdir(t)]),
    )
    if gpus:
        node.driver, node.gpus = gpu_inventory()
        node.nvcc_path, node.nvcc_output = nvcc_version()
    return node


def wheel_tag(glibc: str | None = None) -> tuple[bool, str]:
    """Whether pip here accepts the `gpu` extra's ``manylinux_2_34`` wheels, and the line that says
    so, naming glibc and the newest manylinux tag of this interpreter."""
    want = f"manylinux_{GPU_WHEEL_GLIBC[0]}_{GPU_WHEEL_GLIBC[1]}_{platform.machine()}"
    found = re.fullmatch(r"\s*glibc\s+(\d+)\.(\d+).*", glibc or "")
    if not found:
        return (
            False,
            f"the C library is {glibc or 'not glibc'}: pip finds no {want} wheel (sglang 0.5.14 ships only those)",
        )
    have = (int(found.group(1)), int(found.group(2)))
    newest = f"manylinux_{have[0]}_{have[1]}_{platform.machine()}"
    if have < GPU_WHEEL_GLIBC:
        return False, (
            f"glibc {have[0]}.{have[1]}: pip accepts wheels up to {newest}, and sglang 0.5.14 ships only {want} "
            "(pip would say 'no matching distribution'); run on RHEL 9, Ubuntu 22.04 or later (docs/gpu.md)"
        )
    return (
        True,
        f"glibc {have[0]}.{have[1]}: pip accepts {want} (sglang 0.5.14's wheels; newest here {newest})",
    )


@dataclass
class Check:
    """One check of the node: ``ok``, ``fail`` or ``skip``, with what it found."""

    name: str
    status: str
    detail: str
    need: float | str | None = None
    have: float | str | None = None

    def line(self) -> str:
        return (
            f"{self.status.upper() if self.status == 'fail' else self.status:<5} {self.name}: {self.detail}"
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def _at_least(name: str, have: float | None, need: float, *, what: str, unit: str = "GiB") -> Check:
    def fmt(x: float) -> str:
        return f"{x:,.1f}" if unit == "GiB" else f"{x:g}"

    if have is None:
        return Check(name, "fail", f"could not measure {what}", need=need)
    if have < need:
        return Check(
            name, "fail", f"{what}: {fmt(have)} {unit}, short of the {fmt(need)} {unit} needed", need, have
        )
    return Check(name, "ok", f"{what}: {fmt(have)} {unit} (needs {fmt(need)})", need, have)


def _claim(name: str, key: str, claimed: float, measured: float | None, *, what: str) -> Check:
    """The config's description of the node against what was measured."""
    if measured is None:
        return Check(name, "fail", f"could not measure {what}, which {key} claims", claimed)
    if claimed > measured:
        return Check(
            name, "fail",
            f"{key} is {claimed:g} GiB, more than this node has: {what} measured {measured:,.1f} GiB",
            claimed, measured,
        )  # fmt: skip
    return Check(
        name,
        "ok",
        f"{key} {claimed:g} GiB within the {measured:,.1f} GiB measured ({what})",
        claimed,
        measured,
    )


def shm_need(jobs: Sequence[Any]) -> float:
    """GiB of /dev/shm the GPU jobs need: :data:`SHM_MIN_GIB`, or their step batch twice."""
    batch = [2 * j.host["training"].get("step batch", 0.0) for j in jobs if j.host]
    return max([SHM_MIN_GIB, *batch])


def _gpu_checks(node: Node, *, gpus_needed: int, peak_gib: float) -> list[Check]:
    """The driver, the GPUs and their memory, nvcc."""
    from spader.training.preflight import PreflightError, check_driver, check_nvcc

    out = []
    if node.gpus is None:
        out.append(Check("driver", "fail", "no GPU: nvidia-smi is not here (or failed); the gpu extra needs an NVIDIA "
                         "driver 580 or newer"))  # fmt: skip
    else:
        try:
            out.append(Check("driver", "ok", f"NVIDIA driver {check_driver(node.driver)}"))
        except PreflightError as exc:
            out.append(Check("driver", "fail", str(exc)))
    found = len(node.gpus or [])
    out.append(_at_least("gpus", float(found), float(gpus_needed), what="GPUs visible", unit="GPU(s)"))
    smallest = min((g.memory_gib for g in node.gpus or []), default=None)
    if smallest is None:
        out.append(Check("gpu memory", "fail", "no GPU to hold the plan's peak", need=peak_gib))
    else:
        out.append(
            _at_least(
                "gpu memory", smallest, peak_gib, what="the smallest GPU's memory against the plan's peak"
            )
        )
    try:
        out.append(
            Check(
                "nvcc", "ok", f"CUDA {check_nvcc(node.nvcc_output, path=node.nvcc_path)} ({node.nvcc_path})"
            )
        )
    except PreflightError as exc:
        out.append(Check("nvcc", "fail", str(exc)))
    return out


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
    landed on: host memory, free disk where it writes (its checkpoints at their peak, less those
    already there), /dev/shm. Returns the checks.

    Raises:
        spader.training.preflight.PreflightError: one line naming each shortage.
    """
    from spader.training.preflight import PreflightError

    checks = []
    if job.host:
        checks.append(
            _at_least("host memory", node.ram_usable_gib, job.host_gib, what="available to the job")
        )
    if job.disk:
        need = max(0.0, job.disk_gib - job.disk.get("export (bf16)", 0.0) - workdir_gib)
        checks.append(_at_least("disk", node.disk_free_gib, need, what=f"free at {node.disk_path}"))
    checks.append(_at_least("/dev/shm", node.shm_gib, shm_need([job]), what="shared memory"))
    short = [c for c in checks if c.status == "fail"]
    if short:
        raise PreflightError(
            f"{job.name} cannot run on this node ({platform.node()}): "
            + "; ".join(f"{c.name}: {c.detail}" for c in short)
            + " (the plan: spader plan; the node: spader preflight)"
        )
    return checks
