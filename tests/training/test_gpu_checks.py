"""scripts/gpu_torch_checks.py's attention check, run on the CPU: the GPU check must be able to fail
(flash_attention_2 without flash-attn is refused at load) and pass where the configs' choice works
(sdpa agrees with eager on a padded bf16 batch)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_torch_checks.py"


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


def test_calibration_runs_both_log_prob_paths_on_the_cpu(calibration, capsys):
    """--device cpu --tiny: the configured paths on tiny shapes; both give the same log-probs, and
    the full path keeps the (tokens x vocabulary) log-softmax for the backward pass where the
    chunked one keeps only the hidden states."""
    assert calibration.main(["--device", "cpu", "--tiny", "--backbones", "qwen3_8b"]) == 0
    out = capsys.readouterr().out
    assert "log-probs of the two paths agree: True" in out
    rows = [
        r for r in map(str.split, out.splitlines()) if r[:1] == ["qwen3_8b"] and r[2] in ("full", "fused")
    ]
    saved = {(r[1], r[2]): float(r[-2]) for r in rows}
    tokens, vocab = 96 + 72, 512  # the unpadded tokens of the micro-batch (the second row is padded)
    assert {k[1] for k in saved} == {"full", "fused"}
    for layers in ("1", "2"):
        assert saved[(layers, "full")] - saved[(layers, "fused")] > 0.9 * tokens * vocab * 2 / 2**20
    assert "n/a (cpu)" in out  # no allocator peak on the CPU; a GPU run prints it against the plan


def test_calibration_sizes_come_from_the_config(calibration):
    got = calibration.settings()
    assert got["micro_batch"] == 4 and got["seq_len"] == 512 + 8192 and got["fused"] is True
    assert got["backbones"] == {
        "qwen3_8b": "Qwen/Qwen3-8B",
        "llama3_1_8b": "meta-llama/Llama-3.1-8B-Instruct",
    }


def test_calibration_refuses_to_run_without_a_gpu(calibration, monkeypatch):
    monkeypatch.setattr(calibration.torch.cuda, "is_available", lambda: False)
    assert calibration.main([]) == 2
