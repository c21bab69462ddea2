"""R3-RAG (docs/baselines.md, "R3-RAG"): judge-scored search turns scaled by the outcome
(:mod:`.scoring`, :mod:`.densify`), trained with a critic and GAE inside each assistant turn
(verl estimator ``r3rag_turn_gae``, defined in the verl integration since it reads the critic's
values from the trainer). The judge is an LLM behind an OpenAI-compatible endpoint (the ``judge``
section; served by the training job, :mod:`spader.training.scorer_launch`) or the reranker's scores.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from spader.methods import Advantage, Method, Reward, Settings, register

__all__ = ["JUDGES", "METHOD", "R3RagKeys", "verl_settings"]

#: R3-RAG judges: an LLM behind an OpenAI-compatible endpoint, or the reranker's scores.
JUDGES = ("llm", "reranker")


class R3RagKeys(Settings):
    """The variant keys R3-RAG's reward reads."""

    judge: Literal["llm", "reranker"] = Field(
        "llm",
        description="R3-RAG process scorer: llm (the judge block) or reranker (sigmoid of the "
        "reranker score); reward r3rag only",
    )


def verl_settings(settings: R3RagKeys, training: Mapping[str, Any]) -> dict[str, Any]:
    """``algorithm.r3rag.judge.kind``; the LLM judge's endpoint and client settings are set by
    the training launcher."""
    return {"algorithm.r3rag.judge.kind": settings.judge}


METHOD = register(
    Method(
        name="r3rag",
        description="R3-RAG's judge-scored steps scaled by the outcome, with per-turn GAE",
        rewards=(
            Reward(
                name="r3rag",
                description="R3-RAG's judge-scored steps scaled by the outcome",
                settings=R3RagKeys,
                step_reward="r3rag",
                step_rewards="spader.integrations.verl.scorer_rewards:R3RagRewards.from_config",
                verl_settings=verl_settings,
                verl_blocks=("algorithm.r3rag.",),
                checks="spader.integrations.verl.scorer_rewards:check_r3rag_config",
                record_turns=True,
                inputs=("judge",),
            ),
        ),
        advantages=(
            Advantage(
                name="turn_gae",
                estimator="r3rag_turn_gae",
                rewards=("r3rag",),
                description="GAE inside each assistant turn (R3-RAG)",
            ),
        ),
        verl_config="r3rag",
    )
)
