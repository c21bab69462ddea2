"""SPADER's rewards and advantages reach verl's weights with the right sign, trained for real on
the CPU (verl's own trainer, TransferQueue, agent loop, search tool over the real BM25 retrieval
service, reward, SPA estimator).

This is a test of the plumbing, not of what SPADER achieves: it checks that an update driven by
SPADER's step rewards and SPA advantages moves the policy toward what those rewards pay for, more
discovered entities, in a world built so that searching more is the choice an update can move.
Whether SPADER gives better answers is not asserted here: answer F1 and the valid-format rate are
printed beside the entities (they can fall while this test passes), bench/method_learning.py
reports them for every arm with GRPO on the same seeds, and the paper's claims are measured on
answer-level outcomes in the controlled world of docs/mechanisms.md.

The world (tests/support/spread_world.py) spreads each question's six answers over passages so
that one search shows two of them: finding more takes more searches. The warm start searches,
reads and answers with the villages it read, stopping after one, two or three searches equally
often. The arms (tests/support/method_runs.py) start from that one warm start with the same
training seed; rollouts are seeded by the training seed, the weight version and the prompt, so
every arm's first step samples the same trajectories.

* By default SPADER trains CHECK_STEPS steps, and the file checks what any training must: step
  rewards (new entities found, a novelty premium, a cost per query) that are non-zero and differ
  between search steps, a first step with a finite loss and a non-zero gradient, weights that
  change and stay finite, the GPU smoke test's checks of a finished run, an exported checkpoint
  that loads in the evaluation engine.
* The update-direction assertion (marked ``long``) trains SPADER and the zero-advantage control
  (every advantage forced to zero: sampling alone moves its numbers) STEPS steps each and asserts
  that SPADER's mean over steps 3..STEPS exceeds the control's by ``method_runs.MARGINS`` in
  discovered entities per trajectory (the differences in answer F1, valid formats, terminal and
  total reward are printed, not asserted). The margin comes from bench/method_learning.py over
  training seeds (docs/cpu-training.md, "The update-direction test"), which also runs the
  assertion on any other seeds.

(The stop at a step boundary and the resume are tested by tests/slurm/test_slurm_real.py under a
real time limit, or by tests/cpu_training/test_stop_resume.py where no SLURM answers.)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

SUPPORT = Path(__file__).resolve().parents[1] / "support"
sys.path.insert(0, str(SUPPORT))

from method_runs import (  # noqa: E402
    MARGINS,
    QUANTITIES,
    STEPS,
    learning_failures,
    paired_effects,
    step_metrics,
    train_arm,
)
from spread_world import build_world  # noqa: E402

pytestmark = pytest.mark.slow

# SPADER's steps when the update-direction assertion is not selected (the default run): enough for every
# check of a training - two steps, each with two updates, a checkpoint, an export - at half the cost
CHECK_STEPS = 2
SEED = 1  # config.yaml's training.seed; the margin was set on seeds 100..109, 200..209, 300..309
_DIRECTION = "test_spaders_update_raises_the_entities_its_step_reward_pays_for"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("spread_world"))


def _direction_selected(session) -> bool:
    """Whether this session runs the (long) update-direction assertion: only it needs all STEPS of
    SPADER and the control beside it; the default run's checks read SPADER's first CHECK_STEPS steps."""
    return any(getattr(item, "originalname", None) == _DIRECTION for item in session.items)


@pytest.fixture(scope="module")
def spader_steps(request) -> int:
    return STEPS if _direction_selected(request.session) else CHECK_STEPS


@pytest.fixture(scope="module")
def runs(world, tmp_path_factory, spader_steps):
    """SPADER, and where the update-direction assertion runs the zero-advantage control, from the
    same warm start with the same seed."""
    arms = ["spader"] + (["control"] if spader_steps == STEPS else [])
    jobs = {
        arm: train_arm(world, tmp_path_factory.mktemp(arm), arm, steps=spader_steps, seed=SEED)
        for arm in arms
    }
    return {name: (job, step_metrics(job)) for name, job in jobs.items()}


def test_spader_trained_every_step(runs, spader_steps):
    assert sorted(runs["spader"][1]) == list(range(1, spader_steps + 1))


def test_spader_step_rewards_are_non_zero_and_vary(runs):
    _, steps = runs["spader"]
    for step, m in steps.items():
        assert m["spader/search_steps/mean"] > 0, step
        assert m["spader/search_reward/mean"] != 0, step
        # search steps are not all worth the same (new villages, how many peers found them, none)
        assert m["spader/search_reward/max"] > m["spader/search_reward/min"], step
        assert m["critic/advantages/max"] > m["critic/advantages/min"], step


# Marked long: two four-step trainings, about 3 minutes on 2 idle cores. Its margins and the rate
# at which it fails on seeds it was not set on: docs/cpu-training.md, "The update-direction test".
@pytest.mark.long
def test_spaders_update_raises_the_entities_its_step_reward_pays_for(runs):
    """After two updates from the same first step, SPADER's trajectories discover more entities than
    the zero-advantage control's: the sign of SPADER's rewards and advantages reaches the weights.
    Not a claim about answers (their F1 and format validity are printed beside it)."""
    spader, control = runs["spader"][1], runs["control"][1]
    assert sorted(control) == list(range(1, STEPS + 1))
    # same weights and seeds before any update: the same trajectories, found entities and rewards
    for key in ("critic/score/mean", "spader/new_entities/mean", "spader/search_steps/mean"):
        assert spader[1][key] == pytest.approx(control[1][key]), key
    effects = paired_effects(spader, control)
    print("SPADER minus control, steps 3..4:", effects, "by step:", {
        q: {s: (value(spader[s]), value(control[s])) for s in spader} for q, value in QUANTITIES.items()
    })  # fmt: skip
    assert not learning_failures(effects), (learning_failures(effects), MARGINS)


def test_the_first_step_has_a_finite_loss_and_changes_most_weights(runs, world, spader_steps):
    from transformers import AutoModelForCausalLM

    job, steps = runs["spader"]
    step1 = steps[1]
    assert math.isfinite(step1["actor/pg_loss"]) and math.isfinite(step1["actor/kl_loss"])
    assert step1["actor/grad_norm"] > 0
    shard = next(
        (job.ckpt_dir / f"global_step_{spader_steps}" / "actor").glob("model_world_size_1_rank_0.pt")
    )
    trained = torch.load(shard, map_location="cpu", weights_only=False)
    start = AutoModelForCausalLM.from_pretrained(world.model).state_dict()
    changed = 0
    for name, value in trained.items():
        value = value.full_tensor() if hasattr(value, "full_tensor") else value
        assert torch.isfinite(value).all(), name
        changed += int(not torch.equal(value, start[name]))
    assert changed > len(trained) // 2  # the update reaches most tensors


def test_the_exported_checkpoint_loads_in_the_evaluation_engine(runs, tmp_path, spader_steps):
    from spader.agent.generation import Sampling, TransformersEngine
    from spader.models.local import TINY_MARKER
    from spader.training.hf_export import export_checkpoint

    job, _ = runs["spader"]
    meta = export_checkpoint(
        job.final_json, tmp_path / "model", tmp_path / "model.json", keep_checkpoints=True
    )
    assert meta["steps_done"] == spader_steps and (tmp_path / "model" / TINY_MARKER).exists()
    engine = TransformersEngine(tmp_path / "model", device="cpu", threads=1)
    prompt = engine.tokenizer("Question: which villages?", add_special_tokens=False)["input_ids"]
    out = engine.generate([prompt], [8], Sampling(temperature=0.0))[0]
    assert out.error is None and out.completion_tokens > 0


def test_the_gpu_smoke_tests_checks_pass_on_the_cpu_path(runs, world, spader_steps):
    """scripts/gpu_smoke.sh's checks of a finished run (spader.training.smoke.check_run), on this
    SPADER run through the transformers replica: searches, closed turns and none run past the tag,
    rewards that differ, non-zero advantages, the replica's seed (training.seed + rank 0) and
    changed weights (merged by verl's model merger), at every step."""
    from spader.training.smoke import check_run

    job, _ = runs["spader"]
    results = check_run(job, start_model=world.model, replicas=1, steps=spader_steps)
    assert [r.name for r in results if not r.ok] == [], "\n".join(r.line() for r in results)
    assert len(results) == 8
