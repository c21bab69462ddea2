"""scripts/gpu_torch_checks.py's attention check, run on the CPU: the GPU check must be able to fail
(flash_attention_2 without flash-attn is refused at load) and pass where the configs' choice works
(sdpa agrees with eager on a padded bf16 batch)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_torch_checks.py"


@pytest.fixture(scope="module")
def checks():
    spec = importlib.util.spec_from_file_location("gpu_torch_checks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_attention_check_passes_for_sdpa_and_refuses_fa2_without_its_package(checks, capsys):
    assert importlib.util.find_spec("flash_attn") is None  # the CPU lock never installs it
    assert checks.check_attention("cpu", tolerance=0.05)
    out = capsys.readouterr().out
    assert out.count("flash_attention_2 refused") == 2


def test_attention_check_fails_when_the_tolerance_cannot_be_met(checks):
    assert not checks.check_attention("cpu", tolerance=0.0)


def test_script_refuses_to_run_without_a_gpu(checks, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_torch_checks.py"])
    monkeypatch.setattr(checks.torch.cuda, "is_available", lambda: False)
    assert checks.main() == 2


CALIBRATION = SCRIPT.with_name("gpu_memory_calibration.py")


@pytest.fixture(scope="module")
def calibration():
    spec = importlib.util.spec_from_file_location("gpu_memory_calibration", CALIBRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_record(calibration, tmp_path_factory):
    """The script at tiny sizes on the CPU (one and two decoder layers, 2 x 96 tokens): its record
    and what it printed."""
    out = tmp_path_factory.mktemp("calibration") / "record.yaml"
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert (
            calibration.main(["--device", "cpu", "--tiny", "--backbones", "qwen3_8b", "--out", str(out)]) == 0
        )
    return out, printed.getvalue()


def test_calibration_measures_a_positive_per_layer_slope_and_the_log_prob_paths(tiny_record):
    """The per-layer term is the difference of two layer counts with the gradients dropped as the
    training's FSDP2 does (the earlier script subtracted every gradient byte and measured a slope of
    0): exactly the layer input activation checkpointing keeps (hidden x 2 bytes per token, on the
    CPU, where nothing else is held; keeping the gradients raises it to ~386 B for hidden 64). The
    full path keeps (tokens x vocabulary) logits the fused path (verl's kernel through the lm_head
    module) never holds, and both give the same log-probs."""
    import yaml

    path, printed = tiny_record
    record = yaml.safe_load(path.read_text())
    assert record["kind"] == "spader-gpu-memory-calibration" and record["device"] == "cpu"
    (entry,) = record["shapes"]
    hidden, vocab, tokens = entry["shape"]["hidden"], entry["shape"]["vocab"], entry["tokens"]
    measured = entry["measured"]
    assert measured["kept_bytes_per_token_layer"] == 2 * hidden  # exactly one bf16 layer input per token
    runs = entry["runs_peak_bytes"]
    assert (
        runs["stack_2_layers_grad"] - runs["stack_1_layers_grad"]
        == measured["kept_bytes_per_token_layer"] * tokens
    )
    assert measured["backward_bytes_per_token"] > 0 and measured["forward_bytes_per_token"] > 0
    full, fused = measured["logprobs"]["full"]["update"], measured["logprobs"]["fused"]["update"]
    assert full["bytes_per_token"] >= 2 * vocab  # at least one bf16 logits row per token
    assert entry["checks"]["fused_and_full_logprobs_agree"] is True
    # the whole model through verl's patched forward stays within the plan's sum of the parts
    assert 0 < entry["checks"]["whole_model_peak_bytes"] <= entry["checks"]["whole_model_planned_bytes"]
    assert fused["bytes_per_token"] > 0
    assert "kept per layer:        measured" in printed and f"wrote {path}" in printed


def test_the_plan_uses_a_records_constants_for_the_shape_it_measured(tiny_record, tmp_path):
    """hardware.calibration: the measured constants replace the estimates for the measured shape
    (the plan says so), another shape keeps the estimates (and a note says the record has none)."""
    import json

    import yaml

    from spader.config import load_config
    from spader.planning import plan

    path, _ = tiny_record
    entry = yaml.safe_load(path.read_text())["shapes"][0]
    shape = entry["shape"]
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": shape["vocab"], "hidden_size": shape["hidden"], "num_hidden_layers": 6,
        "num_attention_heads": shape["heads"], "num_key_value_heads": shape["kv_heads"], "head_dim": shape["head_dim"],
        "intermediate_size": shape["intermediate"], "tie_word_embeddings": False,
    }))  # fmt: skip
    overlay = tmp_path / "gpu.yaml"
    overlay.write_text(
        "training: {device: cuda, rollout_backend: sglang}\n"
        # the paper's backbones on one GPU each: the demo's 8 trajectories of a step split there
        "backbones: {demo: {gpus: 2}, qwen3_8b: {gpus: 1}, llama3_1_8b: {gpus: 1}}\n"
        f"hardware: {{calibration: {path}}}\n"
    )
    config = load_config(REPO / "config" / "config.yaml", REPO / "config" / "demo.yaml", overlay,
                         verl_config_dir=REPO / "config" / "verl")  # fmt: skip
    calibration = plan.load_record(config)
    (job,) = plan.plan_config(config, REPO / "config" / "verl", models={"demo": str(model_dir)},
                              calibration=calibration, only=lambda b, v: (b, v) == ("demo", "spader"))  # fmt: skip
    assert job.constants["kept inputs, layer working sets, mask"] == f"measured ({path}, cpu)"
    tokens = config.training.ppo_micro_batch_size_per_gpu * (
        config.training.max_prompt_length + config.training.max_response_length
    )
    kept = entry["measured"]["kept_bytes_per_token_layer"]
    assert job.phases["actor update"]["checkpoints"] == pytest.approx(6 * tokens * kept / plan.GIB)
    # another shape: the estimates, and the plan says the record has no entry for it
    other = plan.training_job("t", plan.load_shape("Qwen/Qwen3-8B"), {}, gpus=8, capacity=80.0,
                              measured=calibration.for_shape(plan.load_shape("Qwen/Qwen3-8B")),
                              calibration_path=calibration.path)  # fmt: skip
    assert other.constants["kept inputs, layer working sets, mask"] == "estimated"
    assert any("has no entry for Qwen/Qwen3-8B's shape" in n for n in other.notes)


def test_a_file_that_is_not_a_record_is_refused_with_its_name(tmp_path):
    from spader.planning.calibration import load_calibration

    bad = tmp_path / "other.yaml"
    bad.write_text("kind: something-else\n")
    with pytest.raises(ValueError, match=r"other.yaml: not a GPU memory calibration record"):
        load_calibration(bad)
    with pytest.raises(ValueError, match=r"hardware.calibration: .*missing.yaml does not exist"):
        load_calibration(tmp_path / "missing.yaml")


def test_calibration_sizes_come_from_the_config(calibration):
    got = calibration.settings()
    assert got["micro_batch"] == 4 and got["seq_len"] == 512 + 8192 and got["fused"] is True
    assert got["entropy_checkpointing"] is True
    assert got["backbones"] == {
        "qwen3_8b": "Qwen/Qwen3-8B",
        "llama3_1_8b": "meta-llama/Llama-3.1-8B-Instruct",
    }


def test_calibration_refuses_to_run_without_a_gpu(calibration, monkeypatch):
    monkeypatch.setattr(calibration.torch.cuda, "is_available", lambda: False)
    assert calibration.main([]) == 2
