"""Hydra overrides that set a variant's method from config/config.yaml.

``config.yaml`` is the single source of the numbers at launch; ``config/verl/<variant>.yaml``
carries the structure and the paper's values so that it composes on its own. The training
launcher composes ``variants.<v>.verl_config`` with :func:`method_overrides` (this module) plus
its own overrides (data, model, batch sizes, rollout, GPUs, logger, checkpoints, tool config) and
:func:`agent_overrides` (the turn settings training shares with evaluation, ``agent.*``).

:data:`TRAINING_KEYS` and :data:`AGENT_KEYS` map ``training.<key>`` / ``agent.<key>`` of
config.yaml to the verl key the project YAMLs carry for it (tests/verl check that the two agree,
so they never drift apart).

:func:`training_identity` names what a variant trains: two variants whose method settings and
project YAMLs resolve to the same config (``no_np`` and ``beta_0``, ``spader`` and ``beta_4``) are
one training run, which the workflow trains once (:func:`shared_training_runs`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from spader.integrations.verl.hydra import hydra_value

__all__ = [
    "AGENT_DEFAULTS",
    "AGENT_KEYS",
    "ESTIMATORS",
    "TRAINING_KEYS",
    "agent_overrides",
    "method_overrides",
    "method_settings",
    "shared_training_runs",
    "training_identity",
]

#: config.yaml ``variants.<v>.advantage`` -> verl ``algorithm.adv_estimator``.
ESTIMATORS = {
    "spa": "spader_spa",
    "grpo_return": "spader_traj",
    "grpo": "grpo",
    "gae": "gae",
    "turn_gae": "r3rag_turn_gae",  # R3-RAG's per-turn GAE (spader.integrations.verl.turn_gae)
}
#: config.yaml ``variants.<v>.reward`` of the step-level baselines -> the advantage each is defined with.
BASELINE_REWARDS = {"stepsearch": "gae", "r3rag": "turn_gae"}

#: config.yaml ``training.<key>`` -> the verl key holding it (values carried by config/verl/base.yaml).
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
    "max_actor_ckpt_to_keep": "trainer.max_actor_ckpt_to_keep",
    "max_critic_ckpt_to_keep": "trainer.max_critic_ckpt_to_keep",
    # base.yaml points data.seed (prompt order), the critic's mini-batch seed and the rollout
    # engine's seed at this key, so the one value seeds them all
    "seed": "actor_rollout_ref.actor.data_loader_seed",
}

#: config.yaml ``agent.<key>`` -> verl key: what one turn is, the same as in evaluation. The
#: ``spader_agent`` block is read by the ``spader_tool_agent`` loop; ``max_queries_per_call``
#: goes to the search tool's YAML instead, ``prompt_template`` to data export.
AGENT_KEYS = {
    "max_turns": "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
    "max_tool_response_chars": "actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
    "max_turn_tokens": "spader_agent.max_turn_tokens",
    "stop": "spader_agent.stop",
}


#: config.yaml's ``agent`` defaults (the schema's), for jobs built without a workflow config.
AGENT_DEFAULTS = {
    "max_turns": 16,
    "max_turn_tokens": 1024,
    "max_tool_response_chars": 11000,
    "max_queries_per_call": 10,
    "stop": ["</tool_call>", "</answer>"],
}


def _num(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def method_settings(variant: Mapping[str, Any], training: Mapping[str, Any]) -> dict[str, Any]:
    """The verl keys a config.yaml variant sets, with their values (what :func:`method_overrides`
    renders as overrides and :func:`training_identity` hashes).

    Args:
        variant: ``config["variants"][name]`` (``advantage``, ``reward``, ``alpha``, ``beta``,
            ``cost``).
        training: ``config["training"]`` (``gamma`` and ``divergences`` are used).
    Returns:
        ``{dotted verl key: value}`` in a fixed order.
    """
    advantage, reward = variant.get("advantage"), variant.get("reward")
    if advantage not in ESTIMATORS:
        raise ValueError(f"variant advantage must be one of {sorted(ESTIMATORS)}, got {advantage!r}")
    if reward not in ("step", "terminal", *BASELINE_REWARDS):
        raise ValueError(
            f"variant reward must be one of step, terminal, {', '.join(BASELINE_REWARDS)}, got {reward!r}"
        )
    if (reward in BASELINE_REWARDS or advantage == "turn_gae") and BASELINE_REWARDS.get(reward) != advantage:
        raise ValueError(
            f"reward {reward!r} and advantage {advantage!r} do not go together ({BASELINE_REWARDS})"
        )
    if advantage == "gae" and reward == "step":
        raise ValueError(
            "PPO (advantage gae) is trained on the terminal reward; dense step rewards need spa/grpo_return"
        )
    if advantage in ("spa", "grpo_return") and reward != "step":
        raise ValueError(f"advantage {advantage!r} is defined on the step rewards (reward: step)")
    divergences = training.get("divergences") or {}
    out: dict[str, Any] = {
        "algorithm.adv_estimator": ESTIMATORS[advantage],
        "reward.custom_reward_function.reward_kwargs.invalid_format_reward": _num(
            divergences.get("invalid_format_reward", -1.0), "training.divergences.invalid_format_reward"
        ),
    }
    if reward == "terminal":
        out["trainer.v1.trainer_mode"] = "sync"
        return out
    if reward in BASELINE_REWARDS:  # docs/baselines.md; structure and constants in their YAMLs
        out["trainer.v1.trainer_mode"] = "spader_sync"
        out["algorithm.step_reward"] = reward
        if reward == "stepsearch":
            out["algorithm.stepsearch.lambda_s"] = _num(variant.get("lambda_s", 0.6), "variant lambda_s")
        else:
            out["algorithm.r3rag.judge.kind"] = str(variant.get("judge", "llm"))
        return out
    novelty = divergences.get("novelty", "inverse")
    if novelty not in ("inverse", "exp_decay"):
        raise ValueError(f"training.divergences.novelty must be inverse or exp_decay, got {novelty!r}")
    epsilon = divergences.get("epsilon", "outside")
    if epsilon not in ("outside", "inside_sqrt"):
        raise ValueError(f"training.divergences.epsilon must be outside or inside_sqrt, got {epsilon!r}")
    warmup = divergences.get("cost_warmup")
    if warmup is not None:
        warmup = {"free_steps": int(warmup["free_steps"]), "ramp_steps": int(warmup["ramp_steps"])}
    out.update(
        {
            "trainer.v1.trainer_mode": "spader_sync",
            "algorithm.gamma": _num(training.get("gamma"), "training.gamma"),
            "algorithm.spader.alpha": _num(variant.get("alpha"), "variant alpha"),
            "algorithm.spader.beta": _num(variant.get("beta"), "variant beta"),
            "algorithm.spader.cost": _num(variant.get("cost"), "variant cost"),
            "algorithm.spader.novelty": novelty,
            "algorithm.spader.cost_warmup": warmup,
            "algorithm.spader.epsilon": epsilon,
        }
    )
    return out


def method_overrides(variant: Mapping[str, Any], training: Mapping[str, Any]) -> list[str]:
    """Hydra overrides that set the method of one config.yaml variant (:func:`method_settings`).

    Returns:
        Overrides for :func:`spader.integrations.verl.compose.compose`. Keys that only SPADER
        YAMLs define are written ``++key=value`` (set, or add when missing) so the list also
        composes over a YAML that lacks them.

    >>> grpo = {"advantage": "grpo", "reward": "terminal", "alpha": 0, "beta": 0, "cost": 0}
    >>> for o in method_overrides(grpo, {"gamma": 0.9, "divergences": {"invalid_format_reward": -1.0}}):
    ...     print(o)
    algorithm.adv_estimator=grpo
    reward.custom_reward_function.reward_kwargs.invalid_format_reward=-1.0
    trainer.v1.trainer_mode=sync
    """
    out = []
    for key, value in method_settings(variant, training).items():
        prefix = (
            "++"
            if key.startswith(
                ("algorithm.spader.", "algorithm.step_reward", "algorithm.stepsearch.", "algorithm.r3rag.")
            )
            else ""
        )
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
        out.append(f"{key}={hydra_value(list(value) if name == 'stop' else value)}")
    return out


def _project_yaml(name: str, config_dir: Path, seen: tuple[str, ...] = ()) -> dict:
    """The project YAML ``name`` merged over the project YAMLs it inherits from, as Hydra merges
    them (parents in ``defaults`` order, then the file itself); verl's own ``ppo_trainer`` is
    common to every variant and left out, as are the ``defaults`` and ``hydra`` keys."""
    path = config_dir / f"{name}.yaml"
    if name in seen:
        raise ValueError(f"verl config {path}: inheritance cycle {' -> '.join((*seen, name))}")
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f) or {}
    merged: dict = {}
    for entry in doc.get("defaults", []) or []:
        if isinstance(entry, str) and entry != "_self_" and (config_dir / f"{entry}.yaml").is_file():
            _merge(merged, _project_yaml(entry, config_dir, (*seen, name)))
    _merge(merged, {k: v for k, v in doc.items() if k not in ("defaults", "hydra")})
    return merged


def _merge(base: dict, overlay: Mapping) -> None:
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def training_identity(
    variant: Mapping[str, Any], training: Mapping[str, Any], config_dir: str | os.PathLike
) -> str:
    """Hash of what a variant trains: its project YAML chain merged and overlaid with
    :func:`method_settings` (the backbone, ``training`` and ``agent`` sections are shared by every
    variant of a backbone and compared by the workflow's params instead).

    Returns:
        A sha256 hex digest; equal digests mean the same composed training config.
    """
    merged = _project_yaml(str(variant["verl_config"]), Path(config_dir))
    for key, value in method_settings(variant, training).items():
        node = merged
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return hashlib.sha256(json.dumps(merged, sort_keys=True, default=str).encode()).hexdigest()


def shared_training_runs(
    variants: Sequence[str],
    specs: Mapping[str, Mapping[str, Any]],
    training: Mapping[str, Any],
    config_dir: str | os.PathLike,
) -> dict[str, str]:
    """The training run of each variant of one backbone: the first variant (in ``variants``
    order) with the same :func:`training_identity`.

    Args:
        variants: the backbone's variants (``backbones.<b>.variants``).
        specs: ``config["variants"]``.
        training: ``config["training"]``.
        config_dir: the project's verl YAML directory.
    Returns:
        ``{variant: variant whose run it shares}`` (itself when its run is its own).

    With the paper config, ``beta_4`` maps to ``spader`` and ``beta_0`` to ``no_np``.
    """
    first: dict[str, str] = {}
    out = {}
    for name in variants:
        try:
            identity = training_identity(specs[name], training, config_dir)
        except (ValueError, KeyError, OSError):
            # a variant whose method this mapping cannot resolve is never merged with another;
            # its own launch reports the problem
            identity = f"unresolved:{name}"
        out[name] = first.setdefault(identity, name)
    return out
