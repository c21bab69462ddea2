"""Training across nodes, on the CPU: a two-node Ray cluster on this machine (Ray's own
``ray.cluster_utils.Cluster``: two raylets, each with its own resources and one logical device
slot, bound to loopback, token authentication on) trains the world for 2 steps with
``training.nodes: 2`` (``trainer.nnodes=2``), and both nodes hold a training worker.

Inside a SLURM allocation the job starts such a cluster itself over its nodes
(spader.training.ray_cluster.slurm_ray_cluster); here the cluster is the test's and the job joins
it through ``TrainJob.ray_address``, the same path verl takes there.
"""

from __future__ import annotations

import secrets
import threading
import time

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

STEPS = 2


def test_two_ray_nodes_train_two_steps_and_both_hold_a_worker(world, tmp_path, monkeypatch):
    from cpu_world import cpu_training, train_job

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every node on 127.0.0.1
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    from ray.cluster_utils import Cluster

    from spader.training.run import run_training

    # each node: one logical device slot, and the CPU tokens verl's placement takes on it
    node = {"num_cpus": 6, "num_gpus": 1, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "resources": {"node_a": 1}})
    try:
        cluster.add_node(**node, resources={"node_b": 1})
        cluster.wait_for_nodes()
        # the cluster's raylets are this process's own children (a training of the session's
        # background demo run has a raylet further down the process tree)
        raylets = [p for p in psutil.Process().children() if p.name() == "raylet"]
        assert len(raylets) == 2
        # what the job waits on after starting its own cluster over SLURM nodes: `ray status`
        from spader.training.ray_cluster import wait_for_nodes

        wait_for_nodes(cluster.address, 2, {}, timeout_s=120, procs=[])

        # two ranks of 2 trajectories each: a micro-batch of 1
        sizes = {
            "train_batch_size": 2,
            "ppo_mini_batch_size": 2,
            "ppo_micro_batch_size_per_gpu": 1,
            "rollout_n": 2,
        }
        training = cpu_training(max_steps=STEPS, nodes=2, **sizes)
        job = train_job(world, tmp_path, variant="grpo", training=training)
        job.ray_address = cluster.address
        assert job.train_nodes == 2

        held: dict[int, set[str]] = {r.pid: set() for r in raylets}
        done = threading.Event()

        def watch_workers():  # which raylet spawned verl's training workers
            while not done.is_set():
                for r in raylets:
                    try:
                        held[r.pid] |= {c.name() for c in r.children(recursive=True)}
                    except psutil.NoSuchProcess:
                        pass
                time.sleep(1)

        thread = threading.Thread(target=watch_workers, daemon=True)
        thread.start()
        try:
            final = run_training(job)
        finally:
            done.set()
            thread.join()
        assert final["steps_done"] == STEPS
        cfg = (job.workdir / "resolved_config.yaml").read_text()
        assert "nnodes: 2" in cfg and "n_gpus_per_node: 1" in cfg
        for pid, names in held.items():
            assert any("WorkerDict" in n for n in names), (pid, sorted(names))
        # two training ranks: one FSDP shard per node in the final checkpoint
        actor = job.ckpt_dir / f"global_step_{STEPS}" / "actor"
        assert sorted(p.name for p in actor.glob("model_world_size_2_rank_*.pt")) == [
            "model_world_size_2_rank_0.pt",
            "model_world_size_2_rank_1.pt",
        ]
    finally:
        cluster.shutdown()
        # Ray's Cluster.shutdown can leave the head's GCS server running as this process's child
        # (seen in a full test run: alive ten minutes later). The cluster's processes are this
        # process's own children; the Ray of a training elsewhere in the session is not.
        for proc in psutil.Process().children():
            try:
                if proc.name() in {"gcs_server", "raylet"}:
                    proc.kill()
            except psutil.NoSuchProcess:
                pass
