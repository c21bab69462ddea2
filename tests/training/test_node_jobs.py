"""Every job that needs machine resources checks the node it landed on before any model loads, with
the code a training uses (spader.infra.node.check_node): an evaluation and StepSearch's evidence
against their plan's GPUs and peak, the index build and the downloads against the free disk they
will fill. A node too small stops the job with one line naming the job and what is short; a node
that fits passes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from spader.config import EvaluationConfig
from spader.config.model import EvidenceConfig
from spader.infra.node import Gpu, Needs, Node, PreflightError, check_node, measure_node
from spader.planning.needs import evaluation_needs, evidence_needs

REPO = Path(__file__).resolve().parents[2]
GIB = float(1 << 30)
HARDWARE = {"gpu_memory_gib": 80.0}
RETRIEVAL = {"reranker": {"model": "BAAI/bge-reranker-v2-m3"}}


def _node(tmp_path, **changes) -> Node:
    """A measured node made roomy, then changed where a test says."""
    node = measure_node(tmp_path, gpus=False)
    roomy = dict(ram_available_gib=1000.0, cgroup_limit_gib=None, shm_gib=64.0, disk_free_gib=10_000.0,
                 gpus=[Gpu("H100", 79.6)] * 8, driver="580.65.06", nvcc_path="/usr/local/cuda/bin/nvcc",
                 nvcc_output="Cuda compilation tools, release 13.0, V13.0.88", glibc="glibc 2.36")  # fmt: skip
    return replace(node, **{**roomy, **changes})


def _one_line(exc: pytest.ExceptionInfo, job: str) -> str:
    message = str(exc.value)
    assert "\n" not in message and message.startswith(f"{job} cannot run on this node")
    return message


def _evaluation(**changes) -> dict:
    return {**EvaluationConfig().model_dump(), "max_context_tokens": 8192, **changes}


def test_an_evaluation_on_gpu_checks_its_gpus_their_memory_and_the_toolchain(tmp_path):
    job = "evaluate qwen3_8b/spader on qampari"
    needs = evaluation_needs(job, _evaluation(gpus=2, engine="sglang"), model="Qwen/Qwen3-8B", model_dir=None,
                             hardware=HARDWARE, retrieval=RETRIEVAL)  # fmt: skip
    assert needs.gpus == 2 and needs.kernels and needs.gpu_peak_gib > 40
    assert {c.status for c in check_node(needs, _node(tmp_path))} == {"ok"}
    small = _node(tmp_path, gpus=[Gpu("L4", 22.0)], nvcc_output="release 12.4, V12.4.1", glibc="glibc 2.28")
    with pytest.raises(PreflightError) as exc:
        check_node(needs, small)
    message = _one_line(exc, job)
    assert "gpus: GPUs visible: 1 GPU(s), short of the 2 GPU(s) needed" in message
    assert "gpu memory: the smallest GPU's memory against the plan's peak: 22.0 GiB, short of" in message
    assert "nvcc: nvcc (/usr/local/cuda/bin/nvcc) is CUDA 12.4" in message and "glibc: glibc 2.28" in message
    # the transformers engine compiles nothing: nvcc and glibc are not its business
    plain = replace(needs, kernels=False)
    checks = {
        c.name: c.status
        for c in check_node(plain, _node(tmp_path, nvcc_output="release 12.4", glibc="glibc 2.28"))
    }
    assert checks["nvcc"] == checks["glibc"] == "skip"


def test_an_evaluation_on_cpu_checks_host_and_disk_only(tmp_path):
    job = "evaluate demo/rag on quest"
    needs = evaluation_needs(job, _evaluation(gpus=0, engine="transformers"), model="Qwen/Qwen3-8B",
                             model_dir=None, hardware=HARDWARE, retrieval=RETRIEVAL)  # fmt: skip
    checks = check_node(needs, _node(tmp_path, gpus=None))  # no nvidia-smi: the GPU checks are skipped
    assert [c.name for c in checks if c.status == "skip"] == ["driver", "gpus", "gpu memory", "nvcc", "glibc"]
    with pytest.raises(PreflightError) as exc:
        check_node(needs, _node(tmp_path, gpus=None, ram_available_gib=4.0, disk_free_gib=0.01))
    message = _one_line(exc, job)
    assert "host memory: available for the policy's weights (bf16) as they load: 4.0 GiB, short of" in message
    assert "disk: free at " in message and "for its records: 0.0 GiB, short of the 0.1 GiB needed" in message


def test_the_evidence_job_checks_a_gpu_for_its_reranker(tmp_path):
    needs = evidence_needs("build_evidence", EvidenceConfig(gpus=1), hardware=HARDWARE, retrieval=RETRIEVAL)
    assert needs.gpus == 1 and needs.gpu_peak_gib > 1 and not needs.kernels
    assert "fail" not in {c.status for c in check_node(needs, _node(tmp_path))}
    with pytest.raises(PreflightError) as exc:
        check_node(needs, _node(tmp_path, gpus=[Gpu("tiny", 0.5)], disk_free_gib=0.0))
    message = _one_line(exc, "build_evidence")
    assert "gpu memory: the smallest GPU's memory against the plan's peak: 0.5 GiB" in message
    assert "for the evidence file: 0.0 GiB, short of the 0.1 GiB needed" in message


def test_the_training_check_is_the_shared_one(tmp_path):
    """A training's needs (host, disk, /dev/shm; its GPUs are its static checks') go through check_node."""
    needs = Needs("train demo/spader", host_gib=10.0, disk_gib=5.0, shm_gib=1.0)
    assert [c.name for c in check_node(needs, _node(tmp_path))] == ["host memory", "disk", "/dev/shm"]
    with pytest.raises(
        PreflightError, match=r"^train demo/spader cannot run.*/dev/shm: shared memory: 0\.1 GiB"
    ):
        check_node(needs, _node(tmp_path, shm_gib=0.0625))


def _free(gib: float):
    """A file system with ``gib`` free, in place of statvfs."""
    return lambda path: gib


def test_a_download_stops_when_its_file_does_not_fit(tmp_path):
    from spader.infra.download import fetch

    source = tmp_path / "dump.tar.gz"
    source.write_bytes(b"x" * (1 << 20))
    small = lambda path, gpus=False: measure_node(path, gpus=gpus, free=_free(0.0005))  # noqa: E731
    with pytest.raises(PreflightError) as exc:
        fetch(str(source), tmp_path / "out" / "dump.tar.gz", measure=small)
    message = _one_line(exc, "download dump.tar.gz")
    assert (
        "disk: free at " in message
        and "for what is left to transfer: 0.0 GiB, short of the 0.0 GiB" in message
    )
    assert not (tmp_path / "out" / "dump.tar.gz").exists()
    roomy = lambda path, gpus=False: measure_node(path, gpus=gpus, free=_free(1.0))  # noqa: E731
    assert fetch(str(source), tmp_path / "out" / "dump.tar.gz", measure=roomy).stat().st_size == 1 << 20


def test_the_index_build_stops_before_the_jvm_when_the_index_or_its_heap_does_not_fit(tmp_path):
    from spader.retrieval.index import INDEX_PER_DUMP, build_bm25_index

    dump = tmp_path / "dump.tar.gz"
    dump.write_bytes(b"x" * (1 << 20))
    need = (1 << 20) * INDEX_PER_DUMP / GIB
    small = lambda path, gpus=False: measure_node(path, gpus=gpus, free=_free(need / 2))  # noqa: E731
    with pytest.raises(PreflightError) as exc:
        build_bm25_index(dump, tmp_path / "index", measure=small)
    message = _one_line(exc, "build_bm25_index index")
    assert f"for the index (the dump's size x {INDEX_PER_DUMP:.1f})" in message
    with pytest.raises(PreflightError, match=r"host memory: available for the JVM's heap \(-Xmx99999g\)"):
        build_bm25_index(dump, tmp_path / "index", heap="99999g")


def test_an_evaluation_on_gpu_stops_before_any_model_loads_on_a_node_without_gpus(tmp_path, monkeypatch):
    """evaluation.gpus: 1 on this machine (no nvidia-smi): the entry function stops naming the GPUs;
    its model directory does not even exist, so anything that loaded it would fail otherwise."""
    from spader.evaluation import evaluate_policy
    from spader.retrieval.backend import SearchSettings

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, whatever this machine has
    with pytest.raises(PreflightError) as exc:
        evaluate_policy(
            tmp_path / "set.jsonl", tmp_path / "index", tmp_path / "no-model", tmp_path / "r.jsonl", tmp_path / "s.json",
            method="spader", evaluation=EvaluationConfig(gpus=1), retrieval=SearchSettings.from_config({}),
        )  # fmt: skip
    message = _one_line(exc, "evaluate spader")
    assert "gpus: GPUs visible: 0 GPU(s), short of the 1 GPU(s) needed" in message
    assert not (tmp_path / "r.jsonl").exists()


def test_the_evidence_job_stops_before_its_service_starts_on_a_short_node(tmp_path):
    from spader.retrieval.backend import SearchSettings
    from spader.scorers.evidence import build_evidence_with_service

    needs = Needs("build_evidence", gpus=0, disk_gib=1.0, disk_what="the evidence file")
    small = lambda path, gpus=False: measure_node(path, gpus=gpus, free=_free(0.5))  # noqa: E731
    with pytest.raises(PreflightError) as exc:
        build_evidence_with_service(
            tmp_path / "train.jsonl", tmp_path / "no-index", SearchSettings.from_config({}), tmp_path / "e.jsonl",
            tmp_path / "c.json", settings=EvidenceConfig(gpus=0), needs=needs, measure=small,
        )  # fmt: skip
    assert "for the evidence file: 0.5 GiB, short of the 1.0 GiB needed" in _one_line(exc, "build_evidence")
