"""SPADER (docs/method.md): diversity-aware step rewards (reward ``step``) trained with the
step-wise peer advantage (advantage ``spa``); the ``no_spa`` ablation trains the same rewards with
trajectory-level GRPO on the summed return (advantage ``grpo_return``).

The folder holds the method: the variant keys its reward reads (:class:`StepKeys`), what its
variants set in verl's config (:func:`verl_settings`), its step rewards in training
(:mod:`.rewards`, :mod:`.densify`), its advantages (:mod:`.advantage`) and its tables (the
ablation and the beta sweep). The reward's formulas and SPA's are the method core's
(:mod:`spader.core.rewards`, :mod:`spader.core.advantage`), shared with the controlled search
world (:mod:`spader.mechanisms`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, StrictFloat

from spader.methods import Advantage, Method, Reward, Settings, TableRole, register

__all__ = ["METHOD", "StepKeys", "verl_settings"]


class StepKeys(Settings):
    """The variant keys SPADER's step reward reads."""

    alpha: StrictFloat = Field(
        1.0, ge=0, le=100, description="information-gain weight alpha (reward step only)"
    )
    beta: StrictFloat = Field(4.0, ge=0, le=100, description="novelty-premium weight beta (reward step only)")
    cost: StrictFloat = Field(
        0.01, ge=0, le=100, description="tool cost c of a search step, see cost_per (reward step only)"
    )
    cost_per: Literal["call", "query"] = Field(
        "call",
        description="what the tool cost counts (reward step only): call (c per search call, the "
        "paper's Cost(a_t)) or query (c per query the call issued, the authors' code)",
    )


def verl_settings(settings: StepKeys, training: Mapping[str, Any]) -> dict[str, Any]:
    """``algorithm.gamma`` and the ``algorithm.spader`` block (read back by
    :class:`spader.methods.spader.rewards.SpaderSettings`) from the variant's keys and the
    ``training`` section (``gamma``, ``divergences``)."""
    divergences = training["divergences"]
    warmup = divergences.get("cost_warmup")
    return {
        "algorithm.gamma": float(training["gamma"]),
        "algorithm.spader.alpha": float(settings.alpha),
        "algorithm.spader.beta": float(settings.beta),
        "algorithm.spader.cost": float(settings.cost),
        "algorithm.spader.cost_per": settings.cost_per,
        "algorithm.spader.novelty": divergences["novelty"],
        "algorithm.spader.cost_warmup": None if warmup is None else dict(warmup),
        "algorithm.spader.epsilon": divergences["epsilon"],
    }


METHOD = register(
    Method(
        name="spader",
        description="diversity-aware step rewards with the step-wise peer advantage",
        rewards=(
            Reward(
                name="step",
                description="diversity-aware step rewards plus the terminal F1 (SPADER)",
                settings=StepKeys,
                step_reward="spader",
                step_rewards="spader.methods.spader.rewards:SpaderStepRewards.from_config",
                verl_settings=verl_settings,
                verl_blocks=("algorithm.gamma", "algorithm.spader."),
                checks="spader.methods.spader.rewards:SpaderSettings.from_config",
            ),
        ),
        advantages=(
            Advantage(
                name="spa",
                estimator="spader_spa",
                rewards=("step",),
                description="step-wise peer advantage (SPADER)",
                function="spader.methods.spader.advantage:spader_spa_advantage",
            ),
            Advantage(
                name="grpo_return",
                estimator="spader_traj",
                rewards=("step",),
                description="trajectory-level GRPO on the summed return",
                function="spader.methods.spader.advantage:spader_traj_advantage",
            ),
        ),
        verl_config="spader",
        tables=(
            TableRole(table="ablation", key="label"),
            TableRole(table="beta_sweep", key="beta", ordered=True),
        ),
    )
)
