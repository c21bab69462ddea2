"""A CPU SPADER training stopped by SIGTERM at a step boundary and resumed, for real: verl's own
trainer, TransferQueue, FSDP engines, agent loop, search tool over the real BM25 retrieval service
(tests/support/cpu_world.py builds the world).

The job gets SIGTERM after a checkpoint, as a workstation's stop: verl stops at its next step
boundary with that step saved, the job exits with the resumable status, and the rerun resumes
there; it must reach the same final step count with every step logged once.

Where a SLURM cluster answers (CI), the module is skipped: tests/slurm stops and resumes a real
verl training across time-limited allocations through the same request to stop (SLURM's warning
signal), so the suite does not pay a second CPU training for it. What a training's first steps do
to the weights, the reward and a zero-advantage control is tested on the method's own world by
tests/cpu_training/test_update_direction.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parents[1] / "support"
sys.path.insert(0, str(SUPPORT))

from cpu_world import cpu_training, train_job  # noqa: E402
from slurm_node import slurm_problem  # noqa: E402

# decided at collection: with SLURM answering, no training of this module starts
_SLURM = slurm_problem()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not _SLURM,
        reason="SLURM answers here: tests/slurm/test_slurm_real.py stops and resumes a training under "
        "its time limit instead",
    ),
]

STEPS = 4
KILL_AFTER = 2  # checkpoint step after which the first attempt is killed


def _sizes() -> dict:
    return {"max_steps": STEPS, "lr": 2e-4, "ppo_mini_batch_size": 2}


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
    """The SPADER job: killed after checkpoint KILL_AFTER, then run again to the end."""
    from spader.training.run import run_training

    out = tmp_path_factory.mktemp("spader")
    stopped = _kill_after_checkpoint(world, out, KILL_AFTER)
    job = train_job(world, out, training=cpu_training(**_sizes()))
    final = run_training(job)
    return job, stopped, final


def test_a_stopped_job_resumes_from_its_checkpoint_and_finishes(spader_run):
    from spader.training.stop import RESUME_EXIT_CODE

    job, stopped, final = spader_run
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
