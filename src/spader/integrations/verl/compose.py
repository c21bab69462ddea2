"""Compose and validate a variant's verl config (config/verl/<variant>.yaml over verl's ppo_trainer).

The project YAMLs inherit verl's own ``ppo_trainer`` through ``hydra.searchpath:
[pkg://verl.trainer.config]`` and override only the deltas; :func:`validate` runs verl's own
``validate_config`` (the same call as ``verl.trainer.main_ppo.main``) plus the checks verl cannot
make about our plug-ins (every named estimator, trainer mode, tool parser and agent loop must be
registered, the SPADER reward settings must be well formed).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from spader.config import verl_config_dir

__all__ = ["GPU_PATH_KEYS", "compose", "gpu_path_settings", "spader_settings", "validate"]

#: Settings of a composed config that decide whether and how the models load and one turn runs on
#: the GPU path (printed by the smoke test's dry run; tests/verl check them for every variant).
GPU_PATH_KEYS = (
    "actor_rollout_ref.model.override_config.attn_implementation",
    "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.ref.strategy",
    "critic.enable",
    "critic.strategy",
    "critic.model.override_config.attn_implementation",
    "critic.model.use_remove_padding",
    "actor_rollout_ref.rollout.skip_tokenizer_init",
    "spader_agent.max_turn_tokens",
    "spader_agent.stop",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
    "trainer.max_actor_ckpt_to_keep",
    "trainer.max_critic_ckpt_to_keep",
    "data.seed",
    "actor_rollout_ref.actor.data_loader_seed",
)

_VERL_BUILTIN_ESTIMATORS = ("gae", "grpo")


def compose(
    variant_config: str, overrides: Sequence[str] = (), config_dir: str | os.PathLike | None = None
) -> DictConfig:
    """Hydra-compose ``<config_dir>/<variant_config>.yaml`` with ``overrides``.

    Args:
        variant_config: YAML name without ``.yaml`` (e.g. ``spader``).
        overrides: Hydra overrides (``key=value``, ``+new.key=value``).
        config_dir: directory of the project's verl YAMLs; training jobs pass the workflow's
            (their inputs), the default is :func:`spader.config.verl_config_dir`.
    Returns:
        The composed, unresolved config (interpolations such as ``${actor_rollout_ref.model.path}``
        are kept, as verl's own Hydra main sees them).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = Path(config_dir if config_dir is not None else verl_config_dir()).resolve()
    path = config_dir / f"{variant_config}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"verl config '{variant_config}' not found: {path} does not exist")
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(config_name=variant_config, overrides=list(overrides))


def gpu_path_settings(cfg: DictConfig) -> dict:
    """The :data:`GPU_PATH_KEYS` of a composed config, resolved (``{dotted key: value}``)."""
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    out = {}
    for key in GPU_PATH_KEYS:
        value = OmegaConf.select(resolved, key, default=None)
        out[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return out


def spader_settings(cfg: DictConfig):
    """The validated ``algorithm.spader`` block of a config (see :class:`SpaderSettings`)."""
    from spader.integrations.verl.settings import SpaderSettings

    return SpaderSettings.from_config(cfg)


def validate(cfg: DictConfig) -> None:
    """Validate a composed config as verl's training entry point would, plus our plug-in names.

    Raises:
        ValueError / AssertionError: from verl's ``validate_config`` (batch sizes, required
            fields), or naming the unknown estimator / trainer mode / parser / agent loop, or the
            bad ``algorithm.spader`` field.
    """
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import validate_config

    import spader.integrations.verl.plugin  # noqa: F401  (registrations, loudly)

    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    validate_config(
        config=resolved,
        use_reference_policy=need_reference_policy(resolved),
        use_critic=need_critic(resolved),
    )
    estimator = resolved.algorithm.adv_estimator
    if estimator not in _VERL_BUILTIN_ESTIMATORS:
        get_adv_estimator_fn(estimator)
    trainer_mode = resolved.trainer.v1.trainer_mode
    get_trainer_cls(trainer_mode)
    multi_turn = resolved.actor_rollout_ref.rollout.multi_turn
    if multi_turn.enable and multi_turn.format not in ToolParser._registry:
        raise ValueError(
            f"actor_rollout_ref.rollout.multi_turn.format: unknown tool parser '{multi_turn.format}'"
        )
    agent = resolved.actor_rollout_ref.rollout.agent.default_agent_loop
    if (
        agent not in _agent_loop_registry
        and not resolved.actor_rollout_ref.rollout.agent.agent_loop_config_path
    ):
        raise ValueError(f"actor_rollout_ref.rollout.agent.default_agent_loop: unknown agent loop '{agent}'")
    from spader.integrations.verl.scorer_rewards import check_baseline_config, step_reward_kind

    if trainer_mode == "spader_sync" and step_reward_kind(resolved) != "spader":
        check_baseline_config(resolved)  # StepSearch / R3-RAG step rewards
    elif trainer_mode == "spader_sync" or str(estimator).startswith("spader_"):
        spader_settings(resolved)
