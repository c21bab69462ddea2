"""scripts/gpu_smoke.sh on CPU: the command it composes (the train_policy command plus the smoke
overrides, checked by Hydra and verl), the inputs it builds, and the script itself."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from spader.training.launch import compose_config, override_key
from spader.training.lineage import RunLink
from spader.training.run import plan_launch
from spader.training.smoke import (
    SMOKE_AGENT,
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
def test_smoke_command_trains_on_the_gpu_with_sglang_at_the_paper_length(smoke_root):
    """The demo config trains on the CPU with the transformers replica; the smoke job composes
    verl's GPU platform, sglang and the paper config's response length."""
    import dataclasses

    from spader.integrations.verl.overrides import AGENT_KEYS, TRAINING_KEYS
    from spader.training.launch import device_overrides

    config = load_config(DEMO, REPO)
    assert (config["training"]["device"], config["training"]["rollout_backend"]) == ("cpu", "transformers")
    paper = load_config([REPO / "config" / "config.yaml"], REPO)["training"]["max_response_length"]
    job = smoke_job(config, smoke_root / "results" / "gpu_smoke", root=smoke_root, threads=4)
    plan = _plan(job)
    assert plan.env["VERL_PLATFORM"] == "nvidia"
    cfg = compose_config(plan)
    assert (cfg.trainer.device, cfg.actor_rollout_ref.rollout.name) == ("cuda", "sglang")
    assert cfg.data.max_response_length == paper == 8192
    assert cfg.data.max_prompt_length == SMOKE_TRAINING["max_prompt_length"]
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 1
    assert OmegaConf.select(cfg, "spader_agent.max_turn_tokens") is None  # one turn may fill the budget
    assert cfg.trainer.total_training_steps == 2
    assert (cfg.trainer.n_gpus_per_node, cfg.actor_rollout_ref.rollout.tensor_model_parallel_size) == (1, 1)
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n, cfg.trainer.save_freq) == (2, 2, 1)
    assert cfg.algorithm.adv_estimator == "spader_spa"
    assert cfg.algorithm.spader.beta == config["variants"]["spader"]["beta"]
    assert cfg.actor_rollout_ref.model.path == str(smoke_root / "results" / "gpu_smoke" / "policy")
    assert cfg.data.train_files == str(smoke_root / "results" / "demo" / "data" / "verl" / "train.parquet")
    assert cfg.trainer.default_local_dir == str(smoke_root / "results" / "gpu_smoke" / "work" / "checkpoints")

    # the same job as rule train_policy would run with the demo config, minus the smoke settings
    rule = dataclasses.replace(job, training=config["training"], agent=config["agent"], extra_overrides=())
    smoke = {override_key(o) for o in plan.overrides}
    ruled = {override_key(o) for o in _plan(rule).overrides}
    devices = {
        override_key(o)
        for t in (config["training"], {**config["training"], **SMOKE_TRAINING})
        for o in device_overrides(t, threads=4, workers=1)
    }
    allowed = (
        {TRAINING_KEYS[k] for k in (*SMOKE_TRAINING, "max_response_length") if k in TRAINING_KEYS}
        | {AGENT_KEYS[k] for k in SMOKE_AGENT}
        | {override_key(o) for o in SMOKE_OVERRIDES}
        | devices
        | {
            f"ray_kwargs.ray_init.{k}"
            for k in (
                "num_cpus",
                "runtime_env.env_vars.VERL_PLATFORM",
                "runtime_env.env_vars.OMP_NUM_THREADS",
            )
        }
    )
    changed = set(plan.overrides) ^ set(_plan(rule).overrides)
    assert {override_key(o) for o in changed} <= allowed, {override_key(o) for o in changed} - allowed
    assert smoke - ruled <= allowed


@pytest.mark.slow
def test_dry_run_cli_prints_the_command(smoke_root, capsys):
    out = smoke_root / "results" / "gpu_smoke"
    assert main(["--root", str(smoke_root), "--out", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()  # verl's validation prints a line first
    printed = json.loads("\n".join(lines[lines.index("{") :]))
    assert printed["argv"][1:3] == ["-m", "spader.integrations.verl.main"]
    assert "trainer.total_training_steps=2" in printed["argv"]
    assert printed["env"]["VERL_FILE_LOGGER_PATH"] == str(out / "work" / "metrics" / "attempt_001.jsonl")
    resolved, checks = printed["resolved"], printed["checks"]
    assert (resolved["trainer.device"], resolved["actor_rollout_ref.rollout.name"]) == ("cuda", "sglang")
    assert resolved["data.max_response_length"] == 8192
    assert "trainer.device=cuda" in checks["device"] and "name=sglang" in checks["rollout"]
    assert "every response runs to 8192 tokens" in checks["full_length_micro_batch"]
    # the smoke policy was built from the tiny model, so the dry run plans the job's memory too
    assert (out / "policy" / "config.json").is_file()
    assert any("train smoke/spader" in line and "fits" in line for line in checks["memory_plan"])


def test_the_smoke_policy_fills_the_response_budget(tiny_model, tmp_path):
    """The policy repeats its prompt's last token at temperature 1: no end-of-turn, no stop tag,
    so every response runs to the response length (a full-length micro-batch on the GPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spader.training.smoke import build_smoke_policy

    policy = build_smoke_policy(tiny_model, tmp_path / "policy")
    model = AutoModelForCausalLM.from_pretrained(policy)
    tok = AutoTokenizer.from_pretrained(policy)
    assert model.config.tie_word_embeddings is False  # the head is its own FSDP2 unit, as for 8B backbones
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Which films did Ilse Varga direct?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    torch.manual_seed(0)
    out = model.generate(
        ids, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=256, min_new_tokens=256
    )
    new = out[0, ids.shape[1] :].tolist()
    assert len(new) == 256 and set(new) == {ids[0, -1].item()}
    assert tok.eos_token_id not in new
    text = tok.decode(new)
    assert "</tool_call>" not in text and "</answer>" not in text
    # without min_new_tokens it does not stop either
    free = model.generate(ids, do_sample=True, temperature=1.0, max_new_tokens=128)
    assert free.shape[1] - ids.shape[1] == 128


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
