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
