"""The registry of advantage estimators and rewards a variant is trained with, and their pairing.

One place names them (``variants.<name>.advantage`` / ``.reward`` of the configuration), says
which verl estimator and step-reward function each one is, which variant keys each reads and which
advantage trains which reward. The configuration model validates with it, the verl overrides
translate with it, and the docs render it (:func:`pairing_rule`). Built like verl's
``AdvantageEstimator`` enum and ``register_adv_est`` decorator, without importing verl: the verl
integration registers the estimator functions under the names given here.

>>> sorted(ADVANTAGES)
['gae', 'grpo', 'grpo_return', 'spa', 'turn_gae']
>>> pairing_errors("gae", "step")
["advantage 'gae' does not train reward 'step' (gae trains terminal, stepsearch)"]
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ADVANTAGES",
    "REWARDS",
    "Advantage",
    "AdvantageSpec",
    "Reward",
    "RewardSpec",
    "advantage_spec",
    "pairing_errors",
    "pairing_rule",
    "register_advantage",
    "register_reward",
    "reward_spec",
]


class Advantage(StrEnum):
    """``variants.<name>.advantage``."""

    SPA = "spa"
    GRPO_RETURN = "grpo_return"
    GRPO = "grpo"
    GAE = "gae"
    TURN_GAE = "turn_gae"


class Reward(StrEnum):
    """``variants.<name>.reward``."""

    STEP = "step"
    TERMINAL = "terminal"
    STEPSEARCH = "stepsearch"
    R3RAG = "r3rag"


@dataclass(frozen=True)
class AdvantageSpec:
    """One advantage: the verl estimator it is (``algorithm.adv_estimator``), the rewards it
    trains (in the order the docs list them) and what it is."""

    name: str
    estimator: str
    rewards: tuple[str, ...]
    description: str


@dataclass(frozen=True)
class RewardSpec:
    """One reward: the ``spader_sync`` step-reward function that computes it (``None``: verl's
    own terminal reward with verl's ``sync`` trainer mode), the variant keys it reads (a variant
    whose reward does not read a key may not set it) and what it is."""

    name: str
    step_reward: str | None
    keys: tuple[str, ...]
    description: str


ADVANTAGES: dict[str, AdvantageSpec] = {}
REWARDS: dict[str, RewardSpec] = {}


def register_advantage(spec: AdvantageSpec) -> AdvantageSpec:
    """Add an advantage to :data:`ADVANTAGES` (its name must be a member of :class:`Advantage`)."""
    if spec.name not in {a.value for a in Advantage}:
        raise ValueError(f"advantage {spec.name!r} is not a member of Advantage")
    if spec.name in ADVANTAGES and ADVANTAGES[spec.name] != spec:
        raise ValueError(f"advantage {spec.name!r} is registered twice")
    ADVANTAGES[spec.name] = spec
    return spec


def register_reward(spec: RewardSpec) -> RewardSpec:
    """Add a reward to :data:`REWARDS` (its name must be a member of :class:`Reward`)."""
    if spec.name not in {r.value for r in Reward}:
        raise ValueError(f"reward {spec.name!r} is not a member of Reward")
    if spec.name in REWARDS and REWARDS[spec.name] != spec:
        raise ValueError(f"reward {spec.name!r} is registered twice")
    REWARDS[spec.name] = spec
    return spec


register_reward(
    RewardSpec(
        "step",
        "spader",
        ("alpha", "beta", "cost"),
        "diversity-aware step rewards plus the terminal F1 (SPADER)",
    )
)
register_reward(RewardSpec("terminal", None, (), "the terminal F1 only (-1 for an invalid format)"))
register_reward(
    RewardSpec(
        "stepsearch",
        "stepsearch",
        ("lambda_s",),
        "StepSearch's information gain against evidence minus redundancy, per search step",
    )
)
register_reward(RewardSpec("r3rag", "r3rag", ("judge",), "R3-RAG's judge-scored steps scaled by the outcome"))

register_advantage(AdvantageSpec("spa", "spader_spa", ("step",), "step-wise peer advantage (SPADER)"))
register_advantage(
    AdvantageSpec("grpo_return", "spader_traj", ("step",), "trajectory-level GRPO on the summed return")
)
register_advantage(
    AdvantageSpec("grpo", "spader_grpo", ("terminal", "step"), "verl's GRPO without failed episodes as peers")
)
register_advantage(AdvantageSpec("gae", "gae", ("terminal", "stepsearch"), "PPO with a critic (verl's GAE)"))
register_advantage(
    AdvantageSpec("turn_gae", "r3rag_turn_gae", ("r3rag",), "GAE inside each assistant turn (R3-RAG)")
)


def advantage_spec(name: str) -> AdvantageSpec:
    """The registered advantage ``name``.

    Raises:
        ValueError: naming the registered ones.
    """
    if name not in ADVANTAGES:
        raise ValueError(f"advantage must be one of {', '.join(ADVANTAGES)}, got {name!r}")
    return ADVANTAGES[name]


def reward_spec(name: str) -> RewardSpec:
    """The registered reward ``name``.

    Raises:
        ValueError: naming the registered ones.
    """
    if name not in REWARDS:
        raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {name!r}")
    return REWARDS[name]


def pairing_errors(advantage: str, reward: str) -> list[str]:
    """Why ``advantage`` cannot train ``reward`` (empty when it can)."""
    spec = advantage_spec(advantage)
    reward_spec(reward)
    if reward in spec.rewards:
        return []
    return [
        f"advantage {advantage!r} does not train reward {reward!r} ({advantage} trains {', '.join(spec.rewards)})"
    ]


def pairing_rule() -> str:
    """The pairing as the docs state it: ``spa`` trains `step`; ... (one clause per advantage)."""
    return "; ".join(
        f"`{a.name}` trains {' or '.join(f'`{r}`' for r in a.rewards)}" for a in ADVANTAGES.values()
    )
