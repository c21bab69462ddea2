"""Every preflight error of a training job, raised before any GPU work, with a message that names
the problem and the config key or path to fix."""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from spader.training import VERL_VERSION
from spader.training.preflight import (
    PreflightError,
    check_base_model_dir,
    check_gpus,
    check_retrieval,
    check_verl_version,
    select,
    static_checks,
)

REPO = Path(__file__).resolve().parents[2]


def test_backbone_not_in_config(paper_config):
    with pytest.raises(
        PreflightError, match=r"backbone 'qwen3_14b' is not in the config .*qwen3_8b, llama3_1_8b"
    ):
        select(paper_config, "qwen3_14b", "spader")


def test_variant_not_in_config(paper_config):
    with pytest.raises(
        PreflightError, match=r"variant 'dapo' is not in the config \(config key 'variants' has: spader"
    ):
        select(paper_config, "qwen3_8b", "dapo")


def test_variant_not_trained_by_backbone(paper_config):
    with pytest.raises(PreflightError, match=r"backbone 'llama3_1_8b' does not train variant 'no_np'"):
        select(paper_config, "llama3_1_8b", "no_np")
    backbone, variant = select(paper_config, "llama3_1_8b", "grpo")
    assert backbone["gpus"] == 8 and variant["advantage"] == "grpo"


def test_base_model_path_missing(tmp_path):
    with pytest.raises(
        PreflightError,
        match=r"base model path .*missing does not exist \(config key 'backbones.b.model' is 'Org/M'\)",
    ):
        check_base_model_dir(tmp_path / "missing", backbone="b", model="Org/M")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PreflightError, match="not a Hugging Face model directory: no config.json"):
        check_base_model_dir(tmp_path / "empty", backbone="b", model="Org/M")


def test_base_model_dir_ok(tiny_model):
    check_base_model_dir(tiny_model, backbone="demo", model="tiny:qwen3")


