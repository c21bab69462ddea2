"""scripts/gpu_smoke.sh on CPU: the command it composes (the train_policy command plus the smoke
overrides, checked by Hydra and verl), the inputs it builds, its policy, the checks it makes of a
finished run (on synthetic metrics here; on a real CPU training in
tests/cpu_training/test_update_direction.py), and the script itself."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from spader.config import resolved_config
from spader.training.launch import compose_config, override_key
from spader.training.lineage import RunLink
from spader.training.run import plan_launch
from spader.training.smoke import (
    SMOKE_AGENT,
    SMOKE_OVERRIDES,
    SMOKE_TRAINING,
    main,
    prepare_command,
    smoke_job,
)

REPO = Path(__file__).resolve().parents[2]
DEMO = [REPO / "config" / "config.yaml", REPO / "config" / "demo.yaml"]


@pytest.fixture
def smoke_root(tmp_path, tiny_model) -> Path:
    """A project root with the repository's config, the tiny model where the workflow builds it and,
    standing in for the demo's warm start (rule warmstart_policy, minutes), the same tiny model."""
    os.symlink(REPO / "config", tmp_path / "config")
    os.symlink(REPO / "workflow", tmp_path / "workflow")
    (tmp_path / "results" / "models" / "tiny").mkdir(parents=True)
    os.symlink(tiny_model, tmp_path / "results" / "models" / "tiny" / "qwen3")
    (tmp_path / "results" / "demo" / "warmstart").mkdir(parents=True)
    os.symlink(tiny_model, tmp_path / "results" / "demo" / "warmstart" / "model")
    return tmp_path


def _plan(job):
    return plan_launch(
        job, resume_from=None, metrics_file=job.metrics_dir / "attempt_001.jsonl", link=RunLink(None, None)
    )


@pytest.mark.slow
def test_smoke_command_trains_on_the_gpu_with_sglang_at_the_paper_length(smoke_root):
    """The demo config trains on the CPU with the transformers replica; the smoke job composes
    verl's GPU platform, sglang, the paper config's response length and the packed actor path."""
    import dataclasses

    from spader.integrations.verl.device import device_overrides
    from spader.integrations.verl.overrides import AGENT_KEYS, TRAINING_KEYS, actor_path_overrides
    from spader.integrations.verl.packed_attention import NAME

    config = resolved_config(*DEMO, verl_config_dir=REPO / "config" / "verl")
    assert (config["training"]["device"], config["training"]["rollout_backend"]) == ("cpu", "transformers")
    paper = resolved_config(REPO / "config" / "config.yaml", verl_config_dir=REPO / "config" / "verl")[
        "training"
    ]["max_response_length"]
    job = smoke_job(config, smoke_root / "results" / "gpu_smoke", root=smoke_root, threads=4)
    plan = _plan(job)
    assert plan.env["VERL_PLATFORM"] == "nvidia"
    cfg = compose_config(plan)
    assert (cfg.trainer.device, cfg.actor_rollout_ref.rollout.name) == ("cuda", "sglang")
    assert cfg.data.max_response_length == paper == 8192
    assert cfg.data.max_prompt_length == SMOKE_TRAINING["max_prompt_length"]
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 2
    # the demo's turn: its cap and stop tags, which the warm-started policy ends its turns on
    assert OmegaConf.select(cfg, "spader_agent.max_turn_tokens") == config["agent"]["max_turn_tokens"]
    assert list(OmegaConf.select(cfg, "spader_agent.stop")) == ["</tool_call>", "</answer>"]
    assert cfg.trainer.total_training_steps == 2
    assert (cfg.trainer.n_gpus_per_node, cfg.actor_rollout_ref.rollout.tensor_model_parallel_size) == (1, 1)
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n, cfg.trainer.save_freq) == (4, 4, 1)
    # the packed path with token-capped micro-batches (two of the longest sequences)
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == NAME
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is True
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 2 * (2048 + 8192)
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
        | {override_key(o) for o in actor_path_overrides(job.training.model_dump())}
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
    assert "packed sequences" in checks["actor_path"] and "spader_varlen" in checks["actor_path"]
    assert any("the seeds sglang reports" in line for line in checks["after_the_run"])
    # the smoke policy was built from the warm start, so the dry run plans the job's memory too
    assert (out / "policy" / "config.json").is_file()
    assert any("train smoke/spader" in line and "fits" in line for line in checks["memory_plan"])


