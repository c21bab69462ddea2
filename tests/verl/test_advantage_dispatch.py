"""Step rewards and advantages through verl's real code on CPU.

A synthetic batch shaped like verl's agent-loop output (``AgentLoopOutput.as_dict()``: prompts,
responses with assistant runs and tool spans, ``response_mask``, the scalar score on the last
token, the uid and the extra fields our search tool writes) goes through the ``spader_sync``
trainer mode's densification and verl's own ``_compute_advantage`` -> ``compute_advantage``
dispatch -> the registered estimator. The expected token advantages are docs/method.md's worked
example. TransferQueue is the in-memory stand-in of conftest.py (the real one needs Ray).
"""

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from paper_verl import paper_overrides
from transfer_queue import KVBatchMeta
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls

from spader.integrations.verl import plugin  # noqa: F401
from spader.integrations.verl.compose import compose
from spader.integrations.verl.trainer import SpaderTrainerSync
from spader.methods.steps import N_GOLD_KEY, STEPS_KEY


def rollout(runs, score, steps=(), n_gold=10):
    """One trajectory as the agent loop stores it: ``runs`` alternates assistant/observation lengths."""
    mask, token = [], 100
    for i, n in enumerate(runs):
        mask += [1 if i % 2 == 0 else 0] * n
    out = AgentLoopOutput(
        prompt_ids=[1, 2, 3],
        response_ids=list(range(token, token + len(mask))),
        response_mask=mask,
        reward_score=score,
        metrics=AgentLoopMetrics(),
        extra_fields={STEPS_KEY: [dict(s, error=None) for s in steps], N_GOLD_KEY: n_gold} if steps else {},
    )
    return out.as_dict()


def padding_sample(template):
    """verl's synthetic padding row (padding_utils): one masked EOS token, template's extra fields."""
    return {
        **template,
        "responses": torch.tensor([0]),
        "response_mask": torch.tensor([0]),
        "rm_scores": torch.tensor([0.0]),
    }


def put_batch(queue, samples):
    keys, tags = [], []
    for i, (uid, sample, is_padding) in enumerate(samples):
        key = f"{uid}_{i}_0"
        queue.put_samples([key], [{**sample, "uid": uid}])
        keys.append(key)
        tags.append({"is_padding": True} if is_padding else {})
    return KVBatchMeta(keys=keys, tags=tags, partition_id="train")


def make_trainer(overrides, global_step=1):
    cfg = compose("spader", [*paper_overrides("spader"), "actor_rollout_ref.model.path=/unused", *overrides])
    trainer = get_trainer_cls(cfg.trainer.v1.trainer_mode)(cfg)
    trainer.global_steps = global_step
    return trainer


def read(queue, batch, field):
    rows = [queue.store[("train", k)][field] for k in batch.keys]
    return [r.tolist() for r in rows]


# docs/method.md worked example with alpha 1, beta 0, cost 0 and |E_GT| = 10:
# A finds 5 new entities (0.5), then 2 new (0.2), answers F1 0.6; B finds 1 (0.1), answers 0.4; C answers 0.0
A = rollout(
    [3, 2, 2, 2, 2],
    0.6,
    [{"turn": 1, "queries": 1, "hits": [0, 1, 2, 3, 4]}, {"turn": 2, "queries": 2, "hits": [3, 4, 5, 6]}],
)
B = rollout([2, 3, 1, 1], 0.4, [{"turn": 1, "queries": 1, "hits": [7]}])  # trailing observation token
C = rollout([4], 0.0)
SINGLE = rollout([2, 1, 2], 1.0, [{"turn": 1, "queries": 1, "hits": [0]}])
WORKED = {"A": (1.3013, 1.1903, 1.4142), "B": (-0.1710, 0.0661), "C": (-1.1303,)}


def expected_tokens(sample, step_advantages):
    out, run, prev = [], -1, 0
    for m in sample["response_mask"].tolist():
        run += int(m == 1 and prev == 0)
        out.append(step_advantages[run] if m else 0.0)
        prev = m
    return out


def test_trainer_mode_is_registered_and_behaves_as_sync():
    trainer = make_trainer([])
    assert isinstance(trainer, SpaderTrainerSync)
    assert trainer.trainer_mode == "sync"  # verl's sync replay buffer and refill logic
    assert type(trainer.replay_buffer).__name__ == "ReplayBuffer"


