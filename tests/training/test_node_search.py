"""The retrieval replica of each node of a multi-node job (spader.training.node_search), the search
tool finding its own node's replica, and the job's watch over several replicas.

The replica runs the real service on a real BM25 index; only ``srun`` is a stand-in (FAKE: a script
that drops srun's options and runs the command on this machine). The two-node run through a real
SLURM is tests/slurm/test_two_slurm_nodes.py (marked long).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sections import search_settings

from spader.retrieval.backend import SearchSettings
from spader.training.node_search import RelayedHealth, node_replicas, read_status
from spader.training.watch import JobWatch

CHUNKS = [
    ("1001__0", "The Salt Orchard", "The Salt Orchard is a 1961 drama film directed by Ilse Varga."),
    ("2001__0", "Lake Ornes", "Lake Ornes is a glacial lake in Norway fed by the river Kvitelva."),
]
FAKE_SRUN = """#!/bin/sh
# FAKE srun: drops the options (all --name=value) and runs the command on this machine
while [ $# -gt 0 ]; do case "$1" in --*) shift;; *) break;; esac; done
exec "$@"
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    from spader.retrieval.index import build_bm25_index

    root = tmp_path_factory.mktemp("corpus")
    (root / "chunks").mkdir()
    with open(root / "chunks" / "chunks.jsonl", "w") as f:
        for cid, title, text in CHUNKS:
            meta = {"title": title, "content": text, "chunk_id": cid, "page_id": cid.split("__")[0]}
            f.write(json.dumps({"id": cid, "contents": f"{title} {text}", "meta": meta}) + "\n")
    build_bm25_index(root / "chunks", root / "index", threads=1)
    return root / "index"


@pytest.fixture
def fake_srun(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return srun


def _settings() -> SearchSettings:
    return search_settings(reranker=None, topk=1, initial_k=2, startup_timeout_s=120)


def _search(url: str, query: str) -> list:
    import httpx

    reply = httpx.post(f"{url}/retrieve", json={"queries": [query]}, timeout=30, trust_env=False)
    reply.raise_for_status()
    return reply.json()["result"]


@pytest.mark.slow
def test_a_node_replica_serves_on_loopback_reports_and_stops_with_its_counters(index, fake_srun, tmp_path):
    with node_replicas(
        ["nodeA"],
        index_dir=index,
        search=_settings(),
        threads=1,
        max_error_rate=0.5,
        directory=tmp_path / "s",
    ) as replicas:
        urls = replicas.wait_ready()
        assert list(urls) == [socket.gethostname()]
        url = urls[socket.gethostname()]
        assert url.startswith("http://127.0.0.1:")
        assert _search(url, "Lake Ornes")[0][0]["title"] == "Lake Ornes"
        (health,) = replicas.healths()
        assert health.problem() is None
        step = replicas.procs[0]
    assert step.returncode == 0  # stopped through the stop file, not a signal
    status = read_status(tmp_path / "s" / "nodeA.json")
    assert status["stopped"] and status["problem"] is None
    assert status["stats"]["queries"] == 1 and status["stats"]["failed_queries"] == 0
    import psutil

    assert (
        not psutil.pid_exists(status["service_pid"])
        or psutil.Process(status["service_pid"]).status() == "zombie"
    )


@pytest.mark.slow
def test_a_dead_node_replica_is_reported_to_the_job(index, fake_srun, tmp_path):
    """Its node's process sees the service die and says so in the status; the job's watch, which
    reads the status, stops the command it watches, naming the node."""
    with node_replicas(
        ["nodeA"],
        index_dir=index,
        search=_settings(),
        threads=1,
        max_error_rate=0.5,
        directory=tmp_path / "s",
        check_s=0.5,
    ) as replicas:
        replicas.wait_ready()
        status = read_status(replicas.status_path("nodeA"))
        command = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            with JobWatch(service=replicas.healths(), interval_s=0.1, service_interval_s=0.2) as watch:
                watch.attach(command)
                os.kill(status["service_pid"], signal.SIGKILL)
                assert command.wait(timeout=30) == -signal.SIGTERM
        finally:
            command.kill()
        assert watch.kind == "service"
        assert f"the retrieval service on {socket.gethostname()}" in watch.reason and "died" in watch.reason
        assert replicas.procs[0].wait(timeout=30) == 1


def test_relayed_health_reads_the_status_and_the_step(tmp_path):
    status = tmp_path / "n.json"
    step = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        health = RelayedHealth("n1", status, step, tmp_path / "n.log", max_silence_s=0.5)
        assert health.problem() is None  # nothing reported yet: the start-up's wait judges that
        # the node's clock may be off: what counts is whether its reports change
        status.write_text(json.dumps({"time": time.time() - 3600, "problem": None}))
        assert health.problem() is None
        time.sleep(0.3)
        status.write_text(json.dumps({"time": time.time() - 3590, "problem": None}))
        assert health.problem() is None
        time.sleep(0.6)
        assert "the retrieval service on node n1 has not reported for" in health.problem()
        status.write_text(json.dumps({"time": time.time(), "problem": "the service failed 9 of 10 queries"}))
        assert health.problem() == "the service failed 9 of 10 queries"
        status.write_text(json.dumps({"time": time.time(), "problem": None}))
        step.kill()
        step.wait()
        assert f"on node n1 stopped (its srun step exited with code {-signal.SIGKILL}" in health.problem()
    finally:
        step.kill()


class _Health:
    def __init__(self, problem=None):
        self.answer = problem

    def problem(self):
        return self.answer


def test_the_watch_stops_the_command_when_any_replica_fails():
    command = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    second = _Health()
    try:
        with JobWatch(service=[_Health(), second], interval_s=0.05, service_interval_s=0.1) as watch:
            watch.attach(command)
            time.sleep(0.3)
            assert command.poll() is None
            second.answer = "the retrieval service on node n2 has not reported for 301 s"
            assert command.wait(timeout=10) == -signal.SIGTERM
        assert (watch.kind, watch.reason) == ("service", second.answer)
    finally:
        command.kill()


def test_the_search_tool_uses_the_replica_of_its_own_host():
    from spader.integrations.verl.search_tool import service_url

    urls = {"n1": "http://127.0.0.1:4001", "n2": "http://127.0.0.1:4002"}
    assert service_url({"retrieval_service_urls": urls}, host="n2") == "http://127.0.0.1:4002"
    with pytest.raises(ValueError, match=r"no retrieval service for host 'n3'.*\['n1', 'n2'\]"):
        service_url({"retrieval_service_urls": urls}, host="n3")
    assert service_url({"retrieval_service_url": "http://127.0.0.1:9"}, host="n3") == "http://127.0.0.1:9"
    with pytest.raises(ValueError, match="missing key 'retrieval_service_url'"):
        service_url({})


def test_the_tool_yaml_of_several_nodes_is_loaded_by_verl_on_its_host(tmp_path):
    from verl.tools.tool_registry import initialize_tools_from_config

    from spader.integrations.verl.tool_config import write_tool_config

    host = socket.gethostname()
    urls = {host: "http://127.0.0.1:4001", "elsewhere": "http://127.0.0.1:4002"}
    from spader.config.model import RetrievalConfig

    retrieval = RetrievalConfig.model_validate(
        {
            "topk": 2,
            "initial_k": 5,
            "service": {"request_timeout_s": 30, "retries": 1, "max_query_chars": 100},
        }
    ).model_dump(mode="json")  # the section as a job reads it, every default filled in
    path = write_tool_config(
        tmp_path / "tool.yaml", service_url=urls, retrieval=retrieval, max_queries_per_call=2, max_chars=100
    )
    (tool,) = initialize_tools_from_config(str(path))
    assert tool.client.base_url == "http://127.0.0.1:4001"
    with pytest.raises(ValueError, match="http"):
        write_tool_config(
            tmp_path / "x.yaml",
            service_url={host: "127.0.0.1:1"},
            retrieval=retrieval,
            max_queries_per_call=1,
            max_chars=1,
        )


def test_a_cpu_run_has_an_agent_loop_worker_on_every_node():
    from spader.config import TrainingConfig
    from spader.integrations.verl.device import device_overrides

    training = TrainingConfig(device="cpu", rollout_backend="transformers", max_steps=2)
    assert "actor_rollout_ref.rollout.agent.num_workers=1" in device_overrides(training, threads=2, workers=1)
    two = device_overrides(training, threads=2, workers=1, nnodes=2)
    assert "actor_rollout_ref.rollout.agent.num_workers=2" in two
