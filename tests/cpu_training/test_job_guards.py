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


JOBS_SNAKEFILE = """
configfile: "config.yaml"

rule all:
    input: "warm/summary.json", "eval/records.jsonl"

rule warmstart_policy:
    output: model=directory("warm/model"), trajectories="warm/trajectories.jsonl", summary="warm/summary.json"
    log: "warmstart.log"
    params: paths={paths!r}
    threads: 1
    script: "warmstart.py"

rule evaluate_policy:
    output: records="eval/records.jsonl", summary="eval/summary.json"
    log: "evaluate.log"
    params: paths={paths!r}
    threads: 1
    script: "evaluate.py"
"""

WARMSTART_SCRIPT = """
from spader.config import AgentConfig
from spader.demo.warmstart import WarmstartSettings, warmstart_policy
from spader.infra.glue import job
from spader.retrieval.backend import SearchSettings

p = snakemake.params.paths
with job(snakemake):
    warmstart_policy(
        p["mix"], [p["eval"]], p["index"], p["model"],
        snakemake.output.model, snakemake.output.trajectories, snakemake.output.summary,
        warmstart=WarmstartSettings(steps=100_000, batch_size=2),
        agent=AgentConfig.model_validate(p["agent"]),
        retrieval=SearchSettings.from_config(p["retrieval"]),
        threads=1,
        service_log="warmstart_service.log",
    )
"""

EVALUATE_SCRIPT = """
from spader.config import AgentConfig, EvaluationConfig
from spader.evaluation import evaluate_policy
from spader.infra.glue import job
from spader.retrieval.backend import SearchSettings

if __name__ == "__main__":
    p = snakemake.params.paths
    with job(snakemake):
        evaluate_policy(
            p["eval"], p["index"], p["model"], snakemake.output.records, snakemake.output.summary,
            method="spader",
            evaluation=EvaluationConfig(engine="transformers", gpus=0, batch_size=1, max_context_tokens=2048),
            agent=AgentConfig.model_validate(p["agent"]),
            retrieval=SearchSettings.from_config(p["retrieval"]),
            threads=1,
            service_log="evaluate_service.log",
        )
"""


def _mix_and_eval_sets(world, root: Path) -> dict:
    """A mix file and an evaluation set of the world's questions, long enough to outlast the test."""
    from spader.data.records import MIX_SCHEMA, build_entities, records_frame, write_frame

    meta = dict.fromkeys(MIX_SCHEMA["meta"].to_schema())
    rows = []
    for i, q in enumerate(world.questions):
        answers, norm = build_entities(q["answers"])
        rows.append({"id": f"world:{i}", "dataset": "qampari", "split": "train", "question": q["question"],
                     "answers": answers, "answers_norm": norm, "meta": meta})  # fmt: skip
    write_frame(records_frame(rows, MIX_SCHEMA), root / "mix.jsonl", MIX_SCHEMA)
    with open(root / "eval.jsonl", "w", encoding="utf-8") as f:
        for k in range(400):
            q = world.questions[k % len(world.questions)]
            line = {
                "id": f"e{k}",
                "question_text": q["question"],
                "ground_truth": q["answers"],
                "data_source": "qampari",
            }
            f.write(json.dumps(line) + "\n")
    return {"mix": str(root / "mix.jsonl"), "eval": str(root / "eval.jsonl")}


def _services(procs: list[psutil.Process]) -> int:
    count = 0
    for p in procs:
        try:
            cmd = p.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        count += "spader.retrieval" in cmd and "serve" in cmd
    return count


def test_a_warm_start_and_an_evaluation_die_with_their_workflow(world, tmp_path):
    """kill -9 of snakemake while a warm start and an evaluation run (each beside its retrieval
    service, the evaluation with its engine): both jobs stop within seconds, and what they started
    with them (the jobs watch the Snakemake process that launched them through the job glue)."""
    import yaml

    paths = {**_mix_and_eval_sets(world, tmp_path), "index": str(world.index), "model": str(world.model),
             "agent": world.agent, "retrieval": world.retrieval}  # fmt: skip
    (tmp_path / "Snakefile").write_text(JOBS_SNAKEFILE.format(paths=paths))
    (tmp_path / "warmstart.py").write_text(WARMSTART_SCRIPT)
    (tmp_path / "evaluate.py").write_text(EVALUATE_SCRIPT)
    from spader.config.model import MlflowConfig

    mlflow = MlflowConfig(enabled=False).model_dump(mode="json")  # the model's defaults, tracking off
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"mlflow": mlflow}))
    mark = uuid.uuid4().hex
    smk = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2"],
        cwd=tmp_path,
        env={**os.environ, MARK: mark},
        stdout=open(tmp_path / "snakemake.out", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    logs = [tmp_path / "warmstart.log", tmp_path / "evaluate.log"]

    def tails() -> str:
        return "".join(f"\n--- {p.name}\n{p.read_text()[-2500:]}" for p in logs if p.exists())

    try:
        deadline = time.monotonic() + 600
        while _services(_marked(mark)) < 2:  # both jobs are at work, each beside its service
            assert smk.poll() is None and time.monotonic() < deadline, tails()
            time.sleep(0.5)
        time.sleep(2)
        smk.send_signal(signal.SIGKILL)
        smk.wait()
        t0 = time.monotonic()
        while _marked(mark) and time.monotonic() - t0 < 60:
            time.sleep(0.5)
        gone_after = time.monotonic() - t0
        left = [f"{p.pid} {p.name()}" for p in _marked(mark)]
        assert left == [], [*left, tails()]
        print(f"jobs gone {gone_after:.0f} s after kill -9 of snakemake")
        assert gone_after < 30, tails()
        for log in logs:
            assert (
                f"the workflow that started this job (snakemake, pid {smk.pid}) is gone" in log.read_text()
            ), tails()
        assert (
            not (tmp_path / "warm" / "summary.json").exists()
            and not (tmp_path / "eval" / "records.jsonl").exists()
        )
    finally:
        for p in _marked(mark):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
