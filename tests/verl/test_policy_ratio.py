"""The paper's step-level importance ratio (eq. 3) as a verl policy loss: ``training.policy_ratio``
selects verl's per-token ``vanilla`` loss or the plug-in's ``spader_step_ratio``, which clips one
ratio per decision step and sums the steps' terms per trajectory, averaged over the trajectories."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")

from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config.actor import FSDPActorConfig

import spader.integrations.verl.plugin  # noqa: F401  (registration)
from spader.config import resolved_config
from spader.integrations.verl.compose import compose
from spader.integrations.verl.overrides import config_overrides

REPO = Path(__file__).resolve().parents[2]


def _runs(row: list[int]) -> list[list[int]]:
    runs, current = [], []
    for j, m in enumerate(row):
        if m:
            current.append(j)
        elif current:
            runs.append(current)
            current = []
    return [*runs, current] if current else runs


def reference_eq3(old, new, adv, mask, *, eps=0.2, clip_c=3.0, global_batch=None) -> tuple[float, float]:
    """Eq. 3 with plain loops: per step rho_t = exp(sum of its tokens' log-ratios), the clipped
    term with the step's advantage (its tokens' mean), summed over steps, divided by the number of
    trajectories; and the share of clipped steps."""
    total, clipped, steps = 0.0, 0, 0
    for o, n, a, m in zip(old, new, adv, mask, strict=True):
        for run in _runs(m):
            steps += 1
            rho = math.exp(max(-20.0, min(20.0, sum(n[j] - o[j] for j in run))))
            a_t = sum(a[j] for j in run) / len(run)
            plain, cut = -a_t * rho, -a_t * min(max(rho, 1 - eps), 1 + eps)
            term = max(plain, cut)
            if a_t < 0:
                term = min(term, -a_t * clip_c)
            clipped += cut > plain
            total += term
    g = global_batch if global_batch is not None else sum(1 for m in mask if any(m))
    return total / g, clipped / max(steps, 1)


def _batch(seed: int, b: int = 6, length: int = 24):
    rng = random.Random(seed)
    mask = []
    for _ in range(b):
        row, pos = [0] * length, 0
        valid = rng.randint(0, length)
        while pos < valid:
            run = rng.randint(1, 5)
            row[pos : min(pos + run, valid)] = [1] * (min(pos + run, valid) - pos)
            pos += run + rng.randint(1, 4)
        mask.append(row)
    old = [[rng.uniform(-3, 0) for _ in range(length)] for _ in range(b)]
    new = [[o + rng.gauss(0, 0.15) for o in row] for row in old]
    adv = []
    for row in mask:  # one advantage per step (SPA), or per token now and then (a critic's)
        values = [0.0] * length
        for run in _runs(row):
            a = rng.gauss(0, 1)
            for j in run:
                values[j] = a + (rng.gauss(0, 0.3) if rng.random() < 0.3 else 0.0)
        adv.append(values)
    return old, new, adv, mask


def _actor(**changes) -> FSDPActorConfig:
    return FSDPActorConfig(
        strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, rollout_n=1, **changes
    )


@pytest.mark.parametrize("seed", range(5))
def test_the_step_loss_is_eq3_on_random_batches(seed):
    old, new, adv, mask = _batch(seed)
    fn = get_policy_loss_fn("spader_step_ratio")
    config = _actor()
    loss, metrics = fn(
        old_log_prob=torch.tensor(old),
        log_prob=torch.tensor(new, requires_grad=True),
        advantages=torch.tensor(adv),
        response_mask=torch.tensor(mask).bool(),
        loss_agg_mode="token-mean",  # the actor's mode, for the KL loss: eq. 3 does not read it
        config=config,
    )
    want, clipfrac = reference_eq3(old, new, adv, mask)
    assert loss.item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(clipfrac)
    assert metrics["actor/pg_steps"] == sum(len(_runs(m)) for m in mask)
    # the mini-batch's trajectory count (verl's global_batch_info) divides, as G does in eq. 3
    config.global_batch_info.update(dp_size=1, global_batch_size=32)
    loss, _ = fn(
        torch.tensor(old), torch.tensor(new), torch.tensor(adv), torch.tensor(mask).bool(), config=config
    )
    assert loss.item() == pytest.approx(
        reference_eq3(old, new, adv, mask, global_batch=32)[0], rel=1e-5, abs=1e-6
    )


def test_a_steps_gradient_reaches_each_of_its_tokens_with_the_steps_ratio():
    """Unclipped, d(-A rho_t)/d log p(token) = -A rho_t for every token of the step (the product
    of the token ratios), where verl's per-token loss gives each token its own ratio over the
    token count."""
    mask = torch.tensor([[1, 1, 1, 0, 1]]).bool()
    old = torch.zeros(1, 5)
    new = torch.tensor([[0.02, -0.03, 0.04, 9.0, 0.01]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0, 0.0, -0.5]])
    loss, _ = get_policy_loss_fn("spader_step_ratio")(old, new, adv, mask, config=_actor())
    loss.backward()
    rho1, rho2 = math.exp(0.03), math.exp(0.01)
    assert new.grad.tolist()[0] == pytest.approx([-rho1, -rho1, -rho1, 0.0, 0.5 * rho2], rel=1e-5)
    token, _ = get_policy_loss_fn("vanilla")(old, new.detach(), adv, mask, config=_actor())
    assert token.item() != pytest.approx(loss.item())


def test_a_clipped_step_has_no_gradient_and_counts_as_clipped():
    mask = torch.tensor([[1, 1, 0, 1]]).bool()
    new = torch.tensor([[0.2, 0.2, 0.0, -0.01]], requires_grad=True)  # step 1: rho = e^0.4 > 1.2
    loss, metrics = get_policy_loss_fn("spader_step_ratio")(
        torch.zeros(1, 4), new, torch.ones(1, 4), mask, config=_actor()
    )
    loss.backward()
    assert new.grad[0, :2].tolist() == [0.0, 0.0] and new.grad[0, 3] != 0
    assert metrics["actor/pg_clipfrac"] == 0.5


def test_policy_ratio_selects_the_loss_in_the_composed_config():
    config = resolved_config(REPO / "config" / "config.yaml")
    variant, agent = config["variants"]["spader"], config["agent"]
    assert config["training"]["policy_ratio"] == "token"
    default = compose("spader", config_overrides(variant, config["training"], agent))
    assert default.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    step = compose("spader", config_overrides(variant, dict(config["training"], policy_ratio="step"), agent))
    assert step.actor_rollout_ref.actor.policy_loss.loss_mode == "spader_step_ratio"
    assert get_policy_loss_fn(step.actor_rollout_ref.actor.policy_loss.loss_mode).__module__.startswith(
        "spader."
    )
