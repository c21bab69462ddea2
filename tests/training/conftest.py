"""Shared fixtures of the training tests: the repository config, a tiny random Qwen3 and a real
verl FSDP checkpoint of it (2 ranks, written on CPU by verl's own checkpoint manager)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def paper_config() -> dict:
    """config/config.yaml, checked against the schema."""
    from spader.config import resolved_config

    return resolved_config(REPO / "config" / "config.yaml", verl_config_dir=REPO / "config" / "verl")


@pytest.fixture(scope="session")
def fsdp_actor(tmp_path_factory, tiny_model) -> Path:
    """``global_step_1/actor`` of a real 2-rank FSDP2 checkpoint of ``tiny_model``."""
    out = tmp_path_factory.mktemp("fsdp") / "global_step_1" / "actor"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CKPT_STEP": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(HERE / "make_fsdp_checkpoint.py"),
            str(tiny_model),
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out
