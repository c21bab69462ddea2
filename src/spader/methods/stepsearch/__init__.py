"""StepSearch, adapted to multi-answer QA (docs/baselines.md, "StepSearch"): per search turn
``lambda_s * (information gain against the question's evidence - redundancy)``
(:mod:`.gain`, :mod:`.densify`), the terminal F1 at the end, trained with PPO's critic and verl's
GAE (gamma = lambda = 1). Its evidence is built by rule ``build_evidence``
(:mod:`spader.scorers.evidence`) and read by its step rewards in training
(:class:`spader.integrations.verl.scorer_rewards.StepSearchRewards`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, StrictFloat

from spader.methods import Method, Reward, Settings, register

__all__ = ["METHOD", "StepSearchKeys", "verl_settings"]


class StepSearchKeys(Settings):
    """The variant keys StepSearch's reward reads."""

    lambda_s: StrictFloat = Field(
        0.6,
        ge=0,
        le=100,
        description="StepSearch step-reward scale (0.6 nominal; 1.6 as its code applies; reward stepsearch only)",
    )


def verl_settings(settings: StepSearchKeys, training: Mapping[str, Any]) -> dict[str, Any]:
    """``algorithm.stepsearch.lambda_s``; the evidence file and the TF-IDF processes are set by
    the training launcher (:mod:`spader.training.scorer_launch`)."""
    return {"algorithm.stepsearch.lambda_s": float(settings.lambda_s)}


METHOD = register(
    Method(
        name="stepsearch",
        description="StepSearch's information gain against evidence minus redundancy, with PPO",
        rewards=(
            Reward(
                name="stepsearch",
                description="StepSearch's information gain against evidence minus redundancy, per search step",
                settings=StepSearchKeys,
                step_reward="stepsearch",
                step_rewards="spader.integrations.verl.scorer_rewards:StepSearchRewards.from_config",
                verl_settings=verl_settings,
                verl_blocks=("algorithm.stepsearch.",),
                checks="spader.integrations.verl.scorer_rewards:check_stepsearch_config",
                record_turns=True,
                inputs=("evidence",),
            ),
        ),
        verl_config="stepsearch",
    )
)
