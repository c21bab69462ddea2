"""Compose and validate a variant's verl config (config/verl/<variant>.yaml over verl's ppo_trainer).

The project YAMLs inherit verl's own ``ppo_trainer`` through ``hydra.searchpath:
[pkg://verl.trainer.config]`` and override only the deltas; :func:`validate` runs verl's own
``validate_config`` (the same call as ``verl.trainer.main_ppo.main``) plus the checks verl cannot
make about our plug-ins (every named estimator, trainer mode, tool parser and agent loop must be
registered, the SPADER reward settings must be well formed).

Composition reads verl's ``ppo_trainer`` from the installed wheel's files (``file://``) rather than
through ``pkg://verl.trainer.config``, which would import verl (and with it torch and Ray, tens of
seconds) in processes that only compose, such as the workflow's DAG build.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from spader.config import verl_config_dir

__all__ = [
    "GPU_PATH_KEYS",
    "VERL_CONFIG_PACKAGE",
    "compose",
    "gpu_path_settings",
    "validate",
    "verl_trainer_config_dir",
]

#: The Hydra search path entry of verl's own trainer configs, as the project YAMLs name it.
VERL_CONFIG_PACKAGE = "pkg://verl.trainer.config"

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
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.model.use_fused_kernels",
    "actor_rollout_ref.model.fused_kernel_options.impl_backend",
    "actor_rollout_ref.actor.entropy_checkpointing",
    "critic.fsdp.param_offload",
    "critic.fsdp.optimizer_offload",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.engine_kwargs.sglang.random_seed",
    "spader_agent.max_turn_tokens",
    "spader_agent.stop",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
    "trainer.max_actor_ckpt_to_keep",
    "trainer.max_critic_ckpt_to_keep",
    "trainer.device",
    "data.max_prompt_length",
    "data.max_response_length",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "data.seed",
    "actor_rollout_ref.actor.data_loader_seed",
)

_VERL_BUILTIN_ESTIMATORS = ("gae", "grpo")


@cache
def verl_trainer_config_dir() -> Path:
    """The directory of verl's trainer YAMLs in the installed wheel, found without importing verl.

    Raises:
        ModuleNotFoundError: verl is not installed.
    """
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed; composing a variant needs its ppo_trainer config")
    path = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    if not (path / "ppo_trainer.yaml").is_file():
        raise FileNotFoundError(f"verl's ppo_trainer.yaml is not in {path}")
    return path


def _searchpath_override(path: Path) -> list[str]:
    """``hydra.searchpath`` of the primary YAML with verl's package entry read from its files."""
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f) or {}
    entries = list(((doc.get("hydra") or {}).get("searchpath")) or [])
    if VERL_CONFIG_PACKAGE not in entries:
        return []
    entries = [f"file://{verl_trainer_config_dir()}" if e == VERL_CONFIG_PACKAGE else e for e in entries]
    return [f"hydra.searchpath=[{','.join(entries)}]"]


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
        return hydra_compose(config_name=variant_config, overrides=[*_searchpath_override(path), *overrides])


def gpu_path_settings(cfg: DictConfig) -> dict:
    """The :data:`GPU_PATH_KEYS` of a composed config, resolved (``{dotted key: value}``)."""
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    out = {}
    for key in GPU_PATH_KEYS:
        value = OmegaConf.select(resolved, key, default=None)
        out[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return out


def validate(cfg: DictConfig) -> None:
    """Validate a composed config as verl's training entry point would, plus our plug-in names.

    Raises:
        ValueError / AssertionError: from verl's ``validate_config`` (batch sizes, required
            fields), or naming the unknown estimator / trainer mode / parser / agent loop, or the
            bad field of the step rewards' settings (:attr:`spader.methods.Reward.checks`).
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
    if trainer_mode == "spader_sync":  # the step rewards' own checks (the method registry's)
        from spader.integrations.verl.step_rewards import check_step_rewards

        check_step_rewards(resolved)
