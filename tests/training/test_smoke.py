"""scripts/gpu_smoke.sh on CPU: the command it composes (the train_policy command plus the smoke
overrides, checked by Hydra and verl), the inputs it builds, and the script itself."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from spader.training.launch import compose_config, override_key
from spader.training.lineage import RunLink
from spader.training.run import plan_launch
from spader.training.smoke import (
    SMOKE_OVERRIDES,
    SMOKE_TRAINING,
    load_config,
    main,
    prepare_command,
    smoke_job,
)

REPO = Path(__file__).resolve().parents[2]
DEMO = [REPO / "config" / "config.yaml", REPO / "config" / "demo.yaml"]


@pytest.fixture
def smoke_root(tmp_path, tiny_model) -> Path:
    """A project root with the repository's config and the tiny model where the workflow builds it."""
    os.symlink(REPO / "config", tmp_path / "config")
    os.symlink(REPO / "workflow", tmp_path / "workflow")
    (tmp_path / "results" / "models" / "tiny").mkdir(parents=True)
    os.symlink(tiny_model, tmp_path / "results" / "models" / "tiny" / "qwen3")
    return tmp_path


def _plan(job):
    return plan_launch(
        job, resume_from=None, metrics_file=job.metrics_dir / "attempt_001.jsonl", link=RunLink(None, None)
    )


@pytest.mark.slow
def test_smoke_command_is_the_training_command_shrunk(smoke_root):
    from spader.integrations.verl.overrides import TRAINING_KEYS

    config = load_config(DEMO, REPO)
    job = smoke_job(config, smoke_root / "results" / "gpu_smoke", root=smoke_root, threads=4)
    cfg = compose_config(_plan(job))
    assert cfg.trainer.total_training_steps == 2
    assert (cfg.trainer.n_gpus_per_node, cfg.actor_rollout_ref.rollout.tensor_model_parallel_size) == (1, 1)
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n, cfg.trainer.save_freq) == (2, 2, 1)
    assert cfg.algorithm.adv_estimator == "spader_spa"
    assert cfg.algorithm.spader.beta == config["variants"]["spader"]["beta"]
    assert cfg.actor_rollout_ref.model.path == str(smoke_root / "results" / "models" / "tiny" / "qwen3")
    assert cfg.data.train_files == str(smoke_root / "results" / "demo" / "data" / "verl" / "train.parquet")
    assert cfg.trainer.default_local_dir == str(smoke_root / "results" / "gpu_smoke" / "work" / "checkpoints")

    # the same job as rule train_policy would run, minus the smoke sizes
    job.extra_overrides = ()
    job.training = config["training"]
    rule = set(_plan(job).overrides)
    smoke = set(_plan(smoke_job(config, job.workdir.parent, root=smoke_root, threads=4)).overrides)
    allowed = {TRAINING_KEYS[k] for k in SMOKE_TRAINING} | {override_key(o) for o in SMOKE_OVERRIDES}
    assert {override_key(o) for o in rule ^ smoke} <= allowed


@pytest.mark.slow
def test_dry_run_cli_prints_the_command(smoke_root, capsys):
    out = smoke_root / "results" / "gpu_smoke"
    assert main(["--root", str(smoke_root), "--out", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()  # verl's validation prints a line first
    printed = json.loads("\n".join(lines[lines.index("{") :]))
    assert printed["argv"][1:3] == ["-m", "spader.integrations.verl.main"]
    assert "trainer.total_training_steps=2" in printed["argv"]
    assert printed["env"]["VERL_FILE_LOGGER_PATH"] == str(out / "work" / "metrics" / "attempt_001.jsonl")


def test_prepare_builds_the_inputs_with_the_workflow():
    config = load_config(DEMO, REPO)
    cmd = prepare_command(config, ["config/config.yaml", "config/demo.yaml"], cores=2)
    proc = subprocess.run([*cmd, "-n"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rule in ("export_rl_dataset", "build_bm25_index", "build_tiny_model"):
        assert rule in proc.stdout
    assert "train_policy" not in proc.stdout and "evaluate_policy" not in proc.stdout


def test_script_runs_the_smoke_module():
    script = REPO / "scripts" / "gpu_smoke.sh"
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert "-m spader.training.smoke --prepare" in script.read_text()
