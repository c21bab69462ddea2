"""verl's own trainer on the CPU, through verl 0.9.1's extension points (no fork, no patching).

* :mod:`.platform` - platform ``cpu`` for ``verl.plugin.platform.PlatformRegistry`` (gloo, no
  device memory, logical Ray device slots), selected with ``VERL_PLATFORM=cpu``;
* :mod:`.engines` - verl's FSDP engines registered for the ``cpu`` device;
* :mod:`.replica` - rollout backend ``transformers``: a replica whose server decodes with
  transformers (sglang's sampling semantics) and receives the actor's weights after each update.

:func:`register` is called by the SPADER verl plugin in every process; the platform is registered
first because importing verl's engine module already asks for the platform. Nothing here is
active unless a run selects it (``VERL_PLATFORM=cpu``, ``rollout.name=transformers``), which the
training launcher does when ``training.device`` is ``cpu``.
"""

from __future__ import annotations

__all__ = ["PLATFORM", "ROLLOUT", "register", "register_rollout"]

PLATFORM = "cpu"
ROLLOUT = "transformers"
_REPLICA_MODULE = "spader.integrations.verl.cpu.replica"


def _load_replica():
    import importlib

    return importlib.import_module(_REPLICA_MODULE).TransformersReplica


def register_rollout() -> None:
    """Register the ``transformers`` replica and its weight-sync adapter with verl (idempotent).

    The replica goes through ``RolloutReplicaRegistry`` (a loader, called when a run uses it); the
    adapter that hybrid training workers build with ``get_rollout_class(name, "async")`` is looked
    up in verl's rollout-class table, which maps ``(name, mode)`` to a dotted class path. Neither
    imports :mod:`.replica` here: a process whose first import is that module (the replica's
    server actor) imports verl, hence this plug-in, while the module is still half loaded.
    """
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT, _load_replica)
    base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{_REPLICA_MODULE}.TransformersServerAdapter"


def register() -> dict[str, object]:
    """Register the CPU platform, the FSDP engines for ``cpu`` and the ``transformers`` rollout.

    Returns:
        What was registered (for the plug-in's ``REGISTERED`` summary).
    """
    from spader.integrations.verl.cpu import platform  # (registers the platform)
    from spader.integrations.verl.cpu.engines import register_engines

    # a worker-group process of a CPU run: its process group, before verl builds an invalid one
    platform.init_worker_process_group()
    engines = register_engines()
    register_rollout()
    return {"platforms": (PLATFORM,), "engines": tuple(engines), "rollouts": (ROLLOUT,)}
