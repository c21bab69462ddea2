"""Both baselines through the ``spader_sync`` trainer mode and verl's own advantage step on CPU.

A batch shaped like the agent loop's TransferQueue samples (our search tool's step records with
turn details, the row's ``extra_info``, critic values and log-probs) goes through
``SpaderTrainerSync._compute_advantage``: the variant's step rewards are densified, verl applies
the KL penalty in the reward and dispatches to ``gae`` (StepSearch) or the registered
``r3rag_turn_gae`` (R3-RAG). TransferQueue is the in-memory stand-in (the real one needs Ray).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("verl")

from paper_verl import paper_overrides
from transfer_queue import KVBatchMeta
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics
from verl.trainer.ppo.core_algos import compute_gae_advantage_return
from verl.trainer.ppo.v1 import get_trainer_cls

from spader.integrations.verl import plugin  # noqa: F401  (registration)
from spader.integrations.verl.compose import compose
from spader.integrations.verl.scorer_rewards import R3RagRewards, StepSearchRewards
from spader.methods.r3rag.scoring import turn_gae
from spader.methods.steps import FINAL_TURN_KEY, N_GOLD_KEY, STEPS_KEY, StepRecord, TurnDetails

EVIDENCE = ["Alpha Beta", "Gamma Delta"]


def record(turn, passages, scores=None, reasoning="r"):
    shown = [
        [
            {"id": pid, "title": "", "text": text, "score": s}
            for (pid, text), s in zip(passages, scores or [0.0] * len(passages), strict=True)
        ]
    ]
    base = StepRecord(turn=turn, queries=1, hits=()).as_dict()
    return {**base, **TurnDetails.fields(shown, ["q"], reasoning, "observation")}


def sample(runs, score, steps, final_turn, qid="q1", seed=0):
    """One trajectory's TransferQueue fields; ``runs`` alternates assistant/observation lengths."""
    mask = []
    for i, n in enumerate(runs):
        mask += [1 if i % 2 == 0 else 0] * n
    length = len(mask)
    g = torch.Generator().manual_seed(seed)
    rm = torch.zeros(length)
    rm[-1] = score
    return {
        "prompts": torch.tensor([1, 2, 3]),
        "responses": torch.arange(100, 100 + length),
        "response_mask": torch.tensor(mask),
        "rm_scores": rm,
        "values": torch.randn(length, generator=g),
        "old_log_probs": -torch.rand(length, generator=g),
        "ref_log_prob": -torch.rand(length, generator=g),
        "extra_fields": {STEPS_KEY: steps, N_GOLD_KEY: 2, FINAL_TURN_KEY: final_turn},
        "extra_info": {"id": qid, "question": "Which alphas and gammas?", "index": 0},
        "metrics": AgentLoopMetrics().model_dump(),  # the agent loop's timers
    }


def put(queue, samples):
    keys = []
    for i, s in enumerate(samples):
        key = f"u_{i}_0"
        queue.put_samples([key], [{**s, "uid": "u"}])
        queue.tags[("train", key)] = {}
        keys.append(key)
    return KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train")


def read(queue, batch, name):
    return [queue.store[("train", k)][name] for k in batch.keys]


def trainer(variant, overrides):
    cfg = compose(variant, [*paper_overrides(variant), "actor_rollout_ref.model.path=/unused", *overrides])
    t = get_trainer_cls(cfg.trainer.v1.trainer_mode)(cfg)
    t.global_steps = 1
    return t


