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
def gpu_training_job():
    """``(paper_config, tmp_path, device=...) -> TrainJob``: qwen3_8b/spader as the paper's node runs it."""
    return _training_job


def _training_job(paper_config: dict, tmp_path: Path, *, device: str = "cuda"):
    """A TrainJob of qwen3_8b/spader on the paper's node (its training file of 64 rows, no model)."""
    import polars as pl

    from spader.training.run import TrainJob

    data = tmp_path / "data"
    data.mkdir(parents=True)
    for split, rows in (("train", 64), ("val", 8)):
        pl.DataFrame({"data_source": ["qampari"] * rows}).write_parquet(data / f"{split}.parquet")
    training = {**paper_config["training"], "device": device}
    if device == "cpu":
        training["rollout_backend"] = "transformers"
    return TrainJob(
        backbone="qwen3_8b", variant="spader", backbone_spec=paper_config["backbones"]["qwen3_8b"],
        variant_spec=paper_config["variants"]["spader"], training=training, retrieval=paper_config["retrieval"],
        train_file=data / "train.parquet", val_file=data / "val.parquet", index_dir=tmp_path / "index",
        model_dir=tmp_path / "model",  # none here: the plan takes Qwen3-8B's shipped shape
        verl_config_dir=REPO / "config" / "verl", workdir=tmp_path / "work", final_json=tmp_path / "final.json",
        threads=64, hardware=paper_config["hardware"],
    )  # fmt: skip


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
