"""A two-node CPU training that searches, submitted by Snakemake's SLURM executor to a real
two-node SLURM on this machine: each node a network, UTS and mount namespace of the test's own
(tests/support/netns_slurm.py: its own host name, address and loopback, the nodes joined by one
veth pair, a slurmctld and munged of the test's own and one slurmd per node; the machine's own
SLURM is not touched). The nodes confine steps as a production cluster does where this machine can
(``task/cgroup,task/affinity``: each step in a cpuset of its CPUs, under its memory limit), so the
job's steps run with what they ask SLURM for.

The job runs what a multi-node job runs on a cluster, nothing joined from outside: the retrieval
replica of every node on that node's loopback, started as a step of the allocation
(spader.training.node_search), the Ray head on the first node and a Ray node on the second through
`srun` (spader.training.ray_cluster), verl on both (`trainer.nnodes=2`, one agent-loop worker per
node), its end stopping everything. The policy is the spread world's warm-started tiny Qwen3
(tests/support/spread_world.py), which searches one to three times per question. The test checks
that agent-loop workers ran on both nodes, that each node's replica answered searches and failed
none (a replica is reachable from its own node only: the nodes' loopbacks are apart), and that
nothing of the job is left running on either node afterwards.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))

from netns_slurm import NetnsSlurm, running_cluster  # noqa: E402

from spader.config import resolved_config  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.long]

NO_ACCOUNTING = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2"]
STEPS = 2

SNAKEFILE = """
configfile: "config.yaml"

W = config["world"]


rule train_policy:
    input:
        train=W + "/train.parquet",
        val=W + "/val.parquet",
        index=W + "/index",
        model=W + "/warm",
        verl_configs={verl_configs!r},
    output:
        final="results/{{backbone}}/train/{{variant}}/final.json",
    log:
        "logs/train_policy/{{backbone}}/{{variant}}.log",
    threads: 2
    resources:
        nodes=config["training"]["nodes"],
        tasks=config["training"]["nodes"],
        runtime=40,
        mem_mb=8000,
        train_attempt=lambda wc, attempt: attempt,
    params:
        backbone=config["backbone"],
        variant=lambda wc: config["variants"][wc.variant],
        training=config["training"],
        agent=config["agent"],
        retrieval=config["retrieval"],
        workdir=lambda wc: f"results/{{wc.backbone}}/train/{{wc.variant}}/work",
        judge=None,
    script:
        {script!r}
"""


@pytest.fixture
def cluster(tmp_path):
    with running_cluster(tmp_path / "slurm_logs") as slurm:
        yield slurm
    assert not slurm.processes(), "the cluster's namespaces still hold processes"


class AgentWorkers:
    """Which nodes ran verl's agent-loop workers (``ray::AgentLoopWorker`` processes), sampled
    every second while the job runs."""

    def __init__(self, cluster: NetnsSlurm):
        self.cluster = cluster
        self.seen: dict[str, set[int]] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.wait(1.0):
            for pid, node, _, cmd in self.cluster.processes():
                if cmd.startswith("ray::AgentLoopWorker"):
                    self.seen.setdefault(node, set()).add(pid)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def test_two_slurm_nodes_train_and_search_each_on_their_own_replica(cluster, tmp_path):
    import yaml
    from cpu_world import cpu_training
    from spread_world import build_world

    # SPADER_SPREAD_WORLD: build the world there once and reuse it (its warm start takes minutes)
    world = build_world(Path(os.environ.get("SPADER_SPREAD_WORLD") or tmp_path / "world"))
    work = tmp_path / "repo"
    work.mkdir()
    os.symlink(REPO / "profiles" / "slurm", work / "slurm")
    config = resolved_config(REPO / "config" / "config.yaml")
    training = cpu_training(
        nodes=2,
        max_steps=STEPS,
        save_freq=STEPS,
        train_batch_size=2,
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=2,
        max_prompt_length=64,
        max_response_length=512,
        val_before_train=False,
    )
    config.update(
        world=str(world.root),
        backbone={"model": "tiny:qwen3", "gpus": 0},
        training=training,
        agent=world.agent,
        retrieval=world.retrieval,
        mlflow={**config["mlflow"], "enabled": False},
    )
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    (work / "Snakefile").write_text(
        SNAKEFILE.format(
            verl_configs=[str(REPO / "config" / "verl" / "spader.yaml")],
            script=str(REPO / "workflow" / "scripts" / "train_policy.py"),
        )
    )
    target = "results/world/train/spader/final.json"
    first, second = cluster.nodes
    # the nodes reach each other and their own loopback, nothing else
    routes = cluster.run(first, ["ip", "-4", "route"]).stdout.strip().splitlines()
    assert len(routes) == 1 and routes[0].startswith(cluster.address[first].rsplit(".", 1)[0]), routes

    log = work / "snakemake.out"
    with AgentWorkers(cluster) as workers, open(log, "w") as out:
        proc = cluster.run(
            first,
            [sys.executable, "-m", "snakemake", target, "--profile", "slurm", "--set-threads", "train_policy=2",
             *NO_ACCOUNTING, "--verbose"],
            cwd=work,
            env={**os.environ, "XDG_CACHE_HOME": str(work / ".cache")},
            stdout=out,
            stderr=out,
            timeout=2400,
        )  # fmt: skip
    out = log.read_text()
    job_log = work / "logs" / "train_policy" / "world" / "spader.log"
    wd = work / "results" / "world" / "train" / "spader" / "work"
    detail = out[-3000:] + "\n--- job log ---\n" + (job_log.read_text()[-6000:] if job_log.exists() else "")
    assert proc.returncode == 0, detail
    final = json.loads((work / target).read_text())
    assert final["steps_done"] == STEPS

    # the executor asked for two nodes; verl trained on both
    sbatch = [line for line in out.splitlines() if line.startswith("sbatch call:")]
    assert len(sbatch) == 1 and " --nodes=2" in sbatch[0] and " --ntasks=2" in sbatch[0], sbatch
    assert "nnodes: 2" in (wd / "resolved_config.yaml").read_text()

    # an agent-loop worker on each node
    assert set(workers.seen) == {first, second}, workers.seen

    # each node's agent-loop workers searched through that node's own replica, and none failed
    tool = yaml.safe_load((wd / "tool_config.yaml").read_text())["tools"][0]["config"]
    assert set(tool["retrieval_service_urls"]) == {first, second}, tool
    for node in (first, second):
        status = json.loads((wd / "search" / f"{node}.json").read_text())
        assert status["host"] == node and status["stopped"] and status["problem"] is None, status
        assert status["url"].startswith("http://127.0.0.1:"), status
        stats = status["stats"]
        assert stats["queries"] > 0 and stats["failed_queries"] == 0, (node, stats)

    # nothing of the job is left on either node: only the cluster's daemons
    deadline = time.monotonic() + 60
    while cluster.leftovers() and time.monotonic() < deadline:
        time.sleep(1)
    assert cluster.leftovers() == []
