"""verl's sglang rollout replica with a seed per replica, reported with every generation.

verl 0.9.1 starts each sglang replica (``SGLangHttpServer.launch_server``) with the same
``engine_kwargs.sglang``, so every replica got the project's ``random_seed`` (config.yaml
``training.seed``): with several replicas on a node, each sampled from the same seed. verl's own
vLLM server seeds replica ``r`` with ``rollout.seed + r``; this module does the same for sglang
through verl's registry (``RolloutReplicaRegistry``, rollout name ``sglang``), without changing
verl's classes:

* :func:`seed_engine_kwargs` sets ``engine_kwargs.sglang.random_seed`` of a replica's server to
  the configured seed + its replica rank before it launches sglang;
* the server answers every generation with the seed sglang's own server arguments hold
  (``tokenizer_manager.server_args.random_seed``) under
  :data:`spader.integrations.verl.episode_metrics.SEED_FIELD`, which the agent loop keeps and the
  step's ``episode/rollout_seed*`` metrics report (the GPU smoke test checks them).

:func:`register` is called by the plug-in; the classes are built when a run asks for sglang
(:func:`load_replica`), since importing verl's sglang server needs sglang (the ``gpu`` extra).
"""

from __future__ import annotations

import logging
from typing import Any

from spader.integrations.verl.episode_metrics import SEED_FIELD

__all__ = ["load_replica", "register", "replica_seed", "seed_engine_kwargs", "seeded_classes"]

log = logging.getLogger(__name__)

#: The rollout name this replica serves (verl's own).
NAME = "sglang"


def replica_seed(seed: int, replica_rank: int) -> int:
    """The seed of replica ``replica_rank`` (verl's vLLM rule: the rollout seed + the rank)."""
    return int(seed) + int(replica_rank)


def seed_engine_kwargs(config: Any, replica_rank: int) -> int:
    """Set ``engine_kwargs.sglang.random_seed`` of a server's rollout config to its replica's seed.

    The base is the configured ``random_seed`` (the project's base YAML sets it to
    ``training.seed``), else ``rollout.seed``.

    Args:
        config: verl's ``RolloutConfig`` of one server (its ``engine_kwargs`` is changed in place).
        replica_rank: the server's replica rank.
    Returns:
        The seed set.
    """
    engine_kwargs = config.engine_kwargs
    if engine_kwargs is None:
        raise ValueError(
            "actor_rollout_ref.rollout.engine_kwargs is missing (the project's base YAML sets it)"
        )
    sglang = engine_kwargs.get(NAME)
    if sglang is None:
        sglang = {}
        engine_kwargs[NAME] = sglang
        sglang = engine_kwargs[NAME]
    base = sglang.get("random_seed")
    seed = replica_seed(config.seed if base is None else base, replica_rank)
    sglang["random_seed"] = seed
    return seed


def seeded_classes(server_base: type, replica_base: type) -> tuple[type, type]:
    """Subclasses of verl's sglang server and replica (given as bases) with a seed per replica.

    Built by a function (not at module level) so that this module imports without sglang; Ray
    ships the server class to its actor by value.
    """

    class SeededSGLangHttpServer(server_base):
        """verl's ``SGLangHttpServer`` launching sglang with ``random_seed`` = seed + replica rank."""

        def __init__(self, config, model_config, *args, **kwargs):
            super().__init__(config, model_config, *args, **kwargs)
            seed = seed_engine_kwargs(self.config, self.replica_rank)
            log.info("sglang replica %d samples with random_seed %d", self.replica_rank, seed)

        async def generate(self, *args, **kwargs):
            output = await super().generate(*args, **kwargs)
            manager = getattr(self, "tokenizer_manager", None)
            args_ = getattr(manager, "server_args", None)
            seed = getattr(args_, "random_seed", None)
            if seed is not None:
                output.extra_fields = {**(output.extra_fields or {}), SEED_FIELD: int(seed)}
            return output

    class SeededSGLangReplica(replica_base):
        """verl's ``SGLangReplica`` whose servers are :class:`SeededSGLangHttpServer`."""

        def __init__(self, *args, **kwargs):
            import ray

            super().__init__(*args, **kwargs)
            self.server_class = ray.remote(SeededSGLangHttpServer)

    return SeededSGLangHttpServer, SeededSGLangReplica


def load_replica() -> type:
    """verl's sglang replica with a seed per replica (verl's own loader runs first: it prepares
    the imports sglang's server needs)."""
    from verl.workers.rollout.replica import _load_sglang

    replica_base = _load_sglang()
    from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer

    return seeded_classes(SGLangHttpServer, replica_base)[1]


def register() -> None:
    """Serve verl's rollout name ``sglang`` with :func:`load_replica` (idempotent)."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(NAME, load_replica)