def test_the_smoke_policy_is_the_warm_start_with_its_head_untied(tiny_model, tmp_path):
    """The same function as the warm start (equal logits), with the output projection a parameter
    of its own, as FSDP2 shards it for the 8B backbones."""
    import torch
    from transformers import AutoModelForCausalLM

    from spader.training.smoke import build_smoke_policy

    policy = AutoModelForCausalLM.from_pretrained(build_smoke_policy(tiny_model, tmp_path / "policy"))
    warm = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert warm.config.tie_word_embeddings is True and policy.config.tie_word_embeddings is False
    assert policy.lm_head.weight.data_ptr() != policy.get_input_embeddings().weight.data_ptr()
    ids = torch.tensor([[5, 17, 99, 3]])
    assert torch.allclose(policy(ids).logits, warm(ids).logits, atol=1e-6)


def _step(searches=1.0, closed=0.5, cut=0.0, lo=-1.0, hi=0.5, std=0.7, seeds=(1.0, 1.0, 1.0), errors=0.0,
          entities=1.0, calls=0.0):  # fmt: skip
    return {
        "critic/score/mean": (lo + hi) / 2, "critic/score/min": lo, "critic/score/max": hi,
        "episode/searches": searches, "episode/searches_answered": searches - errors / 2,
        "episode/search_errors": errors, "episode/call_errors": calls, "episode/entities": entities,
        "episode/turns_closed": closed, "episode/turns_cut": cut,
        "episode/advantage_std": std, "episode/rollout_seed_min": seeds[0], "episode/rollout_seed_max": seeds[1],
        "episode/rollout_seeds": seeds[2],
    }  # fmt: skip


def test_the_checks_fail_on_a_run_that_does_not_search_or_stop(tmp_path):
    """check_run on metrics written as verl's file logger writes them (no training here: the real
    run's checks pass in tests/cpu_training/test_update_direction.py)."""
    from types import SimpleNamespace

    from spader.training.smoke import check_run

    metrics = tmp_path / "metrics"
    metrics.mkdir()
    bad = {1: _step(), 2: _step(searches=0.0, cut=0.25, lo=0.5, std=0.0, seeds=(1.0, 2.0, 2.0))}
    with open(metrics / "attempt_001.jsonl", "w") as f:
        for step, data in bad.items():
            f.write(json.dumps({"step": step, "data": data}) + "\n")
    job = SimpleNamespace(
        metrics_dir=metrics, training=SimpleNamespace(seed=1), final_json=tmp_path / "final.json",
        service_log=tmp_path / "retrieval_service.log",
    )  # fmt: skip
    results = {r.name: r for r in check_run(job, start_model=tmp_path, replicas=1)}
    assert results["steps"].ok
    failed = {name for name, r in results.items() if not r.ok}
    assert failed == {
        "searches answered", "turns end at a closing tag", "rewards differ", "advantages", "rollout seeds",
        "service answered", "weights changed",
    }  # fmt: skip
    assert "step 2: 0.00 answered of 0.00 per trajectory" in results["searches answered"].detail
    assert "no counters of the retrieval service" in results["service answered"].detail
    assert "25% run past the tag" in results["turns end at a closing tag"].detail
    assert "2 seed(s) 1..2 (expected 1: 1..1)" in results["rollout seeds"].detail
    assert results["rollout seeds"].line().startswith("FAIL")
    # two replicas: seeds 1 and 2 are what is expected
    two = {r.name: r for r in check_run(job, start_model=tmp_path, replicas=2)}
    assert not two["rollout seeds"].ok  # step 1 reported one seed only


def _write_steps(metrics, steps):
    metrics.mkdir(exist_ok=True)
    with open(metrics / "attempt_001.jsonl", "w") as f:
        for step, data in steps.items():
            f.write(json.dumps({"step": step, "data": data}) + "\n")


