"""verl platform ``cpu``: the trainer's device abstraction backed by the host CPU.

verl 0.9.1 asks one platform object (:func:`verl.plugin.platform.get_platform`) for everything
device-specific: the torch device name and module, the collective backend, seeding, memory
hooks and the Ray resource its workers are scheduled on. This one answers for the CPU:

* device ``cpu``, collectives over gloo, seeding through torch's global generator;
* memory and profiler hooks are no-ops (there is no device memory to release or measure);
* the device module is ``torch.cpu`` plus the handful of ``torch.cuda``-style functions verl
  calls on it (``empty_cache``, ``mem_get_info``, ``get_rng_state``...), answered for host memory;
* Ray resource ``GPU``: verl's resource-pool check only counts ``GPU``/``NPU`` resources, so each
  training worker occupies one *logical* device slot; the launcher starts Ray with as many slots
  as workers (Ray resources are scheduling tokens, not hardware).

It is never auto-detected (:meth:`PlatformCPU.is_platform_available` is False): the training
launcher selects it with ``VERL_PLATFORM=cpu`` when ``training.device`` is ``cpu``.
:func:`init_worker_process_group` works around the one verl line that cannot start a CPU worker.
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

__all__ = ["NAME", "PlatformCPU", "cpu_device_module", "init_worker_process_group", "selected"]

log = logging.getLogger(__name__)

#: ``VERL_PLATFORM`` value that selects this platform.
NAME = "cpu"


def _host_memory() -> tuple[int, int]:
    """``(free, total)`` bytes of host memory, the shape of ``torch.cuda.mem_get_info``."""
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def _zero(*args, **kwargs) -> int:
    return 0


def _nothing(*args, **kwargs) -> None:
    return None


def cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` completed with the ``torch.cuda`` functions verl calls on its device module.

    Returns:
        A module object: attributes it does not define are looked up on ``torch.cpu``.
    """
    module = types.ModuleType("spader_cpu_device")
    extra = {
        # no caching allocator on the host: nothing to release or collect
        "empty_cache": _nothing,
        "ipc_collect": _nothing,
        "set_per_process_memory_fraction": _nothing,
        "reset_peak_memory_stats": _nothing,
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "mem_get_info": lambda *a, **k: _host_memory(),
        # the host RNG is torch's global generator
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "get_device_name": lambda *a, **k: "cpu",
        "is_available": lambda: True,
    }
    for name, value in extra.items():
        setattr(module, name, value)
    module.__getattr__ = lambda name: getattr(torch.cpu, name)  # type: ignore[attr-defined]
    return module


def selected(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process runs on the CPU platform (``VERL_PLATFORM=cpu``)."""
    return environ.get("VERL_PLATFORM", "").strip().lower() == NAME


def init_worker_process_group(environ: Mapping[str, str] = os.environ) -> bool:
    """Create the default gloo process group of a verl worker-group process on the CPU platform.

    verl's training worker initializes torch.distributed with the backend string
    ``f"cpu:gloo,{device}:{backend}"`` (``verl/utils/distributed.py``, line 89,
    ``initialize_global_process_group_ray``), which torch rejects when the device is the CPU
    ("Duplicate device type cpu"). verl skips that initialization when a default group already
    exists, so on the CPU platform the group is created here, with the rank, world size and
    rendezvous address verl's worker group put in the process environment (``WG_BACKEND=ray``,
    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) - the same group verl would create,
    minus the duplicate device entry. The plug-in calls it when verl is imported, which is the
    first thing a worker-group process does; every other process is left alone.

    Args:
        environ: the process environment.
    Returns:
        True when the group was created here.
    """
    if not selected(environ) or environ.get("WG_BACKEND") != "ray":
        return False
    if not all(k in environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return False
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group(
        backend="gloo",
        rank=int(environ["RANK"]),
        world_size=int(environ["WORLD_SIZE"]),
        init_method=environ.get("DIST_INIT_METHOD") or None,
    )
    log.info("gloo process group: rank %s of %s", environ["RANK"], environ["WORLD_SIZE"])
    return True


@PlatformRegistry.register(platform=NAME)
class PlatformCPU(PlatformBase):
    """The host CPU as verl's device (see the module docstring)."""

    def __init__(self):
        self._module = cpu_device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # only ever selected explicitly (VERL_PLATFORM=cpu), never by auto-detection
        return False

    def current_device(self) -> str:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it on actors holding logical GPU slots (see ray_resource_name); nothing reads it
        # for a device here, but verl's helpers expect the variable to exist.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
