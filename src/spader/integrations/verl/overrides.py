"""Hydra overrides that carry config/config.yaml into a variant's verl config.

``config.yaml`` is the single source of every number: ``config/verl/<variant>.yaml`` carries only
the structure verl needs beyond it (estimator, trainer mode, critic on or off, strategies,
attention, memory settings, constants of the baselines without a config key). The training
launcher composes ``variants.<v>.verl_config`` with :func:`config_overrides` (this module: the
method's keys, ``training.*`` and ``agent.*``) plus its own overrides (data, model, GPUs, device,
logger, checkpoints, tool config); every value is rendered by
:func:`spader.integrations.verl.hydra.hydra_value`.

:data:`TRAINING_KEYS` and :data:`AGENT_KEYS` map ``training.<key>`` / ``agent.<key>`` of
config.yaml to the verl key that receives it.

:func:`training_identity` names what a variant trains by composing it with Hydra: two variants
whose configs compose to the same result (``no_np`` and ``beta_0``, ``spader`` and ``beta_4``) are
one training run, which the workflow trains once (:func:`shared_training_runs`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spader.config.model import AgentConfig, DivergencesConfig, TrainingConfig, VariantConfig
from spader.integrations.verl.hydra import hydra_value
from spader.methods import REWARDS, advantage_spec, reward_spec, verl_yaml

__all__ = [
    "AGENT_KEYS",
    "POLICY_LOSS_MODES",
    "TRAINING_KEYS",
    "actor_path_overrides",
    "agent_overrides",
    "config_overrides",
    "method_overrides",
    "method_settings",
    "shared_training_runs",
    "training_identity",
    "training_overrides",
]

#: config.yaml ``training.<key>`` -> the verl key that receives it (every one exists in verl's ppo_trainer).
TRAINING_KEYS = {
    "epochs": "trainer.total_epochs",
    "train_batch_size": "data.train_batch_size",
    "ppo_mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "ppo_micro_batch_size_per_gpu": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "lr": "actor_rollout_ref.actor.optim.lr",
    "lr_warmup_ratio": "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
    "rollout_n": "actor_rollout_ref.rollout.n",
    "temperature": "actor_rollout_ref.rollout.temperature",
    "top_p": "actor_rollout_ref.rollout.top_p",
    "kl_loss_coef": "actor_rollout_ref.actor.kl_loss_coef",
    "kl_loss_type": "actor_rollout_ref.actor.kl_loss_type",
    "max_prompt_length": "data.max_prompt_length",
    "max_response_length": "data.max_response_length",
    "gpu_memory_utilization": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "save_freq": "trainer.save_freq",
    "test_freq": "trainer.test_freq",
    "val_before_train": "trainer.val_before_train",
    "max_actor_ckpt_to_keep": "trainer.max_actor_ckpt_to_keep",
    "max_critic_ckpt_to_keep": "trainer.max_critic_ckpt_to_keep",
    # base.yaml points data.seed (prompt order), the critic's mini-batch seed, verl's rollout seed
    # and sglang's random_seed at this key, so the one value seeds them all
    "seed": "actor_rollout_ref.actor.data_loader_seed",
    "shuffle": "data.shuffle",
}

#: ``training.policy_ratio`` -> the policy loss verl's actor uses (``policy_loss.loss_mode``):
#: verl's own ``vanilla`` (a clipped ratio per token, token-mean) or the paper's ratio per decision
#: step, registered by the plug-in (:mod:`spader.integrations.verl.policy_loss`).
POLICY_LOSS_MODES = {"token": "vanilla", "step": "spader_step_ratio"}
POLICY_LOSS_KEY = "actor_rollout_ref.actor.policy_loss.loss_mode"

#: Keys of the project's own blocks, which verl's ppo_trainer does not define: their overrides are
#: written ``++key=value`` (set, or add when missing), so they compose over any project YAML. The
#: rewards' own blocks (:attr:`spader.methods.Reward.verl_blocks`) are added by :func:`_project_key`.
_PROJECT_KEYS = (
    "algorithm.step_reward",
    "reward.custom_reward_function.reward_kwargs.",
    "spader_agent.",
)


def _project_key(key: str) -> bool:
    """Whether ``key`` is one of the project's own verl keys (written ``++key=value``)."""
    blocks = tuple(b for r in REWARDS.values() for b in r.verl_blocks)
    return key.startswith((*_PROJECT_KEYS, *blocks))


