"""The node a job landed on, measured, and compared with what the job needs: free disk where it
writes, host memory, ``/dev/shm``, the GPUs and their memory, glibc and the wheel tag pip will need,
the NVIDIA driver and ``nvcc``.

:func:`measure_node` reads the machine (``/proc/meminfo``, the process's memory cgroup,
``statvfs``, ``nvidia-smi``, ``os.confstr``, ``nvcc --version``); it needs neither torch nor
the `gpu` extra, so it runs before pip installs anything. :func:`check_node` compares it with one
job's :class:`Needs` and stops the job, before any model loads, with one line naming the job and
what is short: a training (:func:`spader.training.node.check_job_node`), an evaluation, StepSearch's
evidence, the index build and the downloads all go through it. ``spader preflight`` compares the
node with a whole configuration's plan (:func:`spader.training.node.node_checks`).
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "MIN_DRIVER",
    "NVCC_MAJOR",
    "SHM_MIN_GIB",
    "Check",
    "Gpu",
    "Needs",
    "Node",
    "PreflightError",
    "check_driver",
    "check_here",
    "check_node",
    "check_nvcc",
    "driver_version",
    "glibc_version",
    "gpu_inventory",
    "measure_node",
    "nvcc_version",
    "tree_gib",
    "wheel_tag",
]

GIB = float(1 << 30)
#: Shared memory a GPU training needs at least: NCCL's intra-node transport and Ray's object store
#: (which falls back to a slow /tmp without it) live in /dev/shm; a container's default of 64 MiB
#: makes NCCL fail. The plan's step batch (twice) when that is more.
SHM_MIN_GIB = 1.0
#: The wheel tag of the `gpu` extra's wheels (sglang 0.5.14 ships only these).
GPU_WHEEL_GLIBC = (2, 34)


#: Oldest NVIDIA driver series that runs the `gpu` extra: torch 2.11 and sglang 0.5.14 are CUDA 13
#: builds, and CUDA 13.0 needs a 580 driver (docs/gpu.md).
MIN_DRIVER = 580
#: CUDA major version of the `gpu` extra's stack, whose nvcc flashinfer needs for kernels it compiles
#: at first use.
NVCC_MAJOR = 13


class PreflightError(RuntimeError):
    """A job cannot start (its inputs, its environment, or the node it landed on); the message, one
    line, names the problem and the config key or path."""


def driver_version() -> str | None:
    """The NVIDIA driver's version (``nvidia-smi``), or None when it cannot be read."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not run %s: %s", exe, exc)
        return None
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        log.warning("%s exited %d: %s", exe, proc.returncode, (proc.stderr or proc.stdout).strip()[:300])
        return None
    return lines[0]


def check_driver(version: str | None = None, *, minimum: int = MIN_DRIVER) -> str | None:
    """The NVIDIA driver is of the ``minimum`` series or newer; returns its version (None when it
    cannot be read: the GPU check then says whether torch sees the GPUs).

    Raises:
        PreflightError: an older driver (torch would see no GPU, sglang's kernels would not load).
    """
    version = version if version is not None else driver_version()
    if version is None:
        log.warning("NVIDIA driver version unknown (no nvidia-smi); the gpu extra needs %d or newer", minimum)
        return None
    try:
        major = int(version.split(".")[0])
    except ValueError:
        log.warning("unreadable NVIDIA driver version %r", version)
        return version
    if major < minimum:
        raise PreflightError(
            f"NVIDIA driver {version} is older than the {minimum} series that the gpu extra's CUDA 13 "
            f"stack needs (torch 2.11, sglang 0.5.14; docs/gpu.md): update the driver or run on another node"
        )
    return version