def test_a_checkpoint_is_saved_after_its_steps_metrics_are_logged(monkeypatch):
    # verl saves step N's checkpoint before it logs step N's metrics: a job stopped in between
    # resumes after step N and never logs them. This trainer saves once they are logged.
    events = []

    class Recorder:  # verl's Tracking logger, recording what it is given
        def log(self, data, step, backend=None):
            events.append(("log", step, sorted(data)))

        def finish(self):
            return "finished"

    monkeypatch.setattr(
        PPOTrainerSync, "_save_checkpoint", lambda self: events.append(("save", self.global_steps))
    )
    trainer = make_trainer([], global_step=2)
    trainer._save_checkpoint()  # outside the training loop: at once
    assert events == [("save", 2)]
    events.clear()
    trainer.logger = Recorder()
    trainer.on_train_begin()
    trainer._save_checkpoint()  # where verl's loop asks for it, before the step's metrics
    assert events == []
    trainer.logger.log(data={"critic/score/mean": 0.5}, step=2)
    assert events == [
        ("log", 2, ["critic/score/mean"]),
        ("save", 2),
        ("log", 2, ["timing_s/save_checkpoint"]),
    ]
    events.clear()
    trainer.global_steps = 3
    trainer.logger.log(data={"critic/score/mean": 0.7}, step=3)  # no checkpoint due: a log only
    assert events == [("log", 3, ["critic/score/mean"])]
    assert trainer.logger.finish() == "finished"  # the rest is the logger's own
    trainer._save_checkpoint()
    with pytest.raises(RuntimeError, match="checkpoint of step 3 was due"):
        trainer.logger.log(data={}, step=4)


def test_worked_example_through_verl_compute_advantage(fake_tq):
    trainer = make_trainer(["algorithm.spader.beta=0.0", "algorithm.spader.cost=0.0"])
    batch = put_batch(
        fake_tq,
        [
            ("u", A, False),
            ("u", B, False),
            ("u", C, False),
            ("s", SINGLE, False),
            ("pad0", padding_sample(A), True),
        ],
    )
    metrics = {}
    trainer._compute_advantage(batch, metrics)
    rm = read(fake_tq, batch, "rm_scores")
    assert rm[0] == pytest.approx([0, 0, 0.5, 0, 0, 0, 0.2, 0, 0, 0, 0.6])  # rewards on step-end tokens
    assert rm[1] == pytest.approx([0, 0.1, 0, 0, 0, 0.4, 0])  # the score moved off the observation token
    adv = read(fake_tq, batch, "advantages")
    assert adv[0] == pytest.approx(expected_tokens(A, WORKED["A"]), abs=5e-5)
    assert adv[1] == pytest.approx(expected_tokens(B, WORKED["B"]), abs=5e-5)
    assert adv[2] == pytest.approx(expected_tokens(C, WORKED["C"]), abs=5e-5)
    assert adv[3] == [0.0] * 5  # a group of one
    assert adv[4] == [0.0]  # verl's padding row
    returns = read(fake_tq, batch, "returns")
    assert returns[0][0] == pytest.approx(1.166, abs=1e-5)
    assert metrics["spader/new_entities/mean"] == pytest.approx((7 + 1 + 0 + 1) / 4)
    assert metrics["spader/dropped_step_records"] == 0.0


def test_diversity_rewards_and_cost_warmup_use_the_training_step(fake_tq):
    # alpha 1, beta 4, cost 0.01, |E_GT| = 2; X and Y both find entity 0 (N = 2), Y alone finds 1
    x = rollout([2, 1, 1], 1.0, [{"turn": 1, "queries": 2, "hits": [0]}], n_gold=2)
    y = rollout(
        [1, 1, 1, 1, 1],
        -1.0,
        [{"turn": 1, "queries": 1, "hits": [0, 1]}, {"turn": 2, "queries": 3, "hits": [1]}],
        n_gold=2,
    )
    # the cost per query, as the authors' code charges it (the warm-up is theirs)
    overrides = [
        "algorithm.spader.cost_warmup={free_steps:100,ramp_steps:100}",
        "algorithm.spader.cost_per=query",
    ]
    for step, scale in [(50, 0.0), (150, 0.5), (300, 1.0)]:
        trainer = make_trainer(overrides, global_step=step)
        batch = put_batch(fake_tq, [(f"g{step}", x, False), (f"g{step}", y, False)])
        metrics = {}
        trainer._compute_advantage(batch, metrics)
        rm = read(fake_tq, batch, "rm_scores")
        c = 0.01 * scale
        assert rm[0] == pytest.approx([0, (3 - 2 * c) / 2, 0, 1.0])
        assert rm[1] == pytest.approx([(3 + 5 - c) / 2, 0, -3 * c / 2, 0, -1.0])
        assert metrics["spader/cost_scale"] == scale


def test_exp_decay_novelty_option(fake_tq):
    x = rollout([2, 1, 1], 0.0, [{"turn": 1, "queries": 0, "hits": [0]}], n_gold=1)
    y = rollout([2, 1, 1, 1], 0.0, [{"turn": 1, "queries": 0, "hits": [0]}], n_gold=1)
    trainer = make_trainer(["algorithm.spader.novelty=exp_decay"])
    batch = put_batch(fake_tq, [("e", x, False), ("e", y, False)])
    trainer._compute_advantage(batch, {})
    assert read(fake_tq, batch, "rm_scores")[0][1] == pytest.approx(1 + 4 * np.exp(-1))


def test_malformed_step_record_fails_naming_the_trajectory(fake_tq):
    bad = rollout([1, 1, 1], 0.0, [{"turn": 1, "queries": 1, "hits": [0]}])
    bad["extra_fields"][STEPS_KEY][0].pop("queries")
    trainer = make_trainer([])
    batch = put_batch(fake_tq, [("z", bad, False)])
    with pytest.raises(ValueError, match=r"trajectory z_0_0\[0\]"):
        trainer._compute_advantage(batch, {})


