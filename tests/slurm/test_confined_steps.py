"""Steps inside an allocation under a cluster that confines them: the two-node SLURM of
tests/support/netns_slurm.py with the strictest task plugin this machine runs
(``task/cgroup,task/affinity``, cgroup v1: a step runs in a cpuset of its CPUs, bound to them,
under a memory limit). A job holding one CPU and 600 MB of a node runs, as Snakemake's SLURM
executor runs a rule, in a step of its own that holds the job's CPUs; from there it starts steps
with the prefix the training's steps use (``spader.training.ray_cluster.srun_on`` with
``step_request``: each node's retrieval replica, a Ray worker node, the judge's node)."""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))

from netns_slurm import running_cluster  # noqa: E402

pytestmark = pytest.mark.slow

PROBE = r"""
import json, os, re, subprocess, sys
from types import SimpleNamespace
from spader.training.ray_cluster import srun_on, step_request

SHOW = (
    "import json, os, re\n"
    "cg = re.search(r'memory:(\\S+)', open('/proc/self/cgroup').read()).group(1).replace('/task_0', '')\n"
    "limit = '/sys/fs/cgroup/memory' + cg + '/memory.limit_in_bytes'\n"
    "def opens(dev):\n"
    "    try:\n"
    "        open(dev).close()\n"
    "    except OSError as e:\n"
    "        return e.strerror\n"
    "print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), 'gpus': [opens(d) for d in DEVICES],"
    " 'mem': int(open(limit).read()) if os.path.exists(limit) else None}))"
).replace("DEVICES", repr(sys.argv[1:]))
node = os.environ["SLURMD_NODENAME"]
job = SimpleNamespace(threads=1, mem_mb=600)  # the job's request: one CPU, 600 MB (and two GPUs)
ours = srun_on(node, **step_request(job))
steps = {
    "ours": ours,
    "one_gpu": srun_on(node, **step_request(job, gpus=1)),
    "more_gpus": srun_on(node, **step_request(job, gpus=3)),
    "more_cpus": srun_on(node, cpus=2, mem_mb=600),
    "more_mem": srun_on(node, cpus=1, mem_mb=1200),
    "not_overlapping": [a for a in ours if a != "--overlap"] + ["--immediate=5"],
}
out = {"job": sorted(os.sched_getaffinity(0))}
for name, prefix in steps.items():
    r = subprocess.run([*prefix, sys.executable, "-c", SHOW], capture_output=True, text=True, timeout=120)
    out[name] = {"rc": r.returncode, "out": r.stdout.strip(), "err": r.stderr.strip()}
print(json.dumps(out))
"""


OTHER_NODE = r"""
import json, os, subprocess, sys
from spader.training.ray_cluster import slurm_nodes, srun_on

node = slurm_nodes()[1]
show = "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))"
r = subprocess.run([*srun_on(node, cpus=1, mem_mb=500), sys.executable, "-c", show],
                   capture_output=True, text=True, timeout=120)
print(json.dumps({"here": sorted(os.sched_getaffinity(0)), "bind": os.environ.get("SLURM_CPU_BIND"),
                  "rc": r.returncode, "out": r.stdout.strip(), "err": r.stderr.strip()}))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("slurm_logs")) as slurm:
        yield slurm


def _pythonpath() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def test_a_confined_step_gets_what_the_training_asks_for_and_no_more(cluster, tmp_path):
    """The step the training's prefix starts runs beside the job's own step (``--overlap``; without
    it SLURM refuses: the job's step holds the CPUs), bound to the job's CPUs and under the job's
    memory; a step asking for more CPUs or memory than the job holds on the node is refused."""
    config = cluster.run(cluster.nodes[0], ["scontrol", "show", "config"]).stdout
    plugin = next(
        line.split("=", 1)[1].strip() for line in config.splitlines() if line.startswith("TaskPlugin ")
    )
    assert plugin == cluster.confinement["task_plugin"] != "task/none", plugin
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    node = cluster.nodes[1]
    res = cluster.run(
        cluster.nodes[0],
        ["srun", "-N1", f"--nodelist={node}", "--cpus-per-task=1", "--mem=600", "--gres=gpu:2", "--cpu-bind=q",
         "-t2", sys.executable, str(probe), *map(str, map(cluster.gpu_device, range(cluster.gpus)))],
        env=_pythonpath(),
        timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    allowed, denied = os.strerror(errno.ENXIO), os.strerror(errno.EPERM)
    ran = {name: json.loads(step["out"]) for name, step in out.items() if name != "job" and step["rc"] == 0}
    assert set(ran) == {"ours", "one_gpu"}, out
    # the job's one CPU of the node's, bound; the job's 600 MB as the step's memory limit
    assert len(out["job"]) == 1 and cluster.cpus >= 2
    for step in ran.values():
        assert step["cpus"] == out["job"] and step["mem"] == 600 * 2**20, out
    # a step asking for no GPUs has the job's (the replica's reranker); one asking for one, that one
    assert ran["ours"]["gpus"] == [allowed, allowed] and ran["one_gpu"]["gpus"] == [allowed, denied], out
    refused = {
        "more_cpus": "More processors requested than permitted",
        "more_mem": "Memory required by task is not available",
        "more_gpus": "is more than the job's gres_per_node=gpu:2",
        "not_overlapping": "Requested nodes are busy",
    }
    for name, why in refused.items():
        assert out[name]["rc"] != 0 and why in out[name]["err"], (name, out[name])


def test_a_step_on_another_node_is_bound_to_the_cpus_the_job_holds_there(cluster, tmp_path):
    """A job holds CPU 0 on its first node and CPU 1 on the second (another job holds CPU 0 there).
    Its executor-like step on the first node is bound to CPU 0 and passes that binding on
    (``SLURM_CPU_BIND=...mask_cpu:0x1``); the step the training starts on the second node (a Ray
    worker, a replica, the judge) binds to its own cores there instead of that mask, which CPU 1
    cannot satisfy."""
    first, second = cluster.nodes
    if cluster.cpus != 2:
        pytest.skip(f"the nodes have {cluster.cpus} CPUs; the test lays out two")
    holder = cluster.run(first, ["sbatch", "--parsable", "-N1", f"--nodelist={second}", "-c1", "--mem=100",
                                 "-t2", "--wrap=sleep 120"])  # fmt: skip
    assert holder.returncode == 0, holder.stderr
    try:
        probe = tmp_path / "other_node.py"
        probe.write_text(OTHER_NODE)
        inner = f"srun -n1 --cpu-bind=q --cpus-per-task=1 {sys.executable} {probe}"  # as the executor does
        res = cluster.run(
            first,
            ["salloc", "-N2", "-c1", "--mem=600", "-t2", "--immediate=60", "sh", "-c", inner],
            env=_pythonpath(),
            timeout=180,
        )
    finally:
        job = holder.stdout.strip()
        cluster.run(first, ["scancel", job])
        for _ in range(120):  # its end, not the cluster's stop, ends its processes
            if not cluster.run(first, ["squeue", "-h", "-j", job]).stdout.strip():
                break
            time.sleep(0.25)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["here"] == [0] and out["bind"].endswith("mask_cpu:0x1"), out
    assert out["rc"] == 0 and json.loads(out["out"]) == [1], out
