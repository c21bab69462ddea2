"""The GPU memory plan (spader.training.plan): model shapes from config.json, sglang 0.5.14's
static share of the memory free at launch, the phases of a training job from its composed verl
config, the paper config fitting 80 GiB GPUs with the stated margin and failing when the
micro-batch grows; and the preflight that refuses a job that does not fit."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from spader.config import resolved_config
from spader.training import plan
from spader.training.plan import VerlMemory, load_shape, training_job

REPO = Path(__file__).resolve().parents[2]
#: the margin docs/gpu.md states for every paper job on an 80 GiB GPU
STATED_MARGIN_GIB = 8.0


def verl_cfg(*, micro=4, prompt=512, response=8192, fused=True, critic=False, entropy=0.0, **flags) -> dict:
    """A resolved verl config holding the keys the plan reads."""
    return {
        "data": {"max_prompt_length": prompt, "max_response_length": response},
        "actor_rollout_ref": {
            "model": {
                "use_fused_kernels": fused,
                "fused_kernel_options": {"impl_backend": "torch"},
                "use_remove_padding": False,
                "enable_gradient_checkpointing": True,
            },
            "actor": {
                "ppo_micro_batch_size_per_gpu": micro,
                "use_dynamic_bsz": flags.get("dynamic", False),
                "ppo_max_token_len_per_gpu": 16384,
                "entropy_coeff": entropy,
                "entropy_checkpointing": flags.get("entropy_checkpointing", True),
                "fsdp_config": {
                    "model_dtype": "fp32",
                    "param_offload": False,
                    "optimizer_offload": flags.get("actor_optimizer_offload", False),
                },
            },
            "ref": {"log_prob_micro_batch_size_per_gpu": micro},
            "rollout": {
                "gpu_memory_utilization": flags.get("fraction", 0.6),
                "tensor_model_parallel_size": 2,
                "log_prob_micro_batch_size_per_gpu": micro,
                "free_cache_engine": True,
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

    overlay = tmp_path / "micro8.yaml"
    overlay.write_text("training:\n  ppo_micro_batch_size_per_gpu: 8\n")
    lines.clear()
    code = plan.main(
        ["--root", str(REPO), "--configfile", str(overlay)], out=lines.append
    )  # overlays config.yaml
    assert code == 1
    text = "\n".join(lines)
    assert "train qwen3_8b/r3rag" in text and "DOES NOT FIT" in text


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
                          judge_node=False, baseline=SimpleNamespace(judge_gpus=0),
                          backbone_spec=SimpleNamespace(model="tiny:qwen3"), retrieval=None, judge=None)  # fmt: skip
    (only,) = check_job_memory(job, verl_cfg(), capacity_gib=80.0)
    assert only.name == "train b/v" and only.gpus == 8 and only.fits
    assert check_job_memory(SimpleNamespace(device="cpu"), verl_cfg()) == []
