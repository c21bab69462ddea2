"""The node a job lands on, measured and compared with the plan: `spader preflight` runs every check
and refuses a configuration that claims more host memory or disk than this machine has, naming the
figure measured; a CPU configuration needs no GPU, a GPU one refuses this machine; a training job
stops with one line naming what its node lacks; glibc and the wheel tag are named before pip would
fail."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from spader.training import preflight
from spader.training.node import Node, _cgroup_memory_limit, check_job_node, measure_node, wheel_tag

REPO = Path(__file__).resolve().parents[2]
GIB = float(1 << 30)


def _preflight(tmp_path: Path, *configfiles: str, args: tuple[str, ...] = ()) -> tuple[int, dict]:
    """``spader preflight --json`` with overlays of ``config/config.yaml``: (exit status, its JSON)."""
    from spader.config.command import run_command

    lines: list[str] = []
    argv = ["--root", str(REPO), "--json", *args]
    for i, text in enumerate(configfiles):
        path = tmp_path / f"overlay{i}.yaml"
        path.write_text(text)
        argv += ["--configfile", str(path)]
    code = run_command(
        "spader preflight", preflight.add_arguments, lambda a: preflight.run(a, out=lines.append), argv
    )
    return code, json.loads(lines[-1])


def _checks(result: dict) -> dict[str, dict]:
    return {c["name"]: c for c in result["checks"]}


def test_an_overlay_claiming_more_than_this_machine_has_is_refused_naming_the_measured_figure(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the DAG's trees (results/, resources/) are measured where it runs
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    limit = _cgroup_memory_limit()
    ram = min(ram, limit) if limit else ram
    free = shutil.disk_usage(tmp_path).free / GIB
    code, result = _preflight(tmp_path, "hardware:\n  host_memory_gib: 65536\n  disk_gib: 9000000\n")
    checks = _checks(result)
    assert code == 1 and result["refused"]
    host, disk = checks["host memory (hardware.host_memory_gib)"], checks["disk (hardware.disk_gib)"]
    assert host["status"] == "fail" and disk["status"] == "fail"
    assert "hardware.host_memory_gib is 65536 GiB, more than this node has" in host["detail"]
    assert (
        host["have"] == pytest.approx(ram, abs=0.2) and f"measured {host['have']:,.1f} GiB" in host["detail"]
    )
    assert "hardware.disk_gib is 9e+06 GiB, more than this node has" in disk["detail"]
    assert (
        disk["have"] == pytest.approx(free, rel=0.01)
        and f"measured {disk['have']:,.1f} GiB" in disk["detail"]
    )
    assert any(r.startswith("host memory (hardware.host_memory_gib): ") for r in result["refused"])
    assert result["node"]["ram_gib"] == pytest.approx(ram, abs=0.2)
    # every check ran, not only up to the first failure
    assert {
        "glibc",
        "driver",
        "gpus",
        "gpu memory",
        "nvcc",
        "host memory",
        "disk",
        "/dev/shm",
        "verl",
    } <= set(checks)

    code, modest = _preflight(tmp_path, "hardware:\n  host_memory_gib: 1\n  disk_gib: 1\n")
    checks = _checks(modest)
    assert checks["host memory (hardware.host_memory_gib)"]["status"] == "ok"
    assert checks["disk (hardware.disk_gib)"]["status"] == "ok"


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU node")
def test_a_cpu_config_needs_no_gpu_and_a_gpu_config_refuses_this_machine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, cpu = _preflight(tmp_path, (REPO / "config" / "demo.yaml").read_text())
    checks = _checks(cpu)
    assert code == 0 and cpu["refused"] is None and cpu["gpu_node"] is False
    assert checks["gpus"]["status"] == "skip" and checks["gpus"]["detail"].startswith(
        "no GPU (nvidia-smi not found)"
    )
    assert checks["verl"]["status"] == "ok"
    code, gpu = _preflight(tmp_path)
    checks = _checks(gpu)
    assert code == 1 and gpu["gpu_node"] is True
    assert checks["driver"]["status"] == "fail" and checks["driver"]["detail"].startswith("no GPU")
    assert (
        checks["gpus"]["status"] == "fail"
        and "0 GPU(s), short of the 8 GPU(s) needed" in checks["gpus"]["detail"]
    )
    # --cpu: this machine is not the GPU node, whatever the configuration
    code, skipped = _preflight(tmp_path, args=("--cpu",))
    assert code == 0 and _checks(skipped)["driver"]["status"] == "skip"


def test_glibc_and_the_wheel_tag_are_named_before_pip_fails():
    ok, line = wheel_tag("glibc 2.28")
    assert not ok and "glibc 2.28: pip accepts wheels up to manylinux_2_28_" in line
    assert "sglang 0.5.14 ships only manylinux_2_34_" in line
    ok, line = wheel_tag("glibc 2.36")
    assert ok and "pip accepts manylinux_2_34_" in line
    assert not wheel_tag(None)[0] and not wheel_tag("musl 1.2")[0]


def test_a_training_job_stops_naming_what_its_node_lacks(tmp_path):
    """The job's plan (its host memory, its checkpoints at their peak, /dev/shm) against a node: one
    line naming each shortage with the figures; a node with room passes."""
    from spader.config import load_config
    from spader.planning.plan import plan_config
    from spader.training.preflight import PreflightError

    config = load_config(REPO / "config" / "config.yaml", verl_config_dir=REPO / "config" / "verl")
    job = next(j for j in plan_config(config, REPO / "config" / "verl", only=lambda b, v: v == "spader")
               if j.name == "train qwen3_8b/spader")  # fmt: skip
    measured = measure_node(tmp_path, gpus=False)
    small = replace(
        measured, ram_available_gib=8.0, cgroup_limit_gib=None, shm_gib=0.0625, disk_free_gib=10_000.0
    )
    with pytest.raises(PreflightError) as exc:
        check_job_node(job, small)
    message = str(exc.value)
    assert "\n" not in message and message.startswith("train qwen3_8b/spader cannot run on this node")
    assert (
        f"host memory: available to the job: 8.0 GiB, short of the {job.host_gib:,.1f} GiB needed" in message
    )
    assert (
        "/dev/shm: shared memory: 0.1 GiB, short of the 1.1 GiB needed" in message and "disk" not in message
    )
    # its checkpoints at their peak, less the ones already in its work directory
    need = job.disk_gib - job.disk["export (bf16)"]
    tight = replace(small, ram_available_gib=1000.0, shm_gib=16.0, disk_free_gib=need - 100)
    with pytest.raises(PreflightError, match=r"disk: free at .*short of the"):
        check_job_node(job, tight)
    checks = check_job_node(job, tight, workdir_gib=100.0)
    assert [c.status for c in checks] == ["ok", "ok", "ok"]


def test_the_memory_limit_of_a_cgroup_is_the_nodes_memory(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "memory.max").write_text("1073741824\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    assert _cgroup_memory_limit(str(tmp_path), str(proc)) == 1.0
    (tmp_path / "job" / "memory.max").write_text("max\n")
    assert _cgroup_memory_limit(str(tmp_path), str(proc)) is None
    v1 = tmp_path / "memory" / "slurm" / "job_7"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(3 << 30))
    proc.write_text("4:memory:/slurm/job_7\n0::/\n")
    assert _cgroup_memory_limit(str(tmp_path), str(proc)) == 3.0
    node = Node(ram_total_gib=64.0, ram_available_gib=60.0, cgroup_limit_gib=3.0, shm_gib=32.0, disk_path="/",
                disk_free_gib=1.0, glibc="glibc 2.36")  # fmt: skip
    assert (node.ram_gib, node.ram_usable_gib) == (3.0, 3.0)


def test_the_gpu_lock_pins_one_cuda_compiler_release_and_torchs_runtime():
    """What a GPU node installs: nvcc with its own headers (crt), nvvm and tileiras of one release
    (flashinfer's cuda-tile[tileiras] holds them to 13.2; crt, unversioned by nvcc, once resolved to
    13.5), and the runtime libraries of torch's cuda-toolkit release (13.0)."""
    pins = {}
    for line in (REPO / "requirements" / "gpu-lock.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name] = version
    compiler = {
        p: pins[p] for p in ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-tileiras")
    }
    assert len(set(compiler.values())) == 1, compiler
    toolkit = ".".join(pins["cuda-toolkit"].split(".")[:2])
    runtime = (
        "nvidia-cuda-runtime",
        "nvidia-cuda-nvrtc",
        "nvidia-nvjitlink",
        "nvidia-cuda-cupti",
        "nvidia-nvtx",
    )
    assert {".".join(pins[p].split(".")[:2]) for p in runtime} == {toolkit}, {p: pins[p] for p in runtime}
    assert compiler["nvidia-cuda-nvcc"].split(".")[0] == toolkit.split(".")[0] == "13"  # the preflight's nvcc