def test_the_search_checks_fail_on_a_run_whose_searches_all_fail(tmp_path):
    """Every search of the run returned an error observation (a service down, parse errors): step
    records exist, so ``episode/searches`` is 1 per trajectory, but none was answered, no entity
    found, and the service counted failed queries. The search checks pass on a healthy run."""
    from types import SimpleNamespace

    from spader.training.smoke import check_run

    job = SimpleNamespace(
        metrics_dir=tmp_path / "metrics", training=SimpleNamespace(seed=1), final_json=tmp_path / "final.json",
        service_log=tmp_path / "retrieval_service.log",
    )  # fmt: skip
    checks = ("searches answered", "service answered")
    stats = tmp_path / "retrieval_service_stats.json"

    _write_steps(job.metrics_dir, {1: _step(errors=2.0, entities=0.0), 2: _step(errors=2.0, entities=0.0)})
    stats.write_text(json.dumps({"queries": 8, "failed_queries": 8}))
    results = {r.name: r for r in check_run(job, start_model=tmp_path, replicas=1)}
    assert [results[c].ok for c in checks] == [False, False]
    assert (
        "0.00 answered of 1.00 per trajectory, 2 the service failed (0 malformed call(s) of the policy), "
        "0.00 entities" in results["searches answered"].detail
    )
    assert results["service answered"].detail.startswith("8 queries, 8 failed")

    # answered searches that found nothing, or one failed step in a batch, fail too
    for bad in (_step(entities=0.0), _step(searches=2.0, errors=1.0)):
        _write_steps(job.metrics_dir, {1: _step(), 2: bad})
        assert not {r.name: r for r in check_run(job, start_model=tmp_path, replicas=1)}[checks[0]].ok

    # a malformed call of the policy is the policy's, not the service's: the run passes
    _write_steps(job.metrics_dir, {1: _step(), 2: _step(searches=2.0, calls=1.0)})
    stats.write_text(json.dumps({"queries": 8, "failed_queries": 0}))
    results = {r.name: r for r in check_run(job, start_model=tmp_path, replicas=1)}
    assert [results[c].ok for c in checks] == [True, True]


def test_two_gpus_are_used_when_visible():
    from spader.training.smoke import smoke_gpus

    assert [smoke_gpus(n) for n in (0, 1, 2, 8)] == [1, 1, 2, 2]


def test_prepare_builds_the_inputs_with_the_workflow():
    config = resolved_config(*DEMO, verl_config_dir=REPO / "config" / "verl")
    cmd = prepare_command(config, ["config/config.yaml", "config/demo.yaml"], cores=2)
    proc = subprocess.run([*cmd, "-n"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rule in ("export_rl_dataset", "build_bm25_index", "build_tiny_model", "warmstart_policy"):
        assert rule in proc.stdout
    assert "train_policy" not in proc.stdout and "evaluate_policy" not in proc.stdout


def test_script_runs_the_smoke_module():
    script = REPO / "scripts" / "gpu_smoke.sh"
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert "-m spader.training.smoke --prepare" in script.read_text()


def test_the_smoke_run_trains_the_packed_and_the_padded_path(tmp_path):
    """By default both actor paths, each in a directory of its own; --padded or --packed-only one."""
    from spader.training.smoke import _smoke_training, smoke_paths

    assert smoke_paths(tmp_path, padded=False, packed_only=False) == [
        (False, tmp_path),
        (True, tmp_path / "padded"),
    ]
    assert smoke_paths(tmp_path, padded=True, packed_only=False) == [(True, tmp_path)]
    assert smoke_paths(tmp_path, padded=False, packed_only=True) == [(False, tmp_path)]
    config = resolved_config(*DEMO, verl_config_dir=REPO / "config" / "verl")
    padded = _smoke_training(config, REPO, gpus=1, device="cuda", padded=True)
    packed = _smoke_training(config, REPO, gpus=1, device="cuda", padded=False)
    assert padded["remove_padding"] is False and packed["remove_padding"] is True
    assert packed["max_token_len_per_gpu"] and not padded.get("max_token_len_per_gpu")
