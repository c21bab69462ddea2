"""A CPU training job started by Snakemake, with verl's trainer really running on the CPU:

* everything the job's process tree listens on (Ray's GCS, raylet, workers and agents, verl's
  TransferQueue, torch.distributed, the retrieval service) is on loopback;
* a second trainer on the same work directory refuses while the first trains;
* ``kill -9`` of snakemake takes the job, its retrieval service, verl and Ray with it within a
  bound (the job watches the workflow process that started it).
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from spader.config import resolved_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SUPPORT = REPO / "tests" / "support"
MARK = "SPADER_GUARD_TEST"
# long enough that the job is still training when the test is done looking at it
SIZES = {"max_steps": 50, "train_batch_size": 2, "ppo_mini_batch_size": 2, "rollout_n": 2}

SNAKEFILE = """
configfile: "config.yaml"

rule train:
    output: "final.json"
    log: "train.log"
    params: world={world!r}, sizes={sizes!r}
    script: "train.py"
"""

SCRIPT = """
import sys
sys.path.insert(0, {support!r})
from cpu_world import build_world, cpu_training, train_job
from spader.infra.glue import job
from spader.training.run import run_training

with job(snakemake):
    world = build_world(snakemake.params.world)
    run_training(train_job(world, ".", training=cpu_training(**snakemake.params.sizes)))
"""


def _marked(mark: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARK) == mark:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _listening(procs: list[psutil.Process]) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket and bound UDP socket."""
    out = set()
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr):
                    out.add((p.name(), c.laddr.ip, c.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def test_a_training_job_listens_on_loopback_only_holds_its_workdir_and_dies_with_its_workflow(
    world, tmp_path
):
    from cpu_world import cpu_training, train_job

    from spader.training.run import run_training
    from spader.training.workdir import WorkdirBusyError

    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(world=str(world.root), sizes=SIZES))
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT.format(support=str(SUPPORT))))
    import yaml

    mlflow = {**resolved_config(REPO / "config" / "config.yaml")["mlflow"], "enabled": False}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"mlflow": mlflow}))
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, "PYTHONPATH": str(SUPPORT)}
    smk = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2"],
        cwd=tmp_path,
        env=env,
        stdout=open(tmp_path / "snakemake.out", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # verl is training once its FSDP workers exist; look at the sockets until a step is logged
        deadline = time.monotonic() + 900
        sockets: set = set()
        workers = False
        metrics = tmp_path / "work" / "metrics"
        while time.monotonic() < deadline and smk.poll() is None:
            procs = _marked(mark)
            workers = workers or any("WorkerDict" in p.name() for p in procs if p.is_running())
            sockets |= _listening(procs)
            if workers and any(f.stat().st_size for f in metrics.glob("attempt_*.jsonl")):
                break
            time.sleep(1)
        log = (tmp_path / "train.log").read_text() if (tmp_path / "train.log").exists() else ""
        assert workers and smk.poll() is None, (tmp_path / "snakemake.out").read_text()[-3000:] + log[-5000:]
        names = {name for name, _, _ in sockets}
        assert {"gcs_server", "raylet"} <= names, sockets  # Ray really runs under the job
        outside = sorted(s for s in sockets if not _loopback(s[1]))
        assert outside == [], outside

        # a second trainer on the same work directory refuses, naming the first
        second = train_job(world, tmp_path, training=cpu_training(**SIZES))
        with pytest.raises(WorkdirBusyError, match="in use by another training job"):
            run_training(second)

        # kill -9 of snakemake: the job notices and its whole tree goes
        smk.send_signal(signal.SIGKILL)
        smk.wait()
        t0 = time.monotonic()
        while _marked(mark) and time.monotonic() - t0 < 120:
            time.sleep(0.5)
        left = [f"{p.pid} {p.name()}" for p in _marked(mark)]
        gone_after = time.monotonic() - t0
        assert left == [], left
        print(f"job tree gone {gone_after:.0f} s after kill -9 of snakemake")
        history = [
            json.loads(line) for line in (tmp_path / "work" / "attempts.jsonl").read_text().splitlines()
        ]
        assert history[-1]["status"] == "interrupted"
        assert "the workflow that started this job (snakemake" in history[-1]["error"]
        assert not (tmp_path / "work" / "trainer.lock").exists()  # released on the way out
    finally:
        for p in _marked(mark):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