def test_gpus_requested_vs_available(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(
        PreflightError,
        match=r"8 GPU\(s\) requested \(config key 'backbones.qwen3_8b.gpus'\) but 2 available .*CUDA_VISIBLE_DEVICES=0,1",
    ):
        check_gpus(8, backbone="qwen3_8b", available=2)
    with pytest.raises(PreflightError, match="'backbones.demo.gpus' is 0: a GPU run needs at least 1"):
        check_gpus(0, backbone="demo", available=4)
    check_gpus(2, backbone="b", available=2)
    check_gpus(1, backbone="b", available=8)


def test_gpus_counted_by_torch_on_this_machine():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(PreflightError, match=r"1 GPU\(s\) requested .* but 0 available"):
        check_gpus(1, backbone="b")


def test_verl_version_pinned():
    assert check_verl_version() == VERL_VERSION
    with pytest.raises(
        PreflightError,
        match=rf"verl {re.escape(VERL_VERSION)} is installed but this project is pinned to verl==9\.9\.9",
    ):
        check_verl_version("9.9.9")


def test_pin_constant_matches_pyproject():
    text = (REPO / "pyproject.toml").read_text()
    pins = re.findall(r'"verl(?:\[[^\]]*\])?==([^"]+)"', text)
    assert len(pins) >= 2, "pyproject.toml pins verl in the dependencies and the gpu extra"
    assert set(pins) == {VERL_VERSION}


def test_static_checks_report_every_problem(tmp_path):
    with pytest.raises(PreflightError) as err:
        static_checks(
            backbone="b",
            model="Org/M",
            model_dir=tmp_path / "m",
            gpus=4,
            available_gpus=1,
            verl_version="0.0.1",
            glibc="glibc 2.35",
            nvcc="Cuda compilation tools, release 13.0, V13.0.88",
        )
    lines = str(err.value).splitlines()
    assert lines[0] == "training cannot start:"
    assert len(lines) == 4
    assert "pinned to verl==0.0.1" in lines[1]
    assert "base model path" in lines[2]
    assert "4 GPU(s) requested" in lines[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """A real HTTP server (FastAPI under uvicorn, on 127.0.0.1) whose /health says what we tell it."""

    def __init__(self, status_code: int, body: dict):
        import uvicorn
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse

        app = FastAPI()

        @app.get("/health")
        def health():
            return JSONResponse(body, status_code=status_code)

        self.port = _free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "test server did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


def test_retrieval_service_not_healthy():
    with _Server(503, {"status": "loading"}) as url:
        with pytest.raises(PreflightError, match=rf"retrieval service at {re.escape(url)} is not healthy"):
            check_retrieval(url, timeout=5)


def test_retrieval_service_not_running():
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(PreflightError, match=rf"retrieval service at {re.escape(url)} is not healthy"):
        check_retrieval(url, timeout=2)


def test_run_training_stops_before_launching_anything(tmp_path, paper_config):
    """A job whose model is missing fails in preflight: no process started; the work directory holds
    only the attempt history, whose record of the failure an automatic retry reads."""
    import json

    from spader.training.run import TrainJob, run_training

    marker = tmp_path / "launched"
    job = TrainJob(
        backbone="qwen3_8b",
        variant="spader",
        backbone_spec=paper_config["backbones"]["qwen3_8b"],
        variant_spec=paper_config["variants"]["spader"],
        training=paper_config["training"],
        retrieval=paper_config["retrieval"],
        train_file=tmp_path / "train.parquet",
        val_file=tmp_path / "val.parquet",
        index_dir=tmp_path / "index",
        model_dir=tmp_path / "resources/models/hub/Qwen--Qwen3-8B",
        verl_config_dir=REPO / "config" / "verl",
        workdir=tmp_path / "work",
        final_json=tmp_path / "final.json",
        entry=(sys.executable, "-c", f"open({str(marker)!r}, 'w')"),
    )
    with pytest.raises(PreflightError) as err:
        run_training(job, available_gpus=0)
    assert "Qwen--Qwen3-8B does not exist (config key 'backbones.qwen3_8b.model' is 'Qwen/Qwen3-8B')" in str(
        err.value
    )
    assert "8 GPU(s) requested" in str(err.value)
    assert not marker.exists()
    attempts = tmp_path / "work" / "attempts.jsonl"
    (record,) = [json.loads(line) for line in attempts.read_text().splitlines()]
    assert record["phase"] == "preflight" and "PreflightError" in record["error"]


def _fake_nvidia_smi(directory: Path, version: str) -> Path:
    """A stand-in for nvidia-smi (no GPU here) that reports ``version`` as the driver's."""
    exe = directory / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\necho {version}\n")
    exe.chmod(0o755)
    return directory


def test_the_driver_must_run_the_cuda_13_stack(tmp_path, monkeypatch):
    from spader.training.preflight import MIN_DRIVER, check_driver, driver_version

    assert MIN_DRIVER == 580
    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path, "550.54.15")))
    assert driver_version() == "550.54.15"
    with pytest.raises(
        PreflightError, match=r"NVIDIA driver 550.54.15 is older than the 580 series .*CUDA 13"
    ):
        check_driver()
    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path, "580.65.06")))
    assert check_driver() == "580.65.06"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert driver_version() is None and check_driver() is None  # unknown: the GPU check speaks


def test_a_gated_model_without_weights_needs_a_hub_token(tmp_path):
    from spader.training.preflight import check_gated_access, hub_token_configured

    env = {"HF_HOME": str(tmp_path / "hf")}
    model = "meta-llama/Llama-3.1-8B-Instruct"
    with pytest.raises(
        PreflightError, match=r"gated model and no hub token.*huggingface.co/meta-llama.*HF_TOKEN"
    ):
        check_gated_access(model, tmp_path / "missing", environ=env)
    check_gated_access("Qwen/Qwen3-8B", tmp_path / "missing", environ=env)  # not gated
    assert hub_token_configured({**env, "HF_TOKEN": "hf_x"})
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text("hf_abc\n")  # what `hf auth login` writes
    assert hub_token_configured(env)
    check_gated_access(model, tmp_path / "missing", environ=env)
    weights = tmp_path / "llama"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    (weights / "model.safetensors").write_bytes(b"")
    check_gated_access(model, weights, environ={"HF_HOME": str(tmp_path / "empty")})  # already downloaded


