"""The arms of the CPU update-direction test, trained for real in the spread world.

One place for the settings and the training of the arms that tests/cpu_training/test_update_direction.py
asserts on and that bench/method_learning.py measures over many seeds (so the margins the test
holds come from runs of exactly what it runs):

* ``spader`` - the method (variant ``spader``);
* ``grpo`` - the terminal reward alone (variant ``grpo``);
* ``control`` - variant ``spader`` with every advantage forced to zero (the estimator of
  :mod:`zero_advantage`): sampling alone moves its per-step numbers, its weights never move.

Every arm starts from the world's one warm start with the same ``training.seed``: rollouts are
seeded by that seed, the weight version and the prompt, so every arm's first step samples the same
trajectories.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from unittest.mock import patch

from cpu_world import cpu_training, train_job

SUPPORT = Path(__file__).resolve().parent

SIZES = {
    "train_batch_size": 4,  # the four training districts, 8 rollouts each: 32 trajectories a step
    "ppo_mini_batch_size": 2,  # two policy updates a step
    "ppo_micro_batch_size_per_gpu": 8,
    "rollout_n": 8,
    "lr": 2e-4,  # 1e-3 moved the policy to searching more in one step, and broke its answers
    "max_prompt_length": 64,
    "max_response_length": 512,
    "val_before_train": False,  # the tests read training steps only (verl still validates the last)
}
# All arms train without weight decay (verl's AdamW default decays weights even under a zero
# gradient, which would move the control's weights) and otherwise with the demo's CPU settings.
EXTRA = ["actor_rollout_ref.actor.optim.weight_decay=0.0"]
ARMS = ("spader", "grpo", "control")

# The update-direction assertion (tests/cpu_training/test_update_direction.py): after STEPS steps from the
# one warm start, SPADER's mean over steps 3..STEPS (the steps after two updates) minus the
# zero-advantage control's, same training seed (so the same first step), must reach MARGINS.
# First set from bench/method_learning.py over training seeds 100..109 (2026-12-04, record
# 2026-12-04-05ed0b8-method_learning.yaml): entities mean +1.536, sd 0.209, margin 1.0 (0.5% under a
# normal fit). On held-out seeds 200..209 it held on 9 of 10 (seed 202: +0.75): ten seeds understated
# the tail. Recalibrated by a rule written down before seeds 300..309 ran (docs/cpu-training.md,
# "The update-direction test"): the normal fit's 1% quantile over the thirty seeds 100..109, 200..209
# and 300..309 (record 2026-12-04-6b8cc4e-method_learning.yaml), rounded down to 0.05:
#   discovered entities per trajectory: mean +1.467, sd 0.274, min +0.75 (seed 202, the one of the
#     thirty below the margin); 1% quantile +0.829 -> margin 0.8;
#   mean reward: SPADER's gain over the control is real on average (+0.16, +0.17, +0.12 per ten
#     seeds) but no one-seed margin above zero holds at a 1% failure rate: printed, not asserted.
# Held-out seeds 400..409, run after this margin was committed: it held on all ten (entities mean
# +1.637, min +1.344; record 2026-12-04-6b8cc4e-method_learning-2.yaml).
STEPS = 4
LATER = range(3, STEPS + 1)
MARGINS: dict[str, float] = {"entities": 0.8}


def _zero_advantage_plugin():
    """verl loads the zero-advantage estimator in every process, like the project's plug-in."""
    import zero_advantage

    path = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))
    return patch.dict(os.environ, {"VERL_USE_EXTERNAL_MODULES": zero_advantage.__name__, "PYTHONPATH": path})


def train_arm(world, out: str | os.PathLike, arm: str, *, steps: int, seed: int = 1):
    """Train ``arm`` for ``steps`` steps with ``training.seed = seed``; returns its finished job."""
    import zero_advantage

    from spader.training.run import run_training

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; one of {', '.join(ARMS)}")
    extra = [f"algorithm.adv_estimator={zero_advantage.NAME}"] if arm == "control" else []
    job = train_job(
        world,
        out,
        variant="grpo" if arm == "grpo" else "spader",
        training=cpu_training(**{**SIZES, "max_steps": steps, "save_freq": steps, "seed": seed}),
        extra=[*EXTRA, *extra],
    )
    if arm == "control":
        with _zero_advantage_plugin():
            run_training(job)
    else:
        run_training(job)
    return job


def step_metrics(job) -> dict[int, dict]:
    """The job's logged training steps (step >= 1), by step."""
    from spader.training.checkpoints import read_step_metrics

    return {
        s: m for s, m in read_step_metrics(job.metrics_dir).items() if s >= 1 and "critic/score/mean" in m
    }


def entities(step: dict) -> float:
    """Discovered entities per trajectory of one step's metrics (what SPADER's step reward pays for)."""
    return step.get("episode/entities", step.get("spader/new_entities/mean"))


def answer_f1(step: dict) -> float:
    """Mean answer F1 of one step's trajectories (0 for an invalid answer); NaN where not logged."""
    return step.get("episode/f1", math.nan)


def format_valid(step: dict) -> float:
    """Share of one step's trajectories whose final turn is a well-formed answer; NaN where not logged."""
    return step.get("episode/format_valid", math.nan)


#: Trajectories per training step (the denominator of ``episode/failed``, a count).
TRAJECTORIES = SIZES["train_batch_size"] * SIZES["rollout_n"]


def terminal(step: dict) -> float:
    """Mean terminal reward of one step: answer F1, -1 for an invalid answer, 0 for an episode the
    infrastructure failed (the reward function's ``score``). Every arm's answer step earns exactly
    this, so it compares arms with different step rewards like with like."""
    invalid = 1.0 - format_valid(step) - step.get("episode/failed", 0.0) / TRAJECTORIES
    return answer_f1(step) - invalid


def reward(step: dict) -> float:
    """Mean reward of one step's metrics: the step rewards plus the terminal reward for SPADER and the
    control, the terminal reward alone for GRPO (so not comparable between those)."""
    return step["critic/score/mean"]


#: What the test prints and the bench reports, per step. ``reward`` is the arm's own reward.
QUANTITIES = {
    "entities": entities,
    "f1": answer_f1,
    "format_valid": format_valid,
    "terminal": terminal,
    "reward": reward,
}
#: The quantities SPADER is compared on against each other arm: all of them against the control
#: (the same reward function), and against GRPO only those both arms measure alike (never the
#: step-plus-terminal reward against a terminal-only one).
COMPARABLE = {
    "control": tuple(QUANTITIES),
    "grpo": ("entities", "f1", "format_valid", "terminal"),
}


def later_mean(steps: dict[int, dict], value, later=LATER) -> float:
    """Mean of ``value`` over the steps ``later``."""
    later = list(later)
    return sum(value(steps[s]) for s in later) / len(later)


def paired_effects(
    spader: dict[int, dict], other: dict[int, dict], later=LATER, quantities=tuple(QUANTITIES)
) -> dict[str, float]:
    """SPADER's mean over ``later`` minus the other arm's, per quantity (one seed's two runs)."""
    return {
        q: later_mean(spader, QUANTITIES[q], later) - later_mean(other, QUANTITIES[q], later)
        for q in quantities
    }


def learning_failures(effects: dict[str, float]) -> list[str]:
    """The quantities whose paired effect falls short of its margin (empty: the assertion holds)."""
    return [f"{q} {effects[q]:+.3f} < {MARGINS[q]:+.3f}" for q in MARGINS if effects[q] < MARGINS[q]]