def _data_proto(samples, uids):
    width = max(len(s["response_mask"]) for s in samples)
    pad = lambda t: torch.nn.functional.pad(t, (0, width - len(t)))  # noqa: E731
    return DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.stack([pad(s["rm_scores"]) for s in samples]),
            "response_mask": torch.stack([pad(s["response_mask"]) for s in samples]),
        },
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


def test_estimators_through_compute_advantage_dispatch():
    cfg = compose("spader", paper_overrides("spader"))
    # dense rewards as the trainer mode writes them
    dense = [rollout([3, 2, 2, 2, 2], 0.0), rollout([2, 3, 1, 1], 0.0), rollout([4], 0.0)]
    for sample, rewards in zip(dense, [(0.5, 0.2, 0.6), (0.1, 0.4), (0.0,)], strict=False):
        ends = [
            j
            for j in range(len(sample["response_mask"]))
            if sample["response_mask"][j] == 1
            and (j + 1 == len(sample["response_mask"]) or sample["response_mask"][j + 1] == 0)
        ]
        sample["rm_scores"] = torch.zeros(len(sample["response_mask"]))
        sample["rm_scores"][ends] = torch.tensor(rewards)
    data = compute_advantage(
        _data_proto(dense, ["u", "u", "u"]), adv_estimator="spader_spa", config=cfg.algorithm
    )
    got = data.batch["advantages"]
    assert got[0, :11].tolist() == pytest.approx(expected_tokens(dense[0], WORKED["A"]), abs=5e-5)
    assert got[2, :4].tolist() == pytest.approx([-1.1303] * 4, abs=5e-5)
    # the trajectory-level variant equals verl's own GRPO up to the std convention:
    # population std (ours) vs Bessel-corrected (verl), i.e. a factor sqrt(G / (G - 1))
    traj = compute_advantage(_data_proto(dense, ["u"] * 3), adv_estimator="spader_traj", config=cfg.algorithm)
    grpo = compute_advantage(_data_proto(dense, ["u"] * 3), adv_estimator="grpo", config=cfg.algorithm)
    mask = data.batch["response_mask"].bool()
    ratio = traj.batch["advantages"][mask] / grpo.batch["advantages"][mask]
    assert torch.allclose(ratio, torch.full_like(ratio, (3 / 2) ** 0.5), atol=1e-4)


def test_estimators_need_the_group_uid():
    from spader.methods.spader.advantage import spader_spa_advantage

    with pytest.raises(ValueError, match="uid"):
        spader_spa_advantage(torch.zeros(1, 3), torch.ones(1, 3), index=None, config={"gamma": 0.9})


def test_failed_episodes_are_no_peers_in_spa_or_grpo(caplog):
    """An episode that failed for an infrastructure reason (one masked token, scored 0) leaves its
    group's statistics: the others get the advantages they get without it, and it gets 0."""
    cfg = compose("spader", paper_overrides("spader"))
    dense = [rollout([3, 2, 2], 0.0), rollout([4], 0.0)]
    for sample, rewards in zip(dense, [(0.5, 0.6), (0.2,)], strict=True):
        runs = [
            j
            for j in range(len(sample["response_mask"]))
            if sample["response_mask"][j] == 1
            and (j + 1 == len(sample["response_mask"]) or sample["response_mask"][j + 1] == 0)
        ]
        sample["rm_scores"] = torch.zeros(len(sample["response_mask"]))
        sample["rm_scores"][runs] = torch.tensor(rewards)
    failed = {**dense[1], "response_mask": torch.tensor([0]), "rm_scores": torch.tensor([0.0])}
    for estimator in ("spader_spa", "spader_traj", "spader_grpo"):
        alone = compute_advantage(
            _data_proto(dense, ["u", "u"]), adv_estimator=estimator, config=cfg.algorithm
        )
        with caplog.at_level("WARNING", logger="spader.integrations.verl.estimators"):
            caplog.clear()
            mixed = compute_advantage(
                _data_proto([*dense, failed], ["u", "u", "u"]), adv_estimator=estimator, config=cfg.algorithm
            )
        got, want = mixed.batch["advantages"], alone.batch["advantages"]
        assert torch.allclose(got[:2, : want.size(1)], want, atol=1e-6), estimator
        assert got[2].abs().sum() == 0
        assert any("1 of 3 trajectories have no generated token" in r.message for r in caplog.records)
    # as a peer, a zero-return failure would have moved the others' advantages
    as_peer = compute_advantage(
        _data_proto([*dense, failed], ["u"] * 3), adv_estimator="grpo", config=cfg.algorithm
    )
    alone = compute_advantage(_data_proto(dense, ["u", "u"]), adv_estimator="grpo", config=cfg.algorithm)
    assert as_peer.batch["advantages"][0, 0] != pytest.approx(alone.batch["advantages"][0, 0].item())