def glibc_version() -> str | None:
    """The C library's version string (``"glibc 2.36"``), or None when it is not glibc."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        return None


def _nvcc_path(environ: Mapping[str, str] | None = None) -> str | None:
    """nvcc as CUDA tools find it: ``$CUDA_HOME/bin/nvcc``, then ``PATH``, then /usr/local/cuda."""
    environ = os.environ if environ is None else environ
    for home in (environ.get("CUDA_HOME"), environ.get("CUDA_PATH")):
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    found = shutil.which("nvcc", path=environ.get("PATH"))
    if found:
        return found
    fallback = "/usr/local/cuda/bin/nvcc"
    return fallback if os.access(fallback, os.X_OK) else None


def nvcc_version(environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """``(path, output of nvcc --version)``; ``(None, None)`` without nvcc."""
    exe = _nvcc_path(environ)
    if exe is None:
        return None, None
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return exe, f"could not run: {exc}"
    return exe, proc.stdout + proc.stderr


def check_nvcc(output: str | None = None, *, path: str | None = None, major: int = NVCC_MAJOR) -> str:
    """``nvcc`` of CUDA ``major`` is there (flashinfer compiles the kernels its wheel lacks with it);
    returns its release.

    Args:
        output: what ``nvcc --version`` printed (``... release 13.0, V13.0.88``); run when None.
        path: where that nvcc is (for the message).
    Raises:
        PreflightError: no nvcc, an unreadable version, or another CUDA major version.
    """
    if output is None:
        path, output = nvcc_version()
    if output is None:
        raise PreflightError(
            f"no nvcc (CUDA {major} toolkit) in $CUDA_HOME/bin, on PATH or in /usr/local/cuda: flashinfer "
            "compiles the sglang kernels its wheel lacks at first use and fails without it; install the CUDA "
            f"{major} toolkit and set CUDA_HOME (docs/gpu.md)"
        )
    found = re.search(r"release\s+(\d+)\.(\d+)", output)
    where = f" ({path})" if path else ""
    if not found:
        raise PreflightError(f"unreadable nvcc version{where}: {output.strip()[:200]!r}")
    release = f"{found.group(1)}.{found.group(2)}"
    if int(found.group(1)) != major:
        raise PreflightError(
            f"nvcc{where} is CUDA {release}, but the gpu extra is a CUDA {major} stack (torch 2.11, sglang "
            f"0.5.14): flashinfer would compile kernels for the wrong CUDA; point CUDA_HOME at a CUDA {major} "
            "toolkit (docs/gpu.md)"
        )
    return release


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
    path: str | os.PathLike = ".",
    *,
    trees: Sequence[str | os.PathLike] = (),
    gpus: bool = True,
    free: Callable[[Path], float | None] | None = None,
) -> Node:
    """The node as this process sees it.

    Args:
        path: where the job writes (its free space is measured on that file system).
        trees: directories whose size counts as the DAG's own (``results/``, ``resources/``).
        gpus: read ``nvidia-smi`` and ``nvcc`` (False on a machine that runs no GPU job).
        free: GiB free on the file system of a path (default: ``statvfs``).
    """
    mem = _meminfo()
    where = _existing(path)
    node = Node(
        ram_total_gib=mem.get("MemTotal"),
        ram_available_gib=mem.get("MemAvailable"),
        cgroup_limit_gib=_cgroup_memory_limit(),
        shm_gib=shutil.disk_usage("/dev/shm").total / GIB if os.path.isdir("/dev/shm") else None,
        disk_path=str(where),
        disk_free_gib=(free or _statvfs_gib)(where),
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


def _gpu_checks(node: Node, *, gpus_needed: int, peak_gib: float, nvcc: bool = True) -> list[Check]:
    """The driver, the GPUs and their memory, nvcc (``nvcc`` False: skipped)."""
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
    if not nvcc:
        out.append(Check("nvcc", "skip", "the job compiles no kernel (it runs no sglang)"))
        return out
    try:
        out.append(
            Check(
                "nvcc", "ok", f"CUDA {check_nvcc(node.nvcc_output, path=node.nvcc_path)} ({node.nvcc_path})"
            )
        )
    except PreflightError as exc:
        out.append(Check("nvcc", "fail", str(exc)))
    return out


@dataclass(frozen=True)
class Needs:
    """What one job needs of the node it landed on; None where it is not known (not checked).

    Attributes:
        job: the job, as the refusal names it (``evaluate qwen3_8b/spader on qampari``).
        gpus: GPUs it needs visible (0: a CPU job, the GPU checks skipped and logged as such; None:
            not checked here, a training's GPUs are checked by its static checks).
        gpu_peak_gib: its plan's peak on its most loaded GPU (the smallest GPU must hold it).
        kernels: it runs sglang, whose flashinfer compiles kernels with ``nvcc`` and whose wheels
            need glibc 2.34 (checked with the GPUs).
        host_gib: host memory it needs available (``host_what`` says what that is).
        disk_gib: GiB it will write where :func:`measure_node` measured (``disk_what`` says what).
        shm_gib: ``/dev/shm`` it needs.
        unknown: what it would write or hold but nobody knows how much (said in a debug line).
    """

    job: str
    gpus: int | None = None
    gpu_peak_gib: float | None = None
    kernels: bool = False
    host_gib: float | None = None
    host_what: str = "available to the job"
    disk_gib: float | None = None
    disk_what: str | None = None
    shm_gib: float | None = None
    unknown: tuple[str, ...] = ()


def _device_checks(needs: Needs, node: Node) -> list[Check]:
    """The GPU checks of ``needs`` (skipped for a CPU job; none when it checks no GPU here)."""
    if needs.gpus is None:
        return []
    if needs.gpus == 0:
        why = "none needed: the job runs on the CPU"
        return [Check(name, "skip", why) for name in ("driver", "gpus", "gpu memory", "nvcc", "glibc")]
    checks = _gpu_checks(node, gpus_needed=needs.gpus, peak_gib=needs.gpu_peak_gib or 0.0, nvcc=needs.kernels)
    if needs.gpu_peak_gib is None:
        checks = [c if c.name != "gpu memory" else Check(c.name, "skip", "no planned peak") for c in checks]
    ok, line = wheel_tag(node.glibc)
    checks.append(Check("glibc", "ok" if ok else "fail", line, have=node.glibc) if needs.kernels
                  else Check("glibc", "skip", "the job installs and runs no sglang wheel"))  # fmt: skip
    return checks


def check_node(needs: Needs, node: Node, *, logger: logging.Logger | None = None) -> list[Check]:
    """``needs`` against ``node``: the GPUs (their count, the smallest one's memory against the
    peak, the driver, and nvcc and glibc for a job that runs sglang), host memory available, free
    disk where the job writes, ``/dev/shm``. Each check goes to ``logger`` (info) when given, and
    what is not known to a debug line. Returns the checks.

    Raises:
        PreflightError: one line naming the job and each shortage with its figures.
    """
    checks = _device_checks(needs, node)
    if needs.host_gib is not None:
        checks.append(_at_least("host memory", node.ram_usable_gib, needs.host_gib, what=needs.host_what))
    if needs.disk_gib is not None:
        what = f"free at {node.disk_path}" + (f" for {needs.disk_what}" if needs.disk_what else "")
        checks.append(_at_least("disk", node.disk_free_gib, needs.disk_gib, what=what))
    if needs.shm_gib is not None:
        checks.append(_at_least("/dev/shm", node.shm_gib, needs.shm_gib, what="shared memory"))
    if logger is not None:
        for check in checks:
            logger.info("node: %s", check.line())
        for what in needs.unknown:
            logger.debug("node: %s: not checked, %s", needs.job, what)
    short = [c for c in checks if c.status == "fail"]
    if short:
        raise PreflightError(
            f"{needs.job} cannot run on this node ({platform.node()}): "
            + "; ".join(f"{c.name}: {c.detail}" for c in short)
            + " (the plan: spader plan; the node: spader preflight)"
        )
    return checks


def check_here(
    needs: Needs,
    path: str | os.PathLike,
    *,
    measure: Callable[..., Node] | None = None,
    logger: logging.Logger | None = None,
) -> list[Check]:
    """Measure this node (``measure``: :func:`measure_node`; where the job writes: ``path``; the
    GPUs only when the job needs some) and check ``needs`` against it (:func:`check_node`), each
    check in ``logger``'s log.

    Raises:
        PreflightError: one line naming the job and what is short.
    """
    node = (measure or measure_node)(path, gpus=bool(needs.gpus))
    return check_node(needs, node, logger=logger or log)
