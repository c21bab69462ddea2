"""scripts/gpu_first_hour.sh on a machine without GPUs: with --cpu it runs the steps the CPU path
has (the preflight's CPU checks, the plan, the smoke test's dry run) and says which GPU-only step
it skips; without it, the preflight fails here (no sglang, no GPU) and nothing after it runs. It
runs the project's environment (.venv/bin/python), not whatever `python` the PATH finds, and names
glibc and the wheel tag before anything."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_first_hour.sh"


def _run(*args: str, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


needs_venv = pytest.mark.skipif(
    not (REPO / ".venv" / "bin" / "python").exists(), reason="no .venv in this checkout (README, Set up)"
)


@needs_venv
def test_it_runs_the_projects_environment_whatever_python_the_path_finds(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("python", "python3"):  # a `python` on PATH that is not the project's
        (fake / name).write_text("#!/bin/sh\necho not the project's python >&2\nexit 9\n")
        (fake / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PYTHON": str(fake / "python")}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "not the project's python" not in proc.stderr, proc.stderr
    assert "usage: scripts/gpu_first_hour.sh" in proc.stdout
    assert proc.stdout.startswith("ok    glibc: glibc 2.")  # named before anything runs


def test_the_steps_are_the_documented_ones_in_order():
    from spader.training.first_hour import STEPS, steps

    assert [s.name for s in STEPS] == ["preflight", "plan", "calibration", "smoke", "paper step"]
    planned = dict(
        (s.name, argv) for s, argv in steps(cpu=True, configfiles=["a.yaml", "b.yaml"], python="py")
    )
    assert planned["calibration"] is None  # GPU-only
    assert planned["plan"] == [
        "py",
        "-m",
        "spader.cli",
        "plan",
        "--configfile",
        "a.yaml",
        "--configfile",
        "b.yaml",
    ]
    assert planned["smoke"][-1] == "--dry-run" and planned["preflight"][-1] == "--cpu"
    assert planned["paper step"][-1] == "--dry-run"
    gpu = dict((s.name, argv) for s, argv in steps(cpu=False, configfiles=["c.yaml"], python="py"))
    assert gpu["smoke"] == ["bash", "scripts/gpu_smoke.sh"] and "--cpu" not in gpu["preflight"]
    docs = (REPO / "docs" / "gpu.md").read_text()
    for step in STEPS:  # docs/gpu.md lists every command with what it prints and how long it takes
        shown = " ".join(a for a in step.argv if a != "{configfiles}")
        assert shown.replace("{python} -m spader.cli", "spader").replace("{python}", "python") in docs
        assert step.duration in docs


@pytest.mark.slow
@needs_venv
def test_cpu_mode_runs_what_the_cpu_path_has_and_skips_the_gpu_steps():
    proc = _run("--cpu")
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "== step 1/5: preflight passed" in out and "ok    verl: 0.9.1" in out
    assert "== step 2/5: plan passed" in out and "the plan fits: every job and the DAG's disk" in out
    assert "== step 3/5: calibration: skipped (GPU-only; run on a GPU node without --cpu)" in out
    assert "== step 4/5: smoke passed" in out and '"trainer.device": "cuda"' in out
    assert "== step 5/5: paper step passed" in out
    assert out.rstrip().endswith("== first hour: every step passed")


@needs_venv
@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is not None, reason="a GPU node's environment: its preflight may pass"
)
def test_it_stops_at_the_first_failing_step():
    proc = _run()  # this machine has no sglang and no GPU: the preflight fails
    out = proc.stdout
    assert proc.returncode == 1
    assert (
        "FAIL  sglang: sglang is not installed" in out
        and "FAIL  gpus: GPUs visible: 0 GPU(s), short of" in out
    )
    assert (
        "== FAILED at step 1/5: preflight (exit 1" in out
        and "not run: plan, calibration, smoke, paper step" in out
    )
    assert "== step 2/5" not in out
