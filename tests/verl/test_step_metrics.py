"""Per-step training metrics the learning curves and the CPU learning test read: the discovered
entities per trajectory (``episode/entities``) and the range of SPADER's search-step rewards
(``spader/search_reward/min`` and ``/max``)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from spader.core.rewards import StepRewardWeights
from spader.integrations.verl.episode_metrics import episode_metrics
from spader.methods.spader.densify import densify_rewards
from spader.methods.steps import STEPS_KEY, StepRecord


def test_search_reward_range_of_a_batch():
    # group "u", |E_GT| = 2: t0 finds {0} (2 queries), t1 finds {0, 1}, then {1} again (1 query each)
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 0, 0], [1, 0, 0, 1, 0, 1, 1, 0]])
    records = [
        [StepRecord(turn=1, queries=2, hits=(0,))],
        [StepRecord(turn=1, queries=1, hits=(0, 1)), StepRecord(turn=2, queries=1, hits=(1,))],
    ]
    _, stats = densify_rewards(
        mask,
        torch.tensor([0.5, -1.0]),
        ["u", "u"],
        records,
        [2, 2],
        StepRewardWeights(alpha=1.0, beta=4.0, cost=0.01),
    )
    metrics = stats.metrics()
    r_e0, r_e1 = 1 + 4 / 2, 1 + 4 / 1
    assert metrics["spader/search_reward/max"] == pytest.approx((r_e0 + r_e1 - 0.01) / 2)
    assert metrics["spader/search_reward/min"] == pytest.approx(-0.01 / 2)  # the repeat finds nothing new
    # no search step at all: the range is 0, not an infinity
    _, none = densify_rewards(
        torch.tensor([[1, 1]]), torch.tensor([1.0]), ["v"], [[]], [None], StepRewardWeights(1.0, 4.0, 0.01)
    )
    assert none.metrics()["spader/search_reward/min"] == none.metrics()["spader/search_reward/max"] == 0.0


class FakeTransferQueue:
    """Stands in for TransferQueue's ``kv_batch_get`` (a fake: TransferQueue's storage actors only
    run inside a verl trainer); it returns the fields the metrics read."""

    def __init__(self, extra):
        self.extra = extra

    def __call__(self, *, keys, partition_id, select_fields):
        return {"extra_fields": self.extra}


def test_entities_per_trajectory_count_distinct_hits_over_steps():
    extra = [
        {STEPS_KEY: [{"turn": 1, "queries": 1, "hits": [0, 1]}, {"turn": 2, "queries": 1, "hits": [1, 2]}]},
        {STEPS_KEY: [{"turn": 1, "queries": 1, "hits": []}]},
        {},  # answered without searching
        {STEPS_KEY: [{"turn": 1, "queries": 1, "hits": [4]}]},  # verl's padding row: left out
    ]
    batch = SimpleNamespace(keys=list("abcd"), partition_id="train", tags=[{}, {}, {}, {"is_padding": True}])
    metrics = episode_metrics(batch, FakeTransferQueue(extra))
    assert metrics["episode/entities"] == pytest.approx(3 / 3)  # 3 + 0 + 0 over three trajectories
    assert metrics["episode/searches"] == pytest.approx(3 / 3)
    assert math.isnan(metrics["episode/format_valid"])  # no reward verdict in these rows


def test_searches_the_service_failed_are_counted_apart_from_the_policys_malformed_calls():
    """``episode/searches`` counts every step record; ``episode/searches_answered`` only those the
    service answered, ``search_errors`` those it failed, ``call_errors`` the policy's malformed calls."""
    from spader.integrations.verl.search_tool import SERVICE_ERROR

    extra = [
        {
            STEPS_KEY: [
                {"turn": 1, "queries": 1, "hits": [0]},
                {"turn": 2, "queries": 0, "error": "no queries"},
            ]
        },
        {STEPS_KEY: [{"turn": 1, "queries": 2, "hits": [], "error": f"{SERVICE_ERROR} (ConnectError)"}]},
    ]
    batch = SimpleNamespace(keys=list("ab"), partition_id="train", tags=[{}, {}])
    metrics = episode_metrics(batch, FakeTransferQueue(extra))
    assert metrics["episode/searches"] == pytest.approx(3 / 2)
    assert metrics["episode/searches_answered"] == pytest.approx(1 / 2)
    assert (metrics["episode/search_errors"], metrics["episode/call_errors"]) == (1.0, 1.0)