def test_static_checks_name_the_driver_and_the_token(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path, "535.1")))
    with pytest.raises(PreflightError) as err:
        static_checks(backbone="llama3_1_8b", model="meta-llama/Llama-3.1-8B-Instruct", model_dir=tmp_path / "m",
                      gpus=8, available_gpus=8, environ={"HF_HOME": str(tmp_path / "hf")})  # fmt: skip
    text = str(err.value)
    assert "base model path" in text and "gated model" in text and "NVIDIA driver 535.1" in text
    # a CPU run checks no driver
    with pytest.raises(PreflightError) as err:
        static_checks(backbone="b", model="Org/M", model_dir=tmp_path / "m", gpus=0, device="cpu")
    assert "NVIDIA" not in str(err.value)


def test_glibc_must_be_2_34_or_newer():
    """sglang 0.5.14's wheels are manylinux_2_34: faked C library versions."""
    from spader.training.preflight import MIN_GLIBC, check_glibc, glibc_version

    assert MIN_GLIBC == (2, 34)
    assert check_glibc("glibc 2.34") == "glibc 2.34" and check_glibc("glibc 2.39") == "glibc 2.39"
    with pytest.raises(
        PreflightError, match=r"glibc 2.31 is older than glibc 2.34.*manylinux_2_34.*Ubuntu 22.04"
    ):
        check_glibc("glibc 2.31")
    with pytest.raises(PreflightError, match=r"not a readable glibc \('musl'\)"):
        check_glibc("musl")
    assert check_glibc(glibc_version())  # this machine's


def _fake_nvcc(tmp_path: Path, release: str) -> Path:
    home = tmp_path / f"cuda-{release}"
    (home / "bin").mkdir(parents=True)
    exe = home / "bin" / "nvcc"
    exe.write_text(
        f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho 'Cuda compilation tools, release {release}, V{release}.88'\n"
    )
    exe.chmod(0o755)
    return home


def test_nvcc_must_be_the_cuda_13_toolkit(tmp_path, monkeypatch):
    """flashinfer compiles sglang's missing kernels with nvcc at first use: faked toolkits."""
    from spader.training.preflight import check_nvcc, nvcc_version

    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.setenv("CUDA_HOME", str(_fake_nvcc(tmp_path, "12.4")))
    path, output = nvcc_version()
    assert path == str(tmp_path / "cuda-12.4" / "bin" / "nvcc") and "release 12.4" in output
    with pytest.raises(
        PreflightError, match=r"nvcc \(.*cuda-12.4/bin/nvcc\) is CUDA 12.4, but the gpu extra is a CUDA 13"
    ):
        check_nvcc()
    monkeypatch.setenv("CUDA_HOME", str(_fake_nvcc(tmp_path, "13.0")))
    assert check_nvcc() == "13.0"
    from spader.infra import node

    monkeypatch.setattr(node, "nvcc_version", lambda: (None, None))  # no toolkit anywhere
    with pytest.raises(PreflightError, match=r"no nvcc \(CUDA 13 toolkit\).*set CUDA_HOME"):
        check_nvcc()
    with pytest.raises(PreflightError, match="unreadable nvcc version"):
        check_nvcc("nvcc: command crashed")


def test_a_gpu_run_checks_glibc_and_nvcc(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path, "580.65.06")))
    with pytest.raises(PreflightError) as err:
        static_checks(backbone="b", model="Org/M", model_dir=tmp_path / "m", gpus=1, available_gpus=1,
                      glibc="glibc 2.28", nvcc="Cuda compilation tools, release 12.8, V12.8.61")  # fmt: skip
    text = str(err.value)
    assert "glibc 2.28 is older than glibc 2.34" in text and "is CUDA 12.8" in text
    with pytest.raises(PreflightError) as err:  # a CPU run checks neither
        static_checks(backbone="b", model="Org/M", model_dir=tmp_path / "m", gpus=0, device="cpu",
                      glibc="glibc 2.28", nvcc="release 12.8")  # fmt: skip
    assert "older than glibc" not in str(err.value) and "is CUDA 12.8" not in str(err.value)
