"""The GPU memory plan (spader.planning.plan): model shapes from config.json, sglang 0.5.14's
static share of the memory free at launch, the phases of a training job from its composed verl
config, the paper config fitting 80 GiB GPUs with the stated margin and failing when the
micro-batch grows; and the preflight that refuses a job that does not fit."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from spader.config import resolved_config
from spader.planning import plan
from spader.planning.plan import VerlMemory, load_shape, training_job

REPO = Path(__file__).resolve().parents[2]
#: the margin docs/gpu.md states for every paper job on an 80 GiB GPU
STATED_MARGIN_GIB = 8.0


def verl_cfg(*, micro=4, prompt=512, response=8192, fused=True, critic=False, entropy=0.0, **flags) -> dict:
    """A resolved verl config holding the keys the plan reads."""
    return {
        "data": {"max_prompt_length": prompt, "max_response_length": response, "dataloader_num_workers": 8},
        "trainer": {"save_freq": flags.get("save_freq", 100), "test_freq": 50, "val_before_train": True,
                    "max_actor_ckpt_to_keep": flags.get("keep", 2), "max_critic_ckpt_to_keep": flags.get("keep", 2)},
        "actor_rollout_ref": {
            "model": {
                "use_fused_kernels": fused,
                "fused_kernel_options": {"impl_backend": "torch"},
                "use_remove_padding": flags.get("packed", False),
                "enable_gradient_checkpointing": True,
            },
            "actor": {
                "ppo_micro_batch_size_per_gpu": micro,
                "use_dynamic_bsz": flags.get("dynamic", False),
                "ppo_max_token_len_per_gpu": 16384,
                "entropy_coeff": entropy,
                "use_kl_loss": True,
                "ppo_epochs": 1,
                "entropy_checkpointing": flags.get("entropy_checkpointing", True),
                "fsdp_config": {
                    "model_dtype": "fp32",
                    "param_offload": False,
                    "optimizer_offload": flags.get("actor_optimizer_offload", False),
                },
            },
            "ref": {"log_prob_micro_batch_size_per_gpu": micro, "fsdp_config": {"model_dtype": "fp32"}},
            "rollout": {
                "gpu_memory_utilization": flags.get("fraction", 0.6),
                "tensor_model_parallel_size": 2,
                "log_prob_micro_batch_size_per_gpu": micro,
                "free_cache_engine": True,
                "agent": {"num_workers": 8},
                "val_kwargs": {"n": 1},
            },
        },
        "critic": {
            "enable": critic,
            "ppo_micro_batch_size_per_gpu": micro,
            "fsdp": {"param_offload": flags.get("critic_offload", False), "optimizer_offload": flags.get("critic_offload", False)},
            "model": {"enable_gradient_checkpointing": True},
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    "model, params",
    [
        ("Qwen/Qwen3-8B", 8.19e9),
        ("meta-llama/Llama-3.1-8B-Instruct", 8.03e9),
        ("Qwen/Qwen2.5-14B-Instruct", 14.77e9),
        ("BAAI/bge-reranker-v2-m3", 0.568e9),
    ],
)
def test_shipped_shapes_give_the_published_parameter_counts(model, params):
    shape = load_shape(model)
    assert shape.params == pytest.approx(params, rel=0.005)
    assert json.loads(plan._shape_file(model).read_text())["_source"].startswith(
        "config.json of https://huggingface.co/"
    )


def test_a_local_config_json_wins_and_an_unknown_model_is_named(tmp_path, tiny_model):
    shape = load_shape("tiny:qwen3", tiny_model)
    assert (shape.hidden, shape.layers, shape.tied, shape.qk_norm) == (128, 2, True, True)
    with pytest.raises(ValueError, match=r"no shape for model 'org/unknown'.*Qwen/Qwen3-8B"):
        load_shape("org/unknown", tmp_path)


def test_sglang_takes_its_fraction_of_the_memory_free_at_launch():
    """0.5.14: the static share (weights + KV) is the fraction of what is free when it starts, so
    the actor's shards and the reranker already there shrink it, and Adam state created by the
    first step comes on top of it while sglang generates."""
    shape = load_shape("Qwen/Qwen3-8B")
    job = training_job("t", shape, verl_cfg(), gpus=8, capacity=80.0, reranker=4.0)
    c = plan.CONSTANTS
    actor_params = shape.params * 4 / 8 / plan.GIB
    pre = 80.0 - (c["cuda_context"] + c["nccl"]) - 4.0 - actor_params - (c["cuda_context"] + c["nccl"])
    rollout = job.phases["rollout"]
    expected_sglang = c["cuda_context"] + c["nccl"] + 0.6 * pre + c["sglang_graphs"] + c["sglang_activations"]
    assert rollout["sglang"] == pytest.approx(expected_sglang)
    assert rollout["actor (resident)"] == pytest.approx(actor_params * 3)  # fp32 weights + Adam's two moments
    more_free = training_job("t", shape, verl_cfg(), gpus=8, capacity=80.0, reranker=0.0)
    assert more_free.phases["rollout"]["sglang"] - rollout["sglang"] == pytest.approx(0.6 * 4.0)
    assert "KV" in job.notes[0] and "tokens per TP-2 replica" in job.notes[0]


def test_fused_log_probs_remove_the_full_logits():
    shape = load_shape("Qwen/Qwen3-8B")
    full = training_job("t", shape, verl_cfg(fused=False), gpus=8, capacity=80.0, reranker=4.0)
    fused = training_job("t", shape, verl_cfg(fused=True), gpus=8, capacity=80.0, reranker=4.0)
    logits = 4 * 8704 * shape.vocab * 2 / plan.GIB  # one bf16 copy of micro-batch x length x vocabulary
    assert full.phases["actor update"]["logits"] == pytest.approx(3 * logits)
    assert fused.phases["actor update"]["logits"] < 3.0
    assert full.phases["log-probs"]["logits"] == pytest.approx(3 * logits)  # the entropy's softmax
    # StepSearch's entropy term keeps its softmax unless checkpointed
    kept = training_job(
        "t", shape, verl_cfg(fused=False, entropy=0.001, entropy_checkpointing=False), gpus=8, capacity=80.0
    )
    assert kept.phases["actor update"]["logits"] == pytest.approx(5 * logits)
    assert not full.fits and fused.fits


def test_offloaded_critic_and_optimizer_leave_the_rollout_and_the_other_update():
    shape = load_shape("Qwen/Qwen3-8B")
    kept = training_job("t", shape, verl_cfg(critic=True), gpus=4, capacity=80.0, reranker=4.0)
    off = training_job("t", shape, verl_cfg(critic=True, critic_offload=True, actor_optimizer_offload=True),
                       gpus=4, capacity=80.0, reranker=4.0)  # fmt: skip
    assert (
        kept.phases["rollout"]["critic (resident)"] > 20 and off.phases["rollout"]["critic (resident)"] == 0
    )
    adam = shape.params * 8 / 4 / plan.GIB
    assert kept.phases["critic update"]["actor (resident)"] - off.phases["critic update"][
        "actor (resident)"
    ] == pytest.approx(adam)
    assert not kept.fits and off.fits  # fmt: skip
    # the update itself holds the optimizer state whatever the offload
    assert off.phases["actor update"]["actor state"] == kept.phases["actor update"]["actor state"]


def test_dynamic_batches_on_the_padded_path_are_refused():
    job = training_job("t", load_shape("Qwen/Qwen3-8B"), verl_cfg(dynamic=True), gpus=8, capacity=80.0)
    assert not job.fits and "padded tokens are not bounded" in job.refused


def test_verl_memory_reads_the_composed_paper_config():
    from paper_verl import paper_overrides

    from spader.integrations.verl.compose import compose

    cfg = compose("r3rag", [*paper_overrides("r3rag"), "actor_rollout_ref.model.path=/m"])
    from omegaconf import OmegaConf

    m = VerlMemory.from_verl(OmegaConf.to_container(cfg, resolve=True))
    assert (m.micro_batch, m.seq_len, m.fused, m.critic) == (4, 512 + 8192, True, True)
    assert (m.critic_param_offload, m.critic_optimizer_offload, m.actor_optimizer_offload) == (
        True,
        True,
        True,
    )
    assert (m.rollout_fraction, m.rollout_tp, m.param_bytes, m.remove_padding) == (0.6, 2, 4, False)


@pytest.mark.slow
def test_the_paper_config_fits_80_gib_and_a_larger_micro_batch_does_not(tmp_path):
    lines: list[str] = []
    assert plan.main(["--root", str(REPO), "--json"], out=lines.append) == 0
    result = json.loads(lines[-1])
    jobs = {j["job"]: j for j in result["jobs"]}
    config = resolved_config(REPO / "config" / "config.yaml")
    for b, spec in config["backbones"].items():
        for v in spec["variants"]:
            assert f"train {b}/{v}" in jobs
        assert f"evaluate {b}/*" in jobs
    assert "judge qwen3_8b/r3rag" in jobs and "build_evidence" in jobs
    for job in jobs.values():
        assert job["fits"] and job["peak_gib"] <= 80.0 - STATED_MARGIN_GIB, job
    # every training job: its time on both actor paths, host memory per node, disk, the request
    for name, job in jobs.items():
        if not name.startswith("train "):
            continue
        assert job["path"] == "padded" and set(job["paths"]) == {"padded", "packed"}, name
        assert (
            job["paths"]["packed"]["step_minutes"]
            < job["paths"]["padded"]["step_minutes"]
            == job["step_minutes"]
        )
        assert job["run_hours"] > job["step_minutes"] * 375 / 60, name  # 375 steps, plus validation
        assert job["host_gib"] <= job["host_capacity_gib"] and job["disk_gib"] <= job["disk_capacity_gib"], (
            name
        )
        assert "reference model (pinned)" in job["host_terms"]["training"], name
        assert job["threads"] == 64 and job["mem_mb"] >= job["host_gib"] * 1024, name
    # 17 training jobs, 15 runs: Qwen3-8B's beta_0 and beta_4 share no_np's and spader's runs
    assert sum(n.startswith("train ") for n in jobs) == 17 and result["dag"]["training_runs"] == 15

    overlay = tmp_path / "small.yaml"
    overlay.write_text(
        "training:\n  ppo_micro_batch_size_per_gpu: 8\nhardware:\n  host_memory_gib: 128\n  disk_gib: 300\n"
    )
    lines.clear()
    code = plan.main(
        ["--root", str(REPO), "--configfile", str(overlay)], out=lines.append
    )  # overlays config.yaml
    assert code == 1
    text = "\n".join(lines)
    assert "train qwen3_8b/r3rag" in text and "DOES NOT FIT" in text
    assert "refused: host memory: needs" in text and "hardware.host_memory_gib is 128" in text
    assert "refused: disk: needs" in text and "hardware.disk_gib is 300" in text
    assert "time (padded)" in text and "host (training)" in text and "min per step" in text


# ---------------------------------------------------------------------------------------------
# Time, host memory and disk
# ---------------------------------------------------------------------------------------------
def _costs(**hardware):
    from spader.config.model import HardwareConfig
    from spader.planning.costs import Workload

    work = Workload(steps=375, prompts=32, rollouts=16, val_prompts=200, max_turns=16, nodes=1)
    return plan.JobCosts(
        hardware=HardwareConfig(**hardware), workload=work, reranker_on_gpus=True, cache_bytes=2**28
    )


def test_time_host_memory_and_disk_of_a_hand_computed_job():
    """Every term of one small job, computed here by hand from the stated model (docs/gpu.md):
    lengths all at the maximum (length_share 1), half of them generated, 2 GPUs, one TP-2 replica."""
    from spader.config.model import HardwareConfig
    from spader.planning.costs import Workload

    shape = plan.Shape(
        name="toy", vocab=1000, hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, intermediate=128
    )
    assert shape.params == 202_048  # 2 x 64,000 (embedding, head) + 2 x 36,992 (layers) + 64 (norm)
    hw = HardwareConfig(gpu="A100-80GB", mfu=0.5, bandwidth_efficiency=0.5, length_share=1.0, generated_share=0.5,
                        cores=32, gpus=8, host_memory_gib=960)  # fmt: skip
    work = Workload(steps=100, prompts=4, rollouts=2, val_prompts=2, max_turns=3, nodes=1)
    costs = plan.JobCosts(hardware=hw, workload=work, reranker_on_gpus=True, cache_bytes=2**28)
    cfg = verl_cfg(micro=2, prompt=20, response=80, save_freq=10, keep=2)
    job = training_job("t", shape, cfg, gpus=2, capacity=80.0, costs=costs)

    compute = 2 * 312e12 * 0.5  # two A100s at 0.5 MFU
    matmul = 2 * 36_992 + 64_000  # the layers and the output projection
    padded_forward = 2 * matmul * 800 + 4 * 8 * 100**2 * 64 * 2  # 8 sequences of 100; the whole square
    packed_forward = 2 * matmul * 800 + 2 * 8 * 100**2 * 64 * 2  # half of it, causal
    padded, packed = job.time["padded"]["step"], job.time["packed"]["step"]
    assert padded["old log-probs"] == pytest.approx(padded_forward / compute)
    assert padded["reference log-probs"] == pytest.approx(padded_forward / compute)
    fused_backward = 2 * 1000 * 64 * 800  # the fused kernel's logits again in the backward pass
    assert padded["actor update"] == pytest.approx((4 * padded_forward + fused_backward) / compute)
    assert packed["actor update"] == pytest.approx((4 * packed_forward + fused_backward) / compute)
    bandwidth = 2039e9 * 0.5
    decode = (50 * matmul + 8 * 0.5 * 100**2 / 2 * 256) / bandwidth  # 50 steps, each reading the weights
    prefill = 4 * (2 * matmul * 100 + 2 * 100**2 * 64 * 2) / compute
    assert padded["rollout"] == pytest.approx(decode + prefill + 3 * 0.5)
    ref_stream = 2 * 4 * shape.params / 2 / (32e9 * 0.5)  # 2 micro-batches per GPU, fp32 shards
    assert padded["host transfers"] == pytest.approx(ref_stream)
    assert padded["overhead"] == 10.0
    step = sum(padded.values())
    assert job.step_minutes() == pytest.approx(step / 60) and job.path == "padded"
    validation = (
        (50 * matmul + 2 * 0.5 * 100**2 / 2 * 256) / bandwidth
        + (2 * 2 * matmul * 100 + 2 * 100**2 * 64 * 2) / 2 / compute
        + 1.5
    )
    checkpoints = 10 * shape.params * 12 / 2e9
    expected_hours = (100 * step + 3 * validation + checkpoints) / 3600 + 10 / 60
    assert job.run_hours() == pytest.approx(expected_hours)

    gib = float(2**30)
    steady = job.host["training"]
    assert steady["reference model (pinned)"] == pytest.approx(shape.params * 4 / gib)
    assert steady["sglang weight copies (pinned)"] == pytest.approx(shape.params * 2 / gib)  # one replica
    assert steady["GPU processes"] == 5 * 3.0  # 2 verl workers, 2 sglang schedulers, the service
    assert steady["CPU processes"] == (8 + 8 + 0 + 2 + 3 + 1 + 1) * 0.5
    assert steady["retrieval service (JVM heap, cache)"] == 4.25
    assert steady["step batch"] == pytest.approx(2 * 8 * 100 * 64 / gib)
    loading = job.host["model loading"]
    assert loading["model loading (one copy per loading rank)"] == pytest.approx(shape.params * 4 / gib)
    # a toy model: loading it in fp32 (4 bytes) outweighs sglang's bf16 copy and the batch
    assert job.host_phase == "model loading" and job.host_gib == pytest.approx(sum(loading.values()))
    # 10 saves: 2 left by an earlier attempt + 2 of this one; each fp32 shards + Adam's moments
    assert job.disk_gib == pytest.approx((4 * shape.params * 12 + shape.params * 2) / gib)
    one = training_job("t", shape, verl_cfg(micro=2, prompt=20, response=80, save_freq=10, keep=1), gpus=2,
                       capacity=80.0, costs=costs)  # fmt: skip
    assert one.disk_gib == pytest.approx(
        (3 * shape.params * 12 + shape.params * 2) / gib
    )  # 1 + the new and the old
    # the scheduler request: 2 of 8 GPUs -> a quarter of the cores; the plan's need and 25% more
    assert plan.job_request(job, hw, 2) == (8, math.ceil(job.host_gib * 1.25 * 1024))


def test_the_packed_path_is_faster_than_the_padded_one_by_its_padding():
    shape = load_shape("Qwen/Qwen3-8B")
    jobs = {share: training_job("t", shape, verl_cfg(), gpus=8, capacity=80.0, costs=_costs(length_share=share))
            for share in (0.5, 0.75, 1.0)}  # fmt: skip
    for share, job in jobs.items():
        padded, packed = job.time["padded"]["step"], job.time["packed"]["step"]
        for phase in ("old log-probs", "reference log-probs", "actor update"):
            assert packed[phase] < padded[phase], (share, phase)
        assert packed["rollout"] == padded["rollout"]
        assert job.step_minutes("packed") < job.step_minutes("padded")
    # the padded tokens of a micro-batch of 4: its longest, E[max of 4] = 0.8, 0.9 and 1 x the maximum,
    # against the mean length (0.5, 0.75, 1 x); at full length only the attention square differs
    update = {s: j.time["padded"]["step"]["actor update"] / j.time["packed"]["step"]["actor update"]
              for s, j in jobs.items()}  # fmt: skip
    assert update[0.5] > update[0.75] > update[1.0] > 1.0
    assert update[0.5] > 1.6 and update[0.75] > 1.2
    packed = training_job("t", shape, verl_cfg(packed=True), gpus=8, capacity=80.0, costs=_costs())
    assert packed.path == "packed" and packed.step_minutes() == pytest.approx(
        jobs[0.5].step_minutes("packed")
    )
    assert packed.phases["actor update"]["mask"] == 0


def test_a_node_too_small_is_refused_naming_host_memory_and_disk():
    shape = load_shape("Qwen/Qwen3-8B")
    fits = training_job(
        "t", shape, verl_cfg(critic=True, critic_offload=True), gpus=8, capacity=80.0, costs=_costs()
    )
    assert fits.fits and fits.host_gib > 150 and fits.disk_gib > 600  # critic offloaded: ~250 GiB, ~720 GiB
    small = training_job("t", shape, verl_cfg(critic=True, critic_offload=True), gpus=8, capacity=80.0,
                         costs=_costs(host_memory_gib=128, disk_gib=500))  # fmt: skip
    assert not small.fits and small.peak == fits.peak  # the GPUs are not the problem
    host, disk = small.problems
    assert host.startswith("host memory: needs") and "hardware.host_memory_gib is 128" in host
    assert disk.startswith("disk: needs") and "hardware.disk_gib is 500" in disk
    text = "\n".join(small.lines())
    # the headline agrees with the margins: the GPUs fit, the node is refused for its host memory
    assert small.lines()[0].endswith(f"margin {small.margin:.1f} GiB: REFUSED (host memory)")
    assert "DOES NOT FIT" not in text and "refused: host memory" in text and "refused: disk" in text
    assert small.to_json()["problems"] == [host, disk]
    assert small.to_json()["refused"] == f"{host}; {disk}" and fits.to_json()["refused"] is None


# ---------------------------------------------------------------------------------------------
# The training job's preflight
# ---------------------------------------------------------------------------------------------
def test_preflight_logs_the_plan_and_refuses_a_job_that_does_not_fit(caplog):
    from spader.training.preflight import PreflightError, check_memory

    with caplog.at_level(logging.INFO, logger="spader.training.preflight"):
        jobs = check_memory(name="train q/spader", model="Qwen/Qwen3-8B", model_dir=None,
                            verl_config=verl_cfg(), training_gpus=8, capacity_gib=80.0)  # fmt: skip
    assert jobs[0].fits and "memory plan: train q/spader: 8 GPU(s)" in caplog.text
    with pytest.raises(
        PreflightError, match=r"does not fit in 80.0 GiB per GPU(.|\n)*actor update(.|\n)*ppo_micro_batch"
    ):
        check_memory(name="train q/spader", model="Qwen/Qwen3-8B", model_dir=None,
                     verl_config=verl_cfg(micro=16), training_gpus=8, capacity_gib=80.0)  # fmt: skip
    # a served judge is planned with the job
    judge = {"model": "Qwen/Qwen2.5-14B-Instruct", "gpus": 4, "mem_fraction": 0.99, "tensor_parallel": 1}
    with pytest.raises(PreflightError, match="judge"):
        check_memory(name="train q/r3rag", model="Qwen/Qwen3-8B", model_dir=None, verl_config=verl_cfg(),
                     training_gpus=4, judge=judge, capacity_gib=80.0,
                     retrieval={"reranker": {"model": "BAAI/bge-reranker-v2-m3", "max_batch_tokens": 81920}})  # fmt: skip


def test_job_memory_of_a_train_job(tiny_model):
    """check_job_memory reads what it needs from the TrainJob (shape from the model directory, the
    training GPUs less a served judge's); a CPU job has no GPU plan."""
    from types import SimpleNamespace

    from spader.training.preflight import check_job_memory

    job = SimpleNamespace(device="cuda", backbone="b", variant="v", model_dir=tiny_model, workers=8, train_nodes=1,
                          judge_node=False, scorer=SimpleNamespace(judge_gpus=0),
                          backbone_spec=SimpleNamespace(model="tiny:qwen3"), retrieval=None, judge=None)  # fmt: skip
    (only,) = check_job_memory(job, verl_cfg(), capacity_gib=80.0)
    assert only.name == "train b/v" and only.gpus == 8 and only.fits
    assert check_job_memory(SimpleNamespace(device="cpu"), verl_cfg()) == []


def test_the_plan_models_the_packed_path_a_job_launches():
    """training.remove_padding with a token cap: the plan composes the job as the launch does (the
    packed path, dynamic micro-batches), accepts the cap and plans its tokens."""
    from spader.config import load_config
    from spader.planning.plan import plan_config

    cfg = load_config(REPO / "config" / "config.yaml", verl_config_dir=REPO / "config" / "verl")
    training = cfg.training.model_copy(update={"remove_padding": True, "max_token_len_per_gpu": 17408})
    packed = cfg.model_copy(update={"training": training})
    jobs = {j.name: j for j in plan_config(packed, REPO / "config" / "verl", only=lambda b, v: v == "spader")}
    job = jobs["train qwen3_8b/spader"]
    assert job.path == "packed" and job.refused is None and job.fits
