"""The CPU platform, engines and rollout backend as verl's registries see them, and the launch of
a CPU run: what training.device selects, checked by Hydra and verl's own config validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spader.config import TrainingConfig
from spader.integrations.verl.device import check_device, device_overrides
from spader.training.launch import cpu_ray_slots, device_env

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import json, os
import verl  # loads the spader plug-in (VERL_USE_EXTERNAL_MODULES)
import torch.distributed as dist
from verl.plugin.platform import get_platform
from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device
from verl.workers.engine.base import EngineRegistry
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import RolloutReplicaRegistry
dev = get_torch_device()
print(json.dumps({
    "device": get_device_name(), "backend": get_nccl_backend(),
    "resource": get_platform().ray_resource_name(),
    "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
    "critic": EngineRegistry.get_engine_cls("value_model", "fsdp2").__name__,
    "adapter": get_rollout_class("transformers", "async").__name__,
    "replica": RolloutReplicaRegistry.get("transformers").__name__,
    "memory": get_device_name() == "cpu" and [dev.memory_allocated(), dev.mem_get_info()[1] > 0, dev.empty_cache()],
    "group": dist.is_initialized() and [dist.get_backend(), dist.get_rank(), dist.get_world_size()],
}))
"""


def _probe(env: dict) -> dict:
    full = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "spader.integrations.verl.plugin", **env}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], env=full, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_verl_resolves_the_cpu_platform_engines_and_rollout_from_the_plugin(tmp_path):
    # a worker-group process of a CPU run (verl sets these variables): its gloo group exists
    # before verl's own initialisation, which would ask torch for "cpu:gloo,cpu:gloo"
    worker = {"VERL_PLATFORM": "cpu", "WG_BACKEND": "ray", "RANK": "0", "WORLD_SIZE": "1",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29581"}  # fmt: skip
    got = _probe(worker)
    assert (got["device"], got["backend"], got["resource"]) == ("cpu", "gloo", "GPU")
    assert (got["engine"], got["critic"]) == ("FSDPEngineWithLMHead", "FSDPEngineWithValueHead")
    assert (got["adapter"], got["replica"]) == ("TransformersServerAdapter", "TransformersReplica")
    assert got["memory"] == [0, True, None]
    assert got["group"] == ["gloo", 0, 1]
    # never auto-detected; a process outside a worker group gets no process group
    assert _probe({"VERL_PLATFORM": "", "WG_BACKEND": ""})["device"] != "cpu"
    assert _probe({"VERL_PLATFORM": "cpu", "WG_BACKEND": ""})["group"] is False


def test_device_and_rollout_backend_must_agree():
    assert check_device(TrainingConfig()) == ("cuda", "sglang")  # the defaults
    assert check_device({"device": "cpu", "rollout_backend": "transformers"}) == ("cpu", "transformers")
    with pytest.raises(ValueError, match="'training.rollout_backend' is 'sglang'.*'cpu'"):
        check_device({"device": "cpu", "rollout_backend": "sglang"})
    with pytest.raises(ValueError, match="'training.rollout_backend' is 'transformers'.*'cuda'"):
        check_device({"device": "cuda", "rollout_backend": "transformers"})
    with pytest.raises(ValueError, match="'training.device' must be one of"):
        check_device({"device": "tpu", "rollout_backend": "sglang"})


def test_ray_advertises_the_logical_cpus_verl_reserves():
    # verl: a 3-CPU bundle per worker; TransferQueue: controller + 1 storage unit; 1 rollout server
    # per worker. With 2 cores advertised, these actors would never be scheduled.
    assert cpu_ray_slots(1, 2) == 7
    assert cpu_ray_slots(2, 2) == 11
    assert cpu_ray_slots(1, 32) == 32


def test_only_the_device_rollout_backend_and_sizes_differ_from_a_gpu_launch():
    cpu = TrainingConfig(device="cpu", rollout_backend="transformers", max_steps=3).model_dump()
    gpu = device_overrides(TrainingConfig(max_steps=3), threads=8, workers=8)
    assert gpu == [
        "trainer.device=cuda",
        "actor_rollout_ref.rollout.name=sglang",
        "trainer.total_training_steps=3",
        "trainer.total_epochs=3",
    ]
    ov = device_overrides(cpu, threads=2, workers=1)
    assert ov[:4] == [
        "trainer.device=cpu",
        "actor_rollout_ref.rollout.name=transformers",
        "trainer.total_training_steps=3",
        "trainer.total_epochs=3",
    ]
    keys = {o.split("=", 1)[0].lstrip("+") for o in ov}
    # nothing of the method: no estimator, reward, trainer mode, KL or batch size
    assert not any(k.startswith(("algorithm.", "reward.custom", "trainer.v1")) for k in keys)
    assert "transfer_queue.backend.SimpleStorage.num_data_storage_units" in keys
    assert device_env(cpu, threads=2, workers=1) == {"VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "2"}
    assert device_env(TrainingConfig(), threads=8, workers=8) == {"VERL_PLATFORM": "nvidia"}


@pytest.mark.slow
def test_the_cpu_launch_composes_and_passes_verls_validation(tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "support"))
    from cpu_world import cpu_training

    from spader.training.checkpoints import new_metrics_file
    from spader.training.launch import compose_config
    from spader.training.lineage import RunLink
    from spader.training.run import TrainJob, plan_launch

    job = TrainJob(
        backbone="demo",
        variant="spader",
        backbone_spec={"model": "tiny:qwen3", "gpus": 0, "variants": ["spader"], "prompting": []},
        variant_spec={
            "advantage": "spa",
            "reward": "step",
            "alpha": 1.0,
            "beta": 4.0,
            "cost": 0.01,
            "verl_config": "spader",
        },
        training=cpu_training(cpu_workers=2),
        retrieval={},
        train_file=tmp_path / "t.parquet",
        val_file=tmp_path / "v.parquet",
        index_dir=tmp_path / "index",
        model_dir=tmp_path / "model",
        verl_config_dir=REPO / "config" / "verl",
        workdir=tmp_path / "work",
        final_json=tmp_path / "final.json",
        threads=2,
    )
    plan = plan_launch(
        job, resume_from=None, metrics_file=new_metrics_file(job.metrics_dir), link=RunLink(None, None)
    )
    assert plan.env["VERL_PLATFORM"] == "cpu"
    cfg = compose_config(plan)
    assert (cfg.trainer.device, cfg.trainer.n_gpus_per_node, cfg.actor_rollout_ref.rollout.name) == (
        "cpu",
        2,
        "transformers",
    )
    assert (cfg.ray_kwargs.ray_init.num_cpus, cfg.ray_kwargs.ray_init.num_gpus) == (cpu_ray_slots(2, 2), 2)
    assert cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    assert cfg.actor_rollout_ref.ref.fsdp_config.forward_only is False
    assert cfg.actor_rollout_ref.ref.optim.lr == cfg.actor_rollout_ref.actor.optim.lr
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    # the method is the GPU run's: estimator, trainer mode, KL
    assert (cfg.algorithm.adv_estimator, cfg.trainer.v1.trainer_mode) == ("spader_spa", "spader_sync")
    assert cfg.actor_rollout_ref.actor.use_kl_loss and cfg.actor_rollout_ref.actor.kl_loss_coef == 0.001