#: config.yaml ``agent.<key>`` -> verl key: what one turn is, the same as in evaluation. The
#: ``spader_agent`` block is read by the ``spader_tool_agent`` loop; ``max_queries_per_call``
#: goes to the search tool's YAML instead, ``prompt_template`` to data export.
AGENT_KEYS = {
    "max_turns": "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
    "max_tool_response_chars": "actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
    "max_turn_tokens": "spader_agent.max_turn_tokens",
    "stop": "spader_agent.stop",
    "regenerations": "spader_agent.regenerations",
    "parser": "spader_agent.parser",
    "observation_format": "spader_agent.observation_format",
    "turn_boundary": "spader_agent.turn_boundary",
}
#: ``agent.parser`` -> the tool parser verl's multi-turn rollout uses (``multi_turn.format``) and
#: the terminal reward reads answers with (``reward_kwargs.parser``).
PARSER_FORMATS = {"spader": "spader", "authors": "spader_authors"}


def _num(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def method_settings(
    variant: VariantConfig | Mapping[str, Any], training: TrainingConfig | Mapping[str, Any]
) -> dict[str, Any]:
    """The verl keys a config.yaml variant sets, with their values (what :func:`method_overrides`
    renders as overrides and :func:`training_identity` hashes): the estimator and terminal reward
    every variant has, then what its reward adds (:attr:`spader.methods.Reward.verl_settings`).

    Args:
        variant: ``config["variants"][name]`` (validated as a :class:`VariantConfig`; its
            ``invalid_format_reward`` is the terminal reward of an invalid format).
        training: ``config["training"]`` (``gamma`` and ``divergences`` are used).
    Returns:
        ``{dotted verl key: value}`` in a fixed order.
    Raises:
        ValueError: the variant or section is invalid (an advantage that does not train the reward, ...).
    """
    variant = variant if isinstance(variant, VariantConfig) else VariantConfig.model_validate(dict(variant))
    if isinstance(training, TrainingConfig):
        training = training.model_dump(mode="json")
    else:
        training = {
            **training,
            "divergences": DivergencesConfig.model_validate(dict(training["divergences"])).model_dump(
                mode="json"
            ),
        }
    reward = reward_spec(variant.reward)
    aliases = training["divergences"]["aliases"]
    out: dict[str, Any] = {
        "algorithm.adv_estimator": advantage_spec(variant.advantage).estimator,
        "reward.custom_reward_function.reward_kwargs.invalid_format_reward": _num(
            variant.invalid_format_reward, "variant invalid_format_reward"
        ),
        "reward.custom_reward_function.reward_kwargs.aliases": aliases,
        "spader_agent.aliases": aliases,
    }
    if reward.step_reward is None:  # verl's own terminal reward
        out["trainer.v1.trainer_mode"] = "sync"
        return out
    out["trainer.v1.trainer_mode"] = "spader_sync"
    out["algorithm.step_reward"] = reward.step_reward
    out.update(reward.verl_settings(variant.settings(), training))
    return out


def method_overrides(variant: Mapping[str, Any], training: Mapping[str, Any]) -> list[str]:
    """Hydra overrides that set the method of one config.yaml variant (:func:`method_settings`).

    Returns:
        Overrides for :func:`spader.integrations.verl.compose.compose`. Keys of the project's own
        blocks are written ``++key=value`` (set, or add when missing): no YAML carries them.

    >>> grpo = {"verl_config": "grpo", "advantage": "grpo", "reward": "terminal", "invalid_format_reward": -1.0}
    >>> for o in method_overrides(grpo, {"gamma": 0.9, "divergences": {}}):
    ...     print(o)
    algorithm.adv_estimator=spader_grpo
    ++reward.custom_reward_function.reward_kwargs.invalid_format_reward=-1.0
    ++reward.custom_reward_function.reward_kwargs.aliases=aware
    ++spader_agent.aliases=aware
    trainer.v1.trainer_mode=sync
    """
    out = []
    for key, value in method_settings(variant, training).items():
        prefix = "++" if _project_key(key) else ""
        out.append(f"{prefix}{key}={hydra_value(value)}")
    return out


def agent_overrides(agent: Mapping[str, Any]) -> list[str]:
    """``config["agent"]`` as verl overrides (:data:`AGENT_KEYS`; values quoted for Hydra).

    Raises:
        KeyError: a mapped agent key is missing (the message names ``agent.<key>``).
    """
    out = []
    for name, key in AGENT_KEYS.items():
        if name not in agent:
            raise KeyError(f"config key 'agent.{name}' is missing (verl's {key})")
        value = agent[name]
        prefix = "++" if _project_key(key) else ""
        out.append(f"{prefix}{key}={hydra_value(list(value) if name == 'stop' else value)}")
    parser = agent["parser"]
    if parser not in PARSER_FORMATS:
        raise ValueError(f"config key 'agent.parser' must be one of {sorted(PARSER_FORMATS)}, got {parser!r}")
    out.append(f"actor_rollout_ref.rollout.multi_turn.format={PARSER_FORMATS[parser]}")
    out.append(f"++reward.custom_reward_function.reward_kwargs.parser={parser}")
    return out


def training_overrides(training: Mapping[str, Any]) -> list[str]:
    """``config["training"]`` as verl overrides, through :data:`TRAINING_KEYS`.

    Raises:
        KeyError: a mapped training key is missing (the message names ``training.<key>``).
    """
    out = []
    for name, key in TRAINING_KEYS.items():
        if name not in training:
            raise KeyError(f"config key 'training.{name}' is missing (verl's {key})")
        out.append(f"{key}={hydra_value(training[name])}")
    ratio = training["policy_ratio"] if "policy_ratio" in training else _default("policy_ratio")
    if ratio not in POLICY_LOSS_MODES:
        raise ValueError(
            f"config key 'training.policy_ratio' must be one of {sorted(POLICY_LOSS_MODES)}, got {ratio!r}"
        )
    out.append(f"{POLICY_LOSS_KEY}={POLICY_LOSS_MODES[ratio]}")
    return [*out, *actor_path_overrides(training)]


def _default(name: str) -> Any:
    """The typed model's default of ``training.<name>`` (a section as config.yaml writes it)."""
    return TrainingConfig.model_fields[name].default


def actor_path_overrides(training: Mapping[str, Any]) -> list[str]:
    """How the actor, reference and critic passes batch their tokens (``training.remove_padding``,
    ``training.max_token_len_per_gpu``; docs/gpu.md).

    The packed path is verl's remove-padding path with the project's variable-length attention
    (:data:`spader.integrations.verl.packed_attention.NAME`) for the policy and the critic; a token
    cap turns on verl's dynamic micro-batches for every pass (the log-prob passes and the critic's
    follow the actor's settings in verl's config). The padded path keeps the project YAMLs'
    ``sdpa`` with an attention mask and fixed micro-batches.

    A key the mapping lacks (a ``training`` section as config.yaml writes it, without the keys at
    their defaults) has the typed model's default.
    """
    from spader.config.model import TrainingConfig

    def setting(name: str):
        return training[name] if name in training else TrainingConfig.model_fields[name].default

    out: list[str] = []
    if setting("remove_padding"):
        from spader.integrations.verl.packed_attention import NAME

        for model in ("actor_rollout_ref.model", "critic.model"):
            out += [f"{model}.use_remove_padding=true", f"{model}.override_config.attn_implementation={NAME}"]
    cap = setting("max_token_len_per_gpu")
    if cap is not None:
        out += [
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={int(cap)}",
            f"critic.ppo_max_token_len_per_gpu={int(cap)}",
        ]
    return out


def config_overrides(
    variant: Mapping[str, Any], training: Mapping[str, Any], agent: Mapping[str, Any] | None = None
) -> list[str]:
    """Everything config.yaml gives one variant's verl config: :func:`method_overrides`,
    :func:`training_overrides` and :func:`agent_overrides` (the section's defaults without ``agent``).

    The project YAMLs carry structure only, so a variant YAML composed without these overrides has
    verl's defaults (batch 1024, one rollout, ...) rather than the paper's setup; the training
    launcher adds its job's overrides (paths, GPUs, device) after them.
    """
    return [
        *method_overrides(variant, training),
        *training_overrides(training),
        *agent_overrides(agent if agent is not None else AgentConfig().model_dump(mode="json")),
    ]


def _chain_fingerprint(name: str, config_dir: Path) -> str:
    """sha256 over the bytes of the project YAMLs ``name`` composes from (a cache key)."""
    from spader.config import verl_config_chain

    digest = hashlib.sha256()
    for path in verl_config_chain(name, config_dir):
        digest.update(path.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return digest.hexdigest()


def _chain_documents(name: str, config_dir: Path) -> str:
    """The parsed YAML documents of ``name``'s project chain, in order, as canonical JSON: two
    chains with equal documents compose to the same config."""
    import yaml

    from spader.config import verl_config_chain

    chain = verl_config_chain(name, config_dir)
    if not chain:
        raise ValueError(f"verl config {name!r} is not in {config_dir}")
    docs = []
    for path in chain:
        with open(path, encoding="utf-8") as f:
            docs.append(yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {})
    return json.dumps(docs, sort_keys=True, default=str)


#: :func:`training_identity` results of this process, keyed by the YAML files' bytes and the overrides.
_IDENTITIES: dict[tuple[str, ...], str] = {}


def training_identity(
    variant: Mapping[str, Any], training: Mapping[str, Any], config_dir: str | os.PathLike
) -> str:
    """Hash of what a variant trains: its verl YAML composed by Hydra
    (:func:`spader.integrations.verl.compose.compose`, verl's ``ppo_trainer`` included) with its
    :func:`method_overrides`, resolved. The backbone, ``training`` and ``agent`` sections are shared
    by every variant of a backbone and compared by the workflow's params instead.

    A composition takes about a second, so results are kept for the life of the process, keyed by
    the bytes of the YAML chain and the overrides (an edited YAML composes again).

    Returns:
        A sha256 hex digest; equal digests mean the same composed training config.
    """
    config_dir = Path(config_dir).resolve()
    name = verl_yaml(variant)
    overrides = method_overrides(variant, training)
    key = (str(config_dir), name, _chain_fingerprint(name, config_dir), *overrides)
    if key not in _IDENTITIES:
        from omegaconf import OmegaConf

        from spader.integrations.verl.compose import compose

        resolved = OmegaConf.to_container(compose(name, overrides, config_dir=config_dir), resolve=True)
        _IDENTITIES[key] = hashlib.sha256(
            json.dumps(resolved, sort_keys=True, default=str).encode()
        ).hexdigest()
    return _IDENTITIES[key]


def shared_training_runs(
    variants: Sequence[str],
    specs: Mapping[str, Mapping[str, Any]],
    training: Mapping[str, Any],
    config_dir: str | os.PathLike,
) -> dict[str, str]:
    """The training run of each variant of one backbone: the first variant (in ``variants``
    order) whose config composes to the same result (:func:`training_identity`; Hydra composes only
    variants whose method settings are equal and whose YAML chains differ, so the paper config's
    DAG build composes nothing).

    Args:
        variants: the backbone's variants (``backbones.<b>.variants``).
        specs: ``config["variants"]``.
        training: ``config["training"]``.
        config_dir: the project's verl YAML directory.
    Returns:
        ``{variant: variant whose run it shares}`` (itself when its run is its own).

    With the paper config, ``beta_4`` maps to ``spader`` and ``beta_0`` to ``no_np``.
    """
    # Variants whose method settings differ cannot compose to the same config (the overrides set
    # those keys last): only variants with equal settings are compared. Among those, YAML chains
    # that parse to the same documents compose to the same config (the variant's own file name is
    # no input of the composition); the others are composed by Hydra and compared.
    settings: dict[str, str] = {}
    for name in variants:
        try:
            settings[name] = json.dumps(method_settings(specs[name], training), sort_keys=True, default=str)
        except (ValueError, KeyError):
            settings[name] = f"unresolved:{name}"
    groups: dict[str, list[str]] = {}
    for name in variants:
        groups.setdefault(settings[name], []).append(name)
    identities: dict[str, str] = {}
    for key, members in groups.items():
        if len(members) < 2 or key.startswith("unresolved:"):
            identities.update({m: f"alone:{m}" for m in members})
            continue
        try:
            docs = {m: _chain_documents(verl_yaml(specs[m]), Path(config_dir)) for m in members}
        except (OSError, ValueError, KeyError):
            identities.update({m: f"unresolved:{m}" for m in members})
            continue
        if len(set(docs.values())) == 1:
            identities.update({m: f"{key}\n{docs[m]}" for m in members})
            continue
        for m in members:
            try:
                identities[m] = training_identity(specs[m], training, config_dir)
            except Exception:  # noqa: BLE001  (Hydra and OmegaConf raise their own types)
                # a variant whose config cannot be composed is never merged with another; its own
                # launch reports the problem
                identities[m] = f"unresolved:{m}"
    first: dict[str, str] = {}
    return {name: first.setdefault(identities[name], name) for name in variants}
