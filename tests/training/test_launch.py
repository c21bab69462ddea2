"""The verl command of a training job, composed from the workflow config: override rendering and
layering, and a dry run of the launch for every variant (Hydra composition + verl's validation,
and once through the real entry point's --validate-only)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from spader.integrations.verl.hydra import hydra_value
from spader.integrations.verl.overrides import training_overrides
from spader.methods import verl_yaml
from spader.training.checkpoints import Checkpoint
from spader.training.launch import (
    compose_config,
    job_overrides,
    merge_overrides,
    override_key,
)
from spader.training.lineage import RunLink
from spader.training.run import TrainJob, plan_launch
from spader.training.scorer_launch import judge_params

REPO = Path(__file__).resolve().parents[2]
VARIANTS = list(yaml.safe_load((REPO / "config" / "config.yaml").read_text())["variants"])
_PARSER = OverridesParser.create()


def _round_trip(text: str):
    value = _PARSER.parse_override(f"k={hydra_value(text)}").value()
    return OmegaConf.create({"k": value}).k


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=24))
def test_hydra_value_round_trips_any_string(text):
    assume("${" not in text)
    assert _round_trip(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "/work/results/qwen3_8b/train/spader/work/checkpoints",
        "sqlite:////abs/results/mlflow/mlflow.db",
        "/data/my models/it's here",  # space and quote
        "C:\\path\\ends\\",  # backslashes, one before the closing quote
        "1e-5",  # would read as a float
        "null",
        "a,b=[c]",
        "",
    ],
)
def test_hydra_value_round_trips_paths_and_lookalikes(text):
    assert _round_trip(text) == text


def test_hydra_value_types_and_refusals():
    assert [hydra_value(v) for v in (True, None, 3, 1e-05, ["console", "mlflow"])] == [
        "true",
        "null",
        "3",
        "1e-05",
        "[console,mlflow]",
    ]
    with pytest.raises(ValueError, match="interpolation"):
        hydra_value("/x/${oc.env:HOME}")
    with pytest.raises(ValueError):
        hydra_value(float("nan"))


def test_later_layers_replace_keys():
    merged = merge_overrides(
        ["trainer.save_freq=100", "++algorithm.spader.beta=4.0", "data.train_batch_size=32"],
        ["trainer.save_freq=1", "algorithm.spader.beta=0.0"],
        ["+trainer.total_training_steps=2"],
    )
    assert merged == [
        "data.train_batch_size=32",
        "trainer.save_freq=1",
        "algorithm.spader.beta=0.0",
        "+trainer.total_training_steps=2",
    ]
    assert override_key("++a.b=1") == "a.b" and override_key("~a.b") == "a.b"


def test_training_overrides_cover_every_mapped_key(paper_config):
    from spader.integrations.verl.overrides import TRAINING_KEYS

    ov = dict(o.split("=", 1) for o in training_overrides(paper_config["training"]))
    policy_loss = "actor_rollout_ref.actor.policy_loss.loss_mode"  # training.policy_ratio, through a mapping
    assert set(ov) == {*TRAINING_KEYS.values(), policy_loss} and ov[policy_loss] == "vanilla"
    assert ov["actor_rollout_ref.actor.optim.lr"] == "1e-05"
    assert ov["actor_rollout_ref.rollout.n"] == "16"
    broken = {k: v for k, v in paper_config["training"].items() if k != "rollout_n"}
    with pytest.raises(KeyError, match="training.rollout_n"):
        training_overrides(broken)


def test_job_overrides_are_absolute_and_forward_tracking_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {
        "MLFLOW_TRACKING_URI": "sqlite:////x/mlflow.db",
        "MLFLOW_RUN_ID": "r1",
        "VERL_FILE_LOGGER_PATH": "/x/m.jsonl",
    }
    ov = job_overrides(
        train_file="d/train.parquet",
        val_file="d/val.parquet",
        model_dir="m",
        gpus=8,
        ray_cpus=64,
        ckpt_dir="w/checkpoints",
        tool_config="w/tool.yaml",
        project="spader",
        run_name="qwen3_8b-spader",
        loggers=["console", "file", "mlflow"],
        env={**env, "PYTHONUNBUFFERED": "1"},
    )
    values = {override_key(o): o.split("=", 1)[1] for o in ov}
    assert values["data.train_files"] == str(tmp_path / "d" / "train.parquet")
    assert values["trainer.default_local_dir"] == str(tmp_path / "w" / "checkpoints")
    assert values["trainer.n_gpus_per_node"] == "8" and values["trainer.nnodes"] == "1"
    assert values["ray_kwargs.ray_init.num_cpus"] == "64"
    assert values["ray_kwargs.ray_init.address"] == "local"
    assert values["ray_kwargs.ray_init.include_dashboard"] == "false"
    for name, value in env.items():
        assert values[f"ray_kwargs.ray_init.runtime_env.env_vars.{name}"] == value
    assert "ray_kwargs.ray_init.runtime_env.env_vars.PYTHONUNBUFFERED" not in values


def _job(config: dict, variant: str, tmp_path: Path, model_dir: Path) -> TrainJob:
    return TrainJob(
        backbone="qwen3_8b",
        variant=variant,
        backbone_spec=config["backbones"]["qwen3_8b"],
        variant_spec=config["variants"][variant],
        training=config["training"],
        retrieval=config["retrieval"],
        train_file=tmp_path / "results/paper/data/verl/train.parquet",
        val_file=tmp_path / "results/paper/data/verl/val.parquet",
        index_dir=tmp_path / "results/paper/index/bm25",
        model_dir=model_dir,  # the tiny model stands in for Qwen3-8B: verl reads its config.json
        verl_config_dir=REPO / "config" / "verl",
        workdir=tmp_path / f"results/qwen3_8b/train/{variant}/work",
        final_json=tmp_path / f"results/qwen3_8b/train/{variant}/final.json",
        threads=64,
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
        # what the step scorers add (tests/scorers): StepSearch's evidence, R3-RAG's judge
        evidence=tmp_path / "results/paper/data/evidence/train.jsonl",
        stepsearch=config["stepsearch"],
        judge=judge_params(config["variants"][variant], config["judge"]),
    )


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_composed_command_of_each_variant(variant, paper_config, tiny_model, tmp_path):
    from spader.methods import advantage_spec

    job = _job(paper_config, variant, tmp_path, tiny_model)
    spec, training = paper_config["variants"][variant], paper_config["training"]
    metrics = job.metrics_dir / "attempt_001.jsonl"
    plan = plan_launch(job, resume_from=None, metrics_file=metrics, link=RunLink("run123", job.tracking_uri))
    assert plan.argv[:7] == [
        sys.executable,
        "-m",
        "spader.integrations.verl.main",
        "--config-path",
        str(REPO / "config" / "verl"),
        "--config-name",
        verl_yaml(spec),
    ]
    assert plan.env["MLFLOW_RUN_ID"] == "run123" and plan.env["VERL_FILE_LOGGER_PATH"] == str(metrics)

    cfg = compose_config(plan)  # Hydra composition + verl's validate_config + the plug-in registries
    assert cfg.algorithm.adv_estimator == advantage_spec(spec["advantage"]).estimator
    if spec["advantage"] in ("spa", "grpo_return"):
        assert (cfg.algorithm.spader.alpha, cfg.algorithm.spader.beta, cfg.algorithm.spader.cost) == (
            spec["alpha"],
            spec["beta"],
            spec["cost"],
        )
        assert cfg.algorithm.gamma == training["gamma"]
    assert cfg.data.train_files == str(job.train_file) and cfg.data.val_files == str(job.val_file)
    assert cfg.actor_rollout_ref.model.path == str(tiny_model)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 8 - job.scorer.judge_gpus)
    assert list(cfg.trainer.logger) == ["console", "file", "mlflow"]
    assert cfg.trainer.default_local_dir == str(job.ckpt_dir)
    assert cfg.trainer.resume_mode == "disable"
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq, cfg.trainer.total_epochs) == (
        training["save_freq"],
        training["test_freq"],
        training["epochs"],
    )
    assert cfg.trainer.experiment_name == f"qwen3_8b-{variant}"
    assert cfg.actor_rollout_ref.actor.optim.lr == training["lr"]
    assert cfg.actor_rollout_ref.rollout.n == training["rollout_n"]
    assert cfg.data.train_batch_size == training["train_batch_size"]
    assert cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path == str(job.tool_config)
    assert cfg.ray_kwargs.ray_init.num_cpus == 64
    env_vars = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars.MLFLOW_RUN_ID == "run123" and env_vars.MLFLOW_TRACKING_URI == job.tracking_uri


@pytest.mark.slow
def test_resume_and_extra_overrides_compose(paper_config, tiny_model, tmp_path):
    job = _job(paper_config, "grpo", tmp_path, tiny_model)
    job.extra_overrides = ("trainer.total_training_steps=2", "trainer.save_freq=1")
    ckpt = Checkpoint(200, job.ckpt_dir / "global_step_200")
    plan = plan_launch(
        job, resume_from=ckpt, metrics_file=job.metrics_dir / "a.jsonl", link=RunLink(None, None)
    )
    cfg = compose_config(plan)
    assert cfg.trainer.resume_mode == "resume_path"
    assert cfg.trainer.resume_from_path == str(ckpt.path)
    assert cfg.trainer.total_training_steps == 2 and cfg.trainer.save_freq == 1
    assert list(cfg.trainer.logger) == ["console", "file"]  # no MLflow run: verl gets no mlflow logger
    assert "MLFLOW_RUN_ID" not in plan.env
    assert sum(1 for o in plan.overrides if override_key(o) == "trainer.save_freq") == 1


@pytest.mark.slow
def test_entry_point_accepts_the_composed_command(paper_config, tiny_model, tmp_path):
    """The exact argv, run through the real entry point up to verl's config validation."""
    job = _job(paper_config, "spader", tmp_path, tiny_model)
    plan = plan_launch(
        job, resume_from=None, metrics_file=job.metrics_dir / "a.jsonl", link=RunLink(None, None)
    )
    argv = [*plan.argv[:3], "--validate-only", *plan.argv[3:]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()  # verl prints a line or two before the YAML
    start = next(i for i, line in enumerate(lines) if re.match(r"^\w+:( |$)", line))
    resolved = yaml.safe_load("\n".join(lines[start:]))
    assert resolved["algorithm"]["adv_estimator"] == "spader_spa"
    assert resolved["trainer"]["default_local_dir"] == str(job.ckpt_dir)
    assert resolved["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["VERL_USE_EXTERNAL_MODULES"]


def test_ray_gets_the_cpus_verls_placement_needs_whatever_the_cores(paper_config, tmp_path):
    """A GPU job given few cores (`--cores 4`) still advertises what verl's placement holds: 3
    CPUs per GPU, TransferQueue's controller and 8 storage units, the rollout servers."""
    from spader.training.launch import ray_cpu_slots

    job = _job(paper_config, "spader", tmp_path, tmp_path / "model")
    job.threads = 4
    plan = plan_launch(job, resume_from=None, metrics_file=tmp_path / "m.jsonl", link=RunLink(None, None))
    assert plan.get("ray_kwargs.ray_init.num_cpus") == "42" == str(3 * 8 + 1 + 8 + 8 + 1)
    assert ray_cpu_slots(workers=8, storage_units=8, threads=96) == 96  # more cores: all of them


def test_single_node_ray_is_private_without_dashboard_and_the_stop_request_reaches_verl(
    paper_config, tmp_path
):
    job = _job(paper_config, "spader", tmp_path, tmp_path / "model")
    plan = plan_launch(job, resume_from=None, metrics_file=tmp_path / "m.jsonl", link=RunLink(None, None))
    assert plan.get("ray_kwargs.ray_init.address") == "local"
    assert plan.get("ray_kwargs.ray_init.include_dashboard") == "false"
    assert plan.env["SPADER_STOP_REQUEST"] == str(job.stop_file)
    assert plan.get("ray_kwargs.ray_init.runtime_env.env_vars.SPADER_STOP_REQUEST") == str(job.stop_file)


def test_multi_node_jobs_join_a_cluster_and_train_on_every_node(paper_config, tmp_path):
    training = {**paper_config["training"], "nodes": 2}
    job = _job({**paper_config, "training": training}, "spader", tmp_path, tmp_path / "model")
    plan = plan_launch(job, resume_from=None, metrics_file=tmp_path / "m.jsonl", link=RunLink(None, None))
    assert plan.get("trainer.nnodes") == "2" and plan.get("trainer.n_gpus_per_node") == "8"
    assert plan.get("ray_kwargs.ray_init.num_cpus") == "null"  # the cluster's nodes declare theirs
    job.ray_address = "10.0.0.1:6379"
    plan = plan_launch(job, resume_from=None, metrics_file=tmp_path / "m.jsonl", link=RunLink(None, None))
    assert plan.get("ray_kwargs.ray_init.address") == "10.0.0.1:6379"


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)


def test_the_allocations_nodes_come_from_the_controller_not_from_the_step(tmp_path, monkeypatch):
    """Inside the step Snakemake's SLURM executor starts (`srun -n1` after dropping the job's
    variables) SLURM_JOB_NODELIST names the step's one node; the job's own record names all.
    (FAKE squeue and scontrol, answering as SLURM 22.05 did for a two-node job.)"""
    from spader.training.ray_cluster import slurm_nodes

    bin_dir = tmp_path / "bin"
    _fake_tool(bin_dir, "squeue", '[ "$3" = 7 ] && echo "gpu[1-2]"\n')
    _fake_tool(
        bin_dir, "scontrol", 'case "$3" in "gpu[1-2]") printf "gpu1\\ngpu2\\n";; *) echo "$3";; esac\n'
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert slurm_nodes({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu1"}) == ["gpu1", "gpu2"]
    # without an answer from the controller, the environment's list
    assert slurm_nodes({"SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "gpu1"}) == ["gpu1"]


def test_a_worker_node_that_fails_to_start_is_started_again(tmp_path, monkeypatch):
    """A worker node's `ray start` that exits while the cluster starts (Ray's raylet exits when its
    agents are slow to start) is replaced by a new start; without a replacement the start fails.
    (FAKE `ray status`, listing two nodes.)"""
    from spader.training import ray_cluster

    _fake_tool(tmp_path / "bin", "ray", 'echo " 1 node_a"; echo " 1 node_b"\n')
    monkeypatch.setattr(ray_cluster, "_ray_executable", lambda: [str(tmp_path / "bin" / "ray")])
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    failed.wait()
    again = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    procs = [failed]
    try:
        ray_cluster.wait_for_nodes("x:1", 2, {}, 30, procs, restart=lambda i: again)
        assert procs == [again]
    finally:
        again.kill()
    with pytest.raises(RuntimeError, match="exited with code 1 while the cluster started"):
        ray_cluster.wait_for_nodes("x:1", 2, {}, 30, [failed], restart=lambda i: None)
    # the error quotes the end of the node's log: SLURM's refusal of its step, say
    refusal = "srun: error: Unable to create step for job 1: Invalid generic resource (gres) specification"
    (tmp_path / "ray_b.log").write_text(
        f"srun: error: Step requested GRES but job doesn't have GRES\n{refusal}\n"
    )
    with pytest.raises(RuntimeError, match=re.escape(f"{tmp_path / 'ray_b.log'}: {refusal})")):
        ray_cluster.wait_for_nodes(
            "x:1", 2, {}, 30, [failed], restart=lambda i: None, logs=[tmp_path / "ray_b.log"]
        )


def test_r3rag_on_two_nodes_serves_its_judge_on_the_second_and_trains_on_the_first(paper_config, tmp_path):
    training = {**paper_config["training"], "nodes": 2}
    job = _job({**paper_config, "training": training}, "r3rag", tmp_path, tmp_path / "model")
    assert job.judge_node and job.train_nodes == 1
    plan = plan_launch(job, resume_from=None, metrics_file=tmp_path / "m.jsonl", link=RunLink(None, None))
    assert plan.get("trainer.nnodes") == "1" and plan.get("trainer.n_gpus_per_node") == "8"
    # the same with variants.r3rag.nodes alone (the other variants' jobs stay on one node)
    variants = {**paper_config["variants"], "r3rag": {**paper_config["variants"]["r3rag"], "nodes": 2}}
    job = _job({**paper_config, "variants": variants}, "r3rag", tmp_path, tmp_path / "model")
    assert job.training.nodes == 2 and job.judge_node and job.train_nodes == 1
    assert not _job({**paper_config, "variants": variants}, "spader", tmp_path, tmp_path / "model").judge_node


def _routable_ipv4() -> str | None:
    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not a.address.startswith("127."):
                return a.address
    return None


@pytest.mark.slow
def test_a_judge_on_a_node_of_its_own_is_started_there_bound_to_the_shared_address(paper_config, tmp_path):
    """The judge of a two-node r3rag job runs through the node's launcher (``srun --nodelist``; here
    a stand-in prefix that marks the process), binds the node's shared address, not loopback or
    every interface, and leaves verl all GPUs of its node. The server stands in for sglang."""
    import psutil

    from spader.scorers.judge import JUDGE_KEY_ENV, JudgeClient
    from spader.training.ray_cluster import srun_on
    from spader.training.scorer_launch import JudgeNode, judge_endpoint, scorer_launch

    address = _routable_ipv4()
    if address is None:
        pytest.skip("no non-loopback IPv4 address on this machine")
    assert srun_on("node-b", gpus=1)[-4:] == [
        "--overlap",
        "--kill-on-bad-exit=1",
        "--cpu-bind=cores",
        "--gres=gpu:1",
    ]
    judge = {**paper_config["judge"], "url": None}
    launch = scorer_launch(paper_config["variants"]["r3rag"], judge=judge)
    node = JudgeNode("node-b", address, ("env", "SPADER_JUDGE_NODE=node-b"), ("0",))
    server = REPO / "tests" / "support" / "openai_test_server.py"
    command = [sys.executable, str(server), "--host", "{host}", "--port", "{port}", "--api-key", "{api_key}",
               "--served-name", str(judge["model"]), "--reply", "Relevance: 0.5"]  # fmt: skip
    with judge_endpoint(
        launch, judge, model_dir=tmp_path, training_gpus=8, environ={"CUDA_VISIBLE_DEVICES": "0,1"},
        log_path=tmp_path / "judge.log", command=command, node=node,
    ) as (overrides, env):  # fmt: skip
        (url,) = [o.split("=", 1)[1] for o in overrides if o.startswith("++algorithm.r3rag.judge.url=")]
        assert url.startswith(f"http://{address}:")
        assert "CUDA_VISIBLE_DEVICES" not in env  # verl keeps its node's GPUs
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        listeners = [
            c for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port
        ]
        assert [c.laddr.ip for c in listeners] == [address]
        proc = psutil.Process(listeners[0].pid)
        assert proc.environ().get("SPADER_JUDGE_NODE") == "node-b"  # started through the launcher
        assert proc.environ().get("CUDA_VISIBLE_DEVICES") == "0"  # the judge node's own GPU
        with JudgeClient(url, str(judge["model"]), timeout=10, retries=0, concurrency=1,
                         max_tokens=8, temperature=0.0, unparsable="zero",
                         api_key=env[JUDGE_KEY_ENV]) as client:  # fmt: skip
            client.check()


def test_terminal_reward_variants_train_with_the_projects_drop_in_for_verls_sync_mode(paper_config, tmp_path):
    """verl's plain `sync` mode saves before it logs and ignores stop requests; grpo and ppo get the
    project's drop-in, which does both (spader.integrations.verl.trainer.PlainTrainerSync)."""
    from spader.integrations.verl.trainer import PLAIN_MODE
    from spader.training.launch import PLAIN_TRAINER_MODE

    assert PLAIN_TRAINER_MODE == PLAIN_MODE
    for variant in ("grpo", "ppo"):
        job = _job(paper_config, variant, tmp_path, tmp_path / "model")
        plan = plan_launch(job, resume_from=None, metrics_file=tmp_path / "m.jsonl", link=RunLink(None, None))
        assert plan.get("trainer.v1.trainer_mode") == PLAIN_MODE
