"""SPADER training for real on the CPU: verl's own trainer, TransferQueue, FSDP engines, agent loop,
search tool (over the real BM25 retrieval service), reward, estimator and trainer mode, with the
project's CPU platform and transformers rollout replica (tests/support/cpu_world.py builds the
world: the demo's passages and questions, a short prompt, a partly warm-started tiny Qwen3).

One SPADER run gets SIGTERM after a checkpoint, as a workstation's stop: verl stops at its next
step boundary with that step saved, the job exits with the resumable status, and the rerun resumes
there; it must reach the same final step count with every step logged once. Where a SLURM cluster
answers (CI), that stop and resume is left to tests/slurm's training across time-limited
allocations (the same request to stop at a step boundary, from SLURM's warning signal, on real
verl) and the run here is not stopped: one verl start less. Its first step must change the
policy's weights with a finite loss,
its mean reward must rise over step 1 while a negative control (advantages forced to zero) does
not, and its exported checkpoint must load in the evaluation engine.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

SUPPORT = Path(__file__).resolve().parents[1] / "support"
sys.path.insert(0, str(SUPPORT))

from cpu_world import cpu_training, train_job  # noqa: E402
from slurm_node import slurm_problem  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 4
KILL_AFTER = 2  # checkpoint step after which the first attempt is killed
LR = 2e-4
MINI_BATCH = 2  # two policy updates per step
# Mean training reward (verl's critic/score/mean) per step. The zero-advantage control never
# changes its policy, so the mean of all its steps estimates the warm-started policy's reward (the
# "step 0" level). Rollouts are reproducible (seeds derived from rollout.seed and the step), so
# SPADER and the control sample with the same seeds at every step. Seen on this world (two runs):
# SPADER's steps 2..STEPS above the initial level by 0.40-0.42, the control's by -0.05-0.07,
# SPADER above the control at the same steps by 0.35-0.44.
RISE = 0.2  # SPADER's steps 2..STEPS must beat the initial level by this much
FLAT = 0.15  # the control's steps 2..STEPS must stay below the initial level plus this
GAP = 0.25  # SPADER's steps 2..STEPS must beat the control's (same seeds) by this much


def _sizes() -> dict:
    return {"max_steps": STEPS, "lr": LR, "ppo_mini_batch_size": MINI_BATCH}


def _rewards(job) -> dict[int, float]:
    from spader.training.checkpoints import read_step_metrics

    steps = read_step_metrics(job.metrics_dir)
    return {s: m["critic/score/mean"] for s, m in steps.items() if "critic/score/mean" in m}


def _later(rewards: dict[int, float]) -> float:
    """Mean reward of steps 2..STEPS (after the first update)."""
    return sum(rewards[s] for s in range(2, STEPS + 1)) / (STEPS - 1)


def _kill_after_checkpoint(world, out: Path, step: int) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Start the job as its own process, SIGTERM it once checkpoint ``step`` is complete; returns
    the process and the steps whose rewards were logged when the checkpoint was seen."""
    from spader.training.checkpoints import read_step_metrics

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, str(SUPPORT / "cpu_world.py"), str(world.root), str(out), json.dumps(_sizes())]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tracker = out / "work" / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 1500
    logged: list[int] = []
    while time.monotonic() < deadline and proc.poll() is None:
        if tracker.exists() and int(tracker.read_text().strip() or 0) >= step:
            proc.send_signal(signal.SIGTERM)  # as a scheduler ending the job
            steps = read_step_metrics(out / "work" / "metrics")
            logged = sorted(s for s, m in steps.items() if "critic/score/mean" in m)
            break
        time.sleep(0.5)
    output, _ = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(argv, proc.returncode, output, ""), logged


@pytest.fixture(scope="module")
def spader_run(world, tmp_path_factory):
    """The SPADER job: killed after checkpoint KILL_AFTER, then run again to the end (run once to
    the end where SLURM answers: the stop is tested there, under a real time limit)."""
    from spader.training.run import run_training

    out = tmp_path_factory.mktemp("spader")
    stopped = None if not slurm_problem() else _kill_after_checkpoint(world, out, KILL_AFTER)
    job = train_job(world, out, training=cpu_training(**_sizes()))
    final = run_training(job)
    return job, stopped, final


