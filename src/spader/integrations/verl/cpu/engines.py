"""verl's own FSDP training engines, registered for the ``cpu`` device.

verl 0.9.1 registers ``FSDPEngineWithLMHead`` (actor, reference) and ``FSDPEngineWithValueHead``
(critic) for ``cuda`` and ``npu`` only, and looks engines up by the platform's device name.
Their code has no device-specific branch that the CPU platform cannot answer (device mesh, gloo
collectives, ``.to(device)``), so the same classes are registered for ``cpu`` here; nothing of
them is copied or changed.
"""

from __future__ import annotations

import logging

from verl.workers.engine.base import EngineRegistry

__all__ = ["BACKENDS", "DEVICE", "register_engines"]

log = logging.getLogger(__name__)

DEVICE = "cpu"
#: verl's FSDP backends (``actor.strategy``); fsdp2 is the one the project configures.
BACKENDS = ("fsdp", "fsdp2")


def register_engines() -> dict[str, type]:
    """Register verl's FSDP engines for the CPU device (idempotent).

    Returns:
        ``{model_type: engine class}`` as registered.
    """
    # importing the module registers the classes for cuda/npu; its module-level device lookup
    # needs the platform, so the CPU platform must be registered first (the plugin does)
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    engines = {"language_model": FSDPEngineWithLMHead, "value_model": FSDPEngineWithValueHead}
    for model_type, cls in engines.items():
        by_backend = EngineRegistry._engines.get(model_type, {})
        missing = [b for b in BACKENDS if DEVICE not in by_backend.get(b, {})]
        if missing:
            EngineRegistry.register(model_type=model_type, backend=missing, device=[DEVICE])(cls)
            log.debug("registered %s for %s/%s", cls.__name__, DEVICE, missing)
    return engines