@pytest.fixture
def evidence_file(tmp_path):
    path = tmp_path / "evidence.jsonl"
    rows = [
        {
            "id": "q1",
            "dataset": "qampari",
            "n_entities": 2,
            "evidence": [
                {"entity": i, "source": "search", "passage_id": f"g{i}", "title": "", "text": t, "rank": 1}
                for i, t in enumerate(EVIDENCE)
            ],
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_stepsearch_through_verl_gae(fake_tq, evidence_file):
    t = trainer(
        "stepsearch",
        [f"algorithm.stepsearch.evidence_path={evidence_file}", "algorithm.stepsearch.workers=0"],
    )
    assert isinstance(t.step_rewards.rewards, StepSearchRewards)
    steps = [record(1, [("p1", "alpha beta")]), record(2, [("p1", "alpha beta"), ("p3", "gamma delta")])]
    # a second trajectory of another length answers at once with an invalid format (verl's
    # TransferQueue path needs rows of different lengths to store them as nested tensors)
    batch = put(
        fake_tq, [sample([2, 3, 2, 1, 3], 0.5, steps, '<answer>["a"]</answer>'), sample([3], -1.0, [], "x")]
    )
    metrics = {}
    t._compute_advantage(batch, metrics)
    rm, other = read(fake_tq, batch, "rm_scores")
    assert other.tolist() == [0.0, 0.0, -1.0]
    # turn 1: G = 1/2, P = 0; turn 2: G = 1/2 (g2 found), P = 1/2; answer: F1 0.5
    expected = [0.0, 0.6 * 0.5, 0, 0, 0, 0, 0.6 * (0.5 - 0.5), 0, 0, 0, 0.5]
    assert rm.tolist() == pytest.approx(expected, abs=1e-6)
    s = fake_tq.store[("train", batch.keys[0])]
    kl = (s["old_log_probs"] - s["ref_log_prob"]) * s["response_mask"]  # k1, fixed coefficient 0.001
    rewards = torch.tensor(expected) - 0.001 * kl
    tokens = read(fake_tq, batch, "token_level_rewards")[0]
    assert tokens.tolist() == pytest.approx(rewards.tolist(), abs=1e-6)
    _, returns = compute_gae_advantage_return(
        rewards[None], s["values"][None], s["response_mask"][None], 1.0, 1.0
    )
    assert read(fake_tq, batch, "returns")[0].tolist() == pytest.approx(returns[0].tolist(), abs=1e-5)
    assert metrics["stepsearch/turn_gain/mean"] == pytest.approx(0.5)
    assert metrics["stepsearch/turn_redundancy/mean"] == pytest.approx(0.25)
    assert metrics["stepsearch/search_turns/mean"] == pytest.approx(1.0)  # (2 + 0) / 2


def test_stepsearch_needs_evidence_for_every_question(fake_tq, evidence_file):
    t = trainer(
        "stepsearch",
        [f"algorithm.stepsearch.evidence_path={evidence_file}", "algorithm.stepsearch.workers=0"],
    )
    batch = put(
        fake_tq,
        [sample([2, 1, 2], 1.0, [record(1, [("p1", "x")])], "", qid="unknown"), sample([1], 0.0, [], "")],
    )
    with pytest.raises(KeyError, match="no entry in .*rebuild the evidence"):
        t._compute_advantage(batch, {})


def test_r3rag_with_the_reranker_judge_through_the_turn_gae(fake_tq):
    t = trainer("r3rag", ["algorithm.r3rag.judge.kind=reranker"])
    assert isinstance(t.step_rewards.rewards, R3RagRewards) and t.step_rewards.rewards.client is None
    answered = sample(
        [2, 2, 3], 1.0, [record(1, [("p1", "x"), ("p2", "y")], scores=[0.0, 2.0])], '<answer>["a"]</answer>'
    )
    unanswered = sample(
        [1, 1, 2, 1],
        -1.0,
        [record(1, [("p3", "z")], scores=[-1.0]), record(2, [("p4", "w")], scores=[1.0])],
        '<tool_call>["more"]</tool_call>',
        seed=1,
    )
    batch = put(fake_tq, [answered, unanswered])
    metrics = {}
    t._compute_advantage(batch, metrics)
    rm = read(fake_tq, batch, "rm_scores")
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert rm[0].tolist() == pytest.approx([0, 1.6 * sig(2.0), 0, 0, 0, 0, 2.0], abs=1e-6)
    assert rm[1].tolist() == pytest.approx([0.9 * sig(-1.0), 0, 0, 0.9 * sig(1.0), 0], abs=1e-6)
    assert metrics["r3rag/outcome_no_answer"] == 1 and metrics["r3rag/judged_turns"] == 3
    # the advantage verl stored is the per-turn GAE of the KL-penalised rewards, whitened over the batch
    samples = [fake_tq.store[("train", k)] for k in batch.keys]
    width = max(s["response_mask"].numel() for s in samples)

    def pad(x):
        return torch.nn.functional.pad(x.float(), (0, width - x.numel()))

    mask = torch.stack([pad(s["response_mask"]) for s in samples])
    tokens = torch.stack([pad(r) for r in rm]) - 0.01 * torch.stack(
        [pad((s["old_log_probs"] - s["ref_log_prob"]) * s["response_mask"]) for s in samples]
    )
    adv, _ = turn_gae(tokens, torch.stack([pad(s["values"]) for s in samples]), mask)
    flat = adv[mask.bool()]
    expected = (adv - flat.mean()) / torch.sqrt(flat.var() + 1e-8) * mask
    stored = read(fake_tq, batch, "advantages")
    for i, s in enumerate(samples):
        n = s["response_mask"].numel()
        assert stored[i].tolist() == pytest.approx(expected[i, :n].tolist(), abs=1e-5)


def test_r3rag_llm_judge_needs_an_endpoint():
    with pytest.raises(ValueError, match="judge.url is not set"):
        trainer("r3rag", [])