def test_a_stopped_job_resumes_from_its_checkpoint_and_finishes(spader_run):
    from spader.training.stop import RESUME_EXIT_CODE

    job, stopped, final = spader_run
    if stopped is None:
        pytest.skip(
            "SLURM answers here: tests/slurm/test_slurm_real.py stops and resumes a training under "
            "its time limit instead"
        )
    killed, logged_at_kill = stopped
    assert killed.returncode == RESUME_EXIT_CODE, killed.stdout[-3000:]
    # a checkpoint is written only after its step's metrics: once checkpoint KILL_AFTER was seen,
    # steps 1..KILL_AFTER were logged (verl alone saves first, and a stop in between lost a step)
    assert logged_at_kill[:KILL_AFTER] == list(range(1, KILL_AFTER + 1)), logged_at_kill
    assert final["steps_done"] == STEPS
    # SIGTERM came after checkpoint KILL_AFTER: verl finished the step it was in, saved it, ended
    assert KILL_AFTER < final["resumed_from_step"] < STEPS and final["attempt"] == 2
    attempts = [json.loads(line) for line in (job.workdir / "attempts.jsonl").read_text().splitlines()]
    assert [a.get("status") for a in attempts if a.get("event") == "end"] == ["stopped", "finished"]
    # every step was trained and logged exactly once across the two attempts
    trained = []
    for f in sorted(job.metrics_dir.glob("attempt_*.jsonl")):
        trained += [
            r["step"] for r in map(json.loads, f.read_text().splitlines()) if "critic/score/mean" in r["data"]
        ]
    assert sorted(trained) == list(range(1, STEPS + 1))


def test_one_step_changes_the_weights_and_the_loss_is_finite(spader_run, world):
    from transformers import AutoModelForCausalLM

    from spader.training.checkpoints import read_step_metrics

    job, _, _ = spader_run
    step1 = read_step_metrics(job.metrics_dir)[1]
    assert math.isfinite(step1["actor/pg_loss"]) and math.isfinite(step1["actor/kl_loss"])
    assert step1["actor/grad_norm"] > 0
    # the earliest actor checkpoint retention kept (training.max_actor_ckpt_to_keep prunes the
    # older actors; verl leaves their step directories with the data loader's state)
    kept = sorted(
        job.ckpt_dir.glob("global_step_*/actor/model_world_size_1_rank_0.pt"),
        key=lambda p: int(p.parents[1].name.rsplit("_", 1)[1]),
    )
    assert kept, f"no actor checkpoint in {job.ckpt_dir}"
    shard = kept[0]
    trained = torch.load(shard, map_location="cpu", weights_only=False)
    base = AutoModelForCausalLM.from_pretrained(world.model).state_dict()
    changed = 0
    for name, value in trained.items():
        value = value.full_tensor() if hasattr(value, "full_tensor") else value
        assert torch.isfinite(value).all(), name
        changed += int(not torch.equal(value, base[name]))
    assert changed > len(trained) // 2  # the update reaches most tensors


def test_spader_raises_the_reward_and_the_zero_advantage_control_does_not(
    spader_run, world, tmp_path, monkeypatch
):
    from spader.training.run import run_training

    job, _, _ = spader_run
    # negative control: the same run with the estimator replaced by zeros (loaded in every
    # process like the project's plug-in)
    import zero_advantage

    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", zero_advantage.__name__)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))
    )
    control = train_job(
        world,
        tmp_path,
        training=cpu_training(**_sizes()),
        extra=[f"algorithm.adv_estimator={zero_advantage.NAME}"],
    )
    run_training(control)
    learned, flat = _rewards(job), _rewards(control)
    initial = sum(flat.values()) / len(flat)
    assert learned[1] == pytest.approx(flat[1])  # the same policy and seeds before any update
    assert _later(learned) - initial >= RISE, (initial, learned)
    assert _later(flat) - initial < FLAT, (initial, flat)
    assert _later(learned) - _later(flat) >= GAP, (learned, flat)


def test_the_exported_checkpoint_loads_in_the_evaluation_engine(spader_run, tmp_path):
    from spader.agent.generation import Sampling, TransformersEngine
    from spader.models.local import TINY_MARKER
    from spader.training.hf_export import export_checkpoint

    job, _, _ = spader_run
    meta = export_checkpoint(job.final_json, tmp_path / "model", tmp_path / "model.json")
    assert meta["steps_done"] == STEPS and (tmp_path / "model" / TINY_MARKER).exists()
    engine = TransformersEngine(tmp_path / "model", device="cpu", threads=1)
    prompt = engine.tokenizer("Question: which rivers?", add_special_tokens=False)["input_ids"]
    out = engine.generate([prompt], [8], Sampling(temperature=0.0))[0]
    assert out.error is None and out.completion_tokens > 0
