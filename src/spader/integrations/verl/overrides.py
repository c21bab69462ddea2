"""Hydra overrides that set a variant's method from config/config.yaml.

``config.yaml`` is the single source of the numbers at launch; ``config/verl/<variant>.yaml``
carries the structure and the paper's values so that it composes on its own. The training
launcher composes ``variants.<v>.verl_config`` with :func:`method_overrides` (this module) plus
its own overrides (data, model, batch sizes, rollout, GPUs, logger, checkpoints, tool config).

:data:`TRAINING_KEYS` maps ``training.<key>`` of config.yaml to the verl key the project YAMLs
carry for it (tests/verl check that the two agree, so they never drift apart).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ESTIMATORS", "TRAINING_KEYS", "method_overrides"]

#: config.yaml ``variants.<v>.advantage`` -> verl ``algorithm.adv_estimator``.
ESTIMATORS = {"spa": "spader_spa", "grpo_return": "spader_traj", "grpo": "grpo", "gae": "gae"}

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
    "max_assistant_turns": "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
    "max_tool_response_chars": "actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
    "gpu_memory_utilization": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "save_freq": "trainer.save_freq",
    "test_freq": "trainer.test_freq",
    # the v1 trainer seeds its prompt sampler with this (trainer_base.py, data_loader_seed)
    "seed": "actor_rollout_ref.actor.data_loader_seed",
}


def _num(value: Any, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number, got {value!r}")
    return repr(float(value))


def method_overrides(variant: Mapping[str, Any], training: Mapping[str, Any]) -> list[str]:
    """Hydra overrides that set the method of one config.yaml variant.

    Args:
        variant: ``config["variants"][name]`` (``advantage``, ``reward``, ``alpha``, ``beta``,
            ``cost``).
        training: ``config["training"]`` (``gamma`` and ``divergences`` are used).
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
    advantage, reward = variant.get("advantage"), variant.get("reward")
    if advantage not in ESTIMATORS:
        raise ValueError(f"variant advantage must be one of {sorted(ESTIMATORS)}, got {advantage!r}")
    if reward not in ("step", "terminal"):
        raise ValueError(f"variant reward must be 'step' or 'terminal', got {reward!r}")
    if advantage == "gae" and reward == "step":
        raise ValueError(
            "PPO (advantage gae) is trained on the terminal reward; dense step rewards need spa/grpo_return"
        )
    if advantage in ("spa", "grpo_return") and reward != "step":
        raise ValueError(f"advantage {advantage!r} is defined on the step rewards (reward: step)")
    divergences = training.get("divergences") or {}
    out = [
        f"algorithm.adv_estimator={ESTIMATORS[advantage]}",
        "reward.custom_reward_function.reward_kwargs.invalid_format_reward="
        + _num(divergences.get("invalid_format_reward", -1.0), "training.divergences.invalid_format_reward"),
    ]
    if reward == "terminal":
        return [*out, "trainer.v1.trainer_mode=sync"]
    novelty = divergences.get("novelty", "inverse")
    if novelty not in ("inverse", "exp_decay"):
        raise ValueError(f"training.divergences.novelty must be inverse or exp_decay, got {novelty!r}")
    warmup = divergences.get("cost_warmup")
    if warmup is None:
        warmup_value = "null"
    else:
        free, ramp = int(warmup["free_steps"]), int(warmup["ramp_steps"])
        warmup_value = f"{{free_steps:{free},ramp_steps:{ramp}}}"
    return [
        *out,
        "trainer.v1.trainer_mode=spader_sync",
        "algorithm.gamma=" + _num(training.get("gamma"), "training.gamma"),
        "++algorithm.spader.alpha=" + _num(variant.get("alpha"), "variant alpha"),
        "++algorithm.spader.beta=" + _num(variant.get("beta"), "variant beta"),
        "++algorithm.spader.cost=" + _num(variant.get("cost"), "variant cost"),
        f"++algorithm.spader.novelty={novelty}",
        f"++algorithm.spader.cost_warmup={warmup_value}",
    ]
