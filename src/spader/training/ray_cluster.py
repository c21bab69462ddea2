"""Where verl's Ray runs, and who may talk to it.

Ray has no access control of its own beyond a shared token: whoever reaches its ports can run
code as the job's user (GCS, raylet and every worker speak gRPC; the dashboard agent on each node
serves Ray's job API over HTTP). So a training job keeps Ray's ports where they must be and turns
Ray's token authentication on (``RAY_AUTH_MODE=token``, Ray >= 2.52; a fresh random token per
job, never written to ``~/.ray``).

**One node** (every job with ``training.nodes: 1``): verl's ``ray.init`` starts a private instance
(``address=local``) bound to loopback. Ray 2.60 cannot be asked for that through ``ray.init``: a
loopback ``_node_ip_address`` is rewritten to the machine's routable address
(``ray._private.services.resolve_ip_for_localhost``), and its gRPC servers then listen on every
interface (``0.0.0.0``/``::``, seen here). What keeps it on loopback is Ray's switch for machines
that never join a cluster, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (its name notwithstanding,
``get_node_ip_address`` then answers ``127.0.0.1`` on Linux too): GCS, raylet, workers, the
dashboard and runtime-env agents and verl's TransferQueue then bind ``127.0.0.1``
(tests/cpu_training/test_job_guards.py lists the sockets). The dashboard itself is off
(``include_dashboard=false``, :func:`spader.training.launch.job_overrides`).

**Several nodes** (``training.nodes`` > 1, inside a SLURM allocation): the job starts a Ray
cluster itself (:func:`slurm_ray_cluster`): the head on its own node (the allocation's first),
one worker node per other node through ``srun``, each under the process supervisor so that it
stops with the job. The head's address is the one of the interface that routes to the other
nodes (the network the nodes share); workers find theirs the same way. Ray 2.60's gRPC servers
bind every interface whenever the node address is not loopback (``GrpcServer::Run`` listens on
``0.0.0.0`` unless it listens to localhost only) and no setting narrows that, so on several nodes
the token is what keeps others out: it is written to ``<workdir>/ray_auth_token`` (mode 0600, the
shared file system carries it to the other nodes) and named in ``RAY_AUTH_TOKEN_PATH``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from spader.infra.procs import supervised_argv

log = logging.getLogger(__name__)

__all__ = [
    "LOOPBACK_ENV",
    "allocation_steps",
    "auth_env",
    "interface_of",
    "judge_node",
    "loopback_env",
    "node_address",
    "ray_for_job",
    "ray_temp_dir",
    "route_address",
    "slurm_nodes",
    "slurm_ray_cluster",
    "srun_on",
    "step_request",
    "training_nodes",
    "wait_for_nodes",
    "worker_gpus",
]

#: Keeps a private Ray instance on 127.0.0.1 (see the module docstring).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def auth_env(*, token: str | None = None, token_file: str | os.PathLike | None = None) -> dict[str, str]:
    """Ray's token authentication for the processes of one job (and no usage reporting)."""
    env = {"RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}
    if token_file is not None:
        env["RAY_AUTH_TOKEN_PATH"] = os.path.abspath(token_file)
    else:
        env["RAY_AUTH_TOKEN"] = token or secrets.token_hex(32)
    return env


def loopback_env(rendezvous: str | os.PathLike) -> dict[str, str]:
    """Environment of a job whose verl starts a private Ray instance on one node.

    Besides Ray on loopback with a fresh token: torch.distributed's rendezvous through a file
    (``DIST_INIT_METHOD``, which verl and the CPU platform pass to ``init_process_group``; a TCP
    rendezvous store listens on every interface whatever ``MASTER_ADDR`` says), and gloo's and
    NCCL's own sockets on the loopback interface.

    Args:
        rendezvous: a file that does not exist yet (one per attempt), for torch's ``FileStore``.
    """
    return {
        **LOOPBACK_ENV,
        **auth_env(),
        "DIST_INIT_METHOD": f"file://{os.path.abspath(rendezvous)}",
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "lo",
    }


def interface_of(address: str) -> str | None:
    """The name of the network interface that holds ``address`` (None when none does)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addrs):
            return name
    return None


def ray_temp_dir() -> Path:
    """A temporary directory of this job's own for Ray (its sessions, logs, sockets): Ray's default,
    ``ray`` under the system's temporary directory, is one per machine, which two jobs on one node would share (``session_latest``,
    the address file a driver connects through). Short, under the node's temporary directory
    (``TMPDIR``, often the allocation's own): Ray's socket paths must stay under 108 bytes."""
    tag = os.environ.get("SLURM_JOB_ID") or "local"
    return Path(tempfile.mkdtemp(prefix=f"spader-ray-{tag}-"))


def _ray_executable() -> list[str]:
    cli = Path(sys.executable).with_name("ray")
    return [str(cli)] if cli.exists() else [shutil.which("ray") or "ray"]


def slurm_nodes(environ=None) -> list[str]:
    """Host names of the SLURM allocation this job runs in, first node first.

    Read from the controller's record of the job (``squeue -j $SLURM_JOB_ID -o %N``), not from the
    environment: a job started by Snakemake's SLURM executor runs in a step that the executor
    starts with ``srun -n1`` after dropping the allocation's variables, and inside that step
    ``SLURM_JOB_NODELIST`` names the step's one node (seen on SLURM 22.05). The environment's
    list is the fallback when the controller does not answer.
    """
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = ""
    if job:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True, timeout=60
            )
            if out.returncode == 0:
                nodelist = out.stdout.strip()
    nodelist = nodelist or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if not nodelist:
        raise RuntimeError("not inside a SLURM allocation (no SLURM_JOB_ID, no SLURM_JOB_NODELIST)")
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.split()


def srun_on(node: str, *, gpus: int = 0, cpus: int | None = None, mem_mb: int | None = None) -> list[str]:
    """The prefix that runs a command as a step of this allocation on ``node`` alone (sharing the
    node's resources with the job's other steps, ``--overlap``; the step ends when the job does).

    A cluster that confines steps (``TaskPlugin=task/cgroup,task/affinity``) gives a step only what
    it asks for and refuses one that asks for more than the job holds on the node. So a step asks
    for ``cpus`` CPUs and ``mem_mb`` of memory (``--mem=0``: all of the job's memory on the node)
    and its GPUs (:func:`allocation_steps`), and binds its task to the cores it gets there
    (``--cpu-bind=cores``): otherwise ``srun`` takes the binding of the step it is started from
    (``SLURM_CPU_BIND=mask_cpu:...``, the CPUs the job holds on *that* node), which another node,
    where the job holds other CPUs, cannot satisfy (SLURM 22.05: ``Unable to satisfy cpu bind
    request``; tests/slurm/test_confined_steps.py)."""
    return [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--cpu-bind=cores",
        *([f"--cpus-per-task={int(cpus)}"] if cpus else []),
        *([f"--mem={int(mem_mb)}M"] if mem_mb is not None else []),
        *([f"--gres=gpu:{gpus}"] if gpus > 0 else []),
    ]


def step_request(job, *, gpus: int = 0) -> dict[str, int]:
    """What a step the training ``job`` starts inside its allocation asks SLURM for: the job's CPUs
    and memory per node (its ``threads`` and ``mem_mb``, as the rule asked for them: the steps
    overlap, so each may use what the job holds on its node, and the job's own limit bounds them
    together; ``mem_mb`` unknown: ``--mem=0``, all of the job's memory there) and ``gpus``."""
    mem = getattr(job, "mem_mb", None)
    return {"cpus": int(job.threads), "mem_mb": int(mem) if mem else 0, "gpus": int(gpus)}


def worker_gpus(job) -> int:
    """The GPUs a training node's Ray worker step asks SLURM for: the node's training GPUs; none for
    a CPU training, whose Ray nodes count its CPU workers as GPU slots (SLURM refuses a step asking
    for GPUs the job does not hold: ``Step requested GRES but job doesn't have GRES``)."""
    return int(job.workers) if job.device == "cuda" else 0


def allocation_steps(job, nodes: Sequence[str]) -> dict[str, list[str]]:
    """Every step a multi-node training ``job`` starts inside its allocation over ``nodes`` (first
    node first), by name, with the ``srun`` prefix that starts it: each training node's retrieval
    replica, each other training node's Ray worker (the node's GPUs), the judge's node (the
    judge's GPUs)."""
    train = list(nodes[: job.train_nodes])
    steps = {f"retrieval replica on {n}": srun_on(n, **step_request(job)) for n in train}
    for n in train[1:]:
        steps[f"Ray worker on {n}"] = srun_on(n, **step_request(job, gpus=worker_gpus(job)))
    if job.judge_node and len(nodes) > job.train_nodes:
        judge = nodes[job.train_nodes]
        steps[f"judge on {judge}"] = srun_on(judge, **step_request(job, gpus=job.scorer.judge_gpus))
    return steps


def node_address(node: str) -> str:
    """The address other nodes reach ``node`` at: SLURM's ``NodeAddr`` for it (its name when SLURM
    does not say), resolved."""
    addr = node
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=60
        ).stdout
        for field in out.split():
            if field.startswith("NodeAddr="):
                addr = field.split("=", 1)[1] or node
    return socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0][4][0]


def judge_node(job):
    """The allocation's node that serves ``job``'s judge (the one after verl's), as
    :func:`spader.training.scorer_launch.judge_endpoint` takes it; None when the judge is not on a
    node of its own."""
    if not job.judge_node:
        return None
    from spader.training.scorer_launch import JudgeNode

    nodes = slurm_nodes()
    if len(nodes) <= job.train_nodes:
        raise RuntimeError(
            f"training.nodes is {job.training.nodes} but the allocation has {len(nodes)} node(s): {nodes}"
        )
    name = nodes[job.train_nodes]
    gpus = job.scorer.judge_gpus
    return JudgeNode(
        name=name,
        address=node_address(name),
        launcher=tuple(srun_on(name, **step_request(job, gpus=gpus))),
        gpus=tuple(str(i) for i in range(gpus)),
    )


def training_nodes(job) -> list[str]:
    """The allocation's nodes verl trains on (``job.train_nodes`` of them), this one first.

    Raises:
        RuntimeError: the allocation has fewer, or this job does not run on its first node.
    """
    nodes = slurm_nodes()[: job.train_nodes]
    if len(nodes) < job.train_nodes:
        raise RuntimeError(
            f"verl trains on {job.train_nodes} nodes but the allocation has {len(nodes)}: {nodes}"
        )
    host = socket.gethostname().split(".")[0]
    if nodes[0].split(".")[0] != host:
        raise RuntimeError(f"the job runs on {host}, not on the allocation's first node {nodes[0]}")
    return nodes


def route_address(peer: str) -> str:
    """This machine's address on the network that reaches ``peer`` (the interface the nodes share).
    No packet is sent: connecting a UDP socket only picks the route."""
    family, _, _, _, addr = socket.getaddrinfo(peer, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        return s.getsockname()[0]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_nodes(
    address: str, count: int, env: dict[str, str], timeout_s: float, procs, restart=None, logs=None
) -> None:
    """Until ``count`` nodes are alive in the cluster at ``address`` (``ray status`` lists them).

    Args:
        procs: the nodes' processes (a list; one that exits is an error, unless ``restart``
            replaces it).
        restart: called with the index of a process that exited; returns its replacement, or
            None when that node may not start again.
        logs: the processes' output files; the error names the exited one's and quotes its last
            line (``srun``'s refusal of a step, say).
    """
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        for i, p in enumerate(procs):
            if p.poll() is not None:
                again = restart(i) if restart is not None else None
                if again is None:
                    raise RuntimeError(
                        f"a Ray node process exited with code {p.returncode} while the cluster started"
                        + (_last_line(logs[i]) if logs else "")
                    )
                procs[i] = again
        res = subprocess.run(
            [*_ray_executable(), "status", f"--address={address}"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=120,
        )
        last = res.stdout + res.stderr
        if res.returncode == 0:
            alive = sum(1 for line in res.stdout.splitlines() if line.strip().startswith("1 node_"))
            if alive >= count:
                return
        time.sleep(3)
    raise RuntimeError(
        f"the Ray cluster at {address} did not reach {count} nodes in {timeout_s:.0f} s:\n{last[-2000:]}"
    )


def _last_line(path: Path) -> str:
    """`` (log <path>: <its last line>)``."""
    try:
        lines = [x.strip() for x in Path(path).read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        lines = []
    return f" (log {path}: {lines[-1] if lines else 'empty'})"


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    import signal

    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s + 15
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()


def _node_args(cpus: int, gpus: int, temp_dir: Path) -> list[str]:
    """``ray start`` arguments of every node: its resources, the job's own temporary directory (the
    same path on every node) and every node's dashboard agent on a free port (Ray's default, 52365,
    is one per machine), so that two jobs sharing a node cannot collide (the head's GCS and client
    ports are chosen free too)."""
    return ["--num-cpus", str(int(cpus)), "--num-gpus", str(int(gpus)), "--disable-usage-stats", "--block",
            f"--temp-dir={temp_dir}", "--dashboard-agent-listen-port=0"]  # fmt: skip


def _write_token(token_file: Path) -> None:
    """Write a fresh random cluster token to ``token_file`` (mode 0600)."""
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


def _start_head(head_ip: str, port: int, common: list[str], env: dict[str, str], log_dir: Path,
                grace_s: float) -> subprocess.Popen:  # fmt: skip
    """The head node's ``ray start`` here, under the process supervisor; returns its process."""
    head = [
        *_ray_executable(),
        "start",
        "--head",
        f"--node-ip-address={head_ip}",
        f"--port={port}",
        "--include-dashboard=false",
        *common,
    ]
    with open(log_dir / "ray_head.log", "ab") as out:
        return subprocess.Popen(
            supervised_argv(head, grace_s=grace_s),
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _start_worker(node: str, address: str, common: list[str], env: dict[str, str], log_dir: Path,
                  grace_s: float, step: Mapping[str, int] | None = None) -> subprocess.Popen:  # fmt: skip
    """A worker node's ``ray start`` on ``node`` (``srun``, asking for ``step``: :func:`step_request`),
    under the process supervisor; returns its process."""
    worker = [*_ray_executable(), "start", f"--address={address}", *common]
    with open(log_dir / f"ray_{node}.log", "ab") as out:
        proc = subprocess.Popen(
            [*srun_on(node, **(step or {})), sys.executable, "-m", "spader.infra.procs", "--grace", str(grace_s),
             "--", *worker],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    log.info("Ray worker node on %s (log %s)", node, log_dir / f"ray_{node}.log")
    return proc


def _restarter(nodes: Sequence[str], procs: list[subprocess.Popen], worker_starts: int, log_dir: Path,
               start_worker: Callable[[str], subprocess.Popen]) -> Callable[[int], subprocess.Popen | None]:  # fmt: skip
    """The ``restart`` of :func:`wait_for_nodes`: a worker node gets up to ``worker_starts`` starts."""
    starts = dict.fromkeys(nodes[1:], 1)

    def restart(i: int) -> subprocess.Popen | None:
        # Ray 2.60's raylet gives its node's agents a fixed time to write their port files and
        # exits when they take longer (a Python start on a loaded node or a slow shared file
        # system); `ray start` then fails. A worker node gets further starts; the head does not.
        if i == 0 or starts[nodes[i]] >= worker_starts:
            return None
        starts[nodes[i]] += 1
        log.warning(
            "the Ray node on %s exited with code %d while starting (log %s); starting it again (%d of %d)",
            nodes[i], procs[i].returncode, log_dir / f"ray_{nodes[i]}.log", starts[nodes[i]], worker_starts,
        )  # fmt: skip
        return start_worker(nodes[i])

    return restart


@contextlib.contextmanager
def slurm_ray_cluster(
    *,
    nodes: Sequence[str],
    cpus: int,
    gpus: int,
    token_file: str | os.PathLike,
    log_dir: str | os.PathLike,
    start_timeout_s: float = 600.0,
    grace_s: float = 30.0,
    worker_starts: int = 3,
    step: Mapping[str, int] | None = None,
) -> Iterator[tuple[str, dict[str, str]]]:
    """A Ray cluster over the allocation's ``nodes``: the head here (``nodes[0]``), a worker node on
    each other one (``srun``), all stopped on exit.

    Args:
        nodes: the allocation's host names, this one first.
        cpus, gpus: what each node declares (CPUs: enough for verl's placement,
            :func:`spader.training.launch.ray_cpu_slots`).
        token_file: where the cluster's token is written (shared by all nodes).
        log_dir: the nodes' ``ray start`` output.
        start_timeout_s: how long the nodes may take to join.
        grace_s: seconds between SIGTERM and SIGKILL when the cluster stops.
        worker_starts: how often a worker node's ``ray start`` is tried.
        step: what a worker node's step asks SLURM for (:func:`step_request`; None: SLURM's default).
    Yields:
        ``(address, env)``: the head's ``host:port`` and the environment a driver needs.
    """
    if len(nodes) < 2:
        raise ValueError(f"a Ray cluster over nodes needs two or more, got {list(nodes)}")
    head_ip = route_address(nodes[1])
    port = _free_port(head_ip)
    address = f"{head_ip}:{port}"
    token_file = Path(token_file)
    _write_token(token_file)
    env = auth_env(token_file=token_file)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    common = _node_args(cpus, gpus, temp_dir := ray_temp_dir())
    procs: list[subprocess.Popen] = []
    try:
        client = [f"--ray-client-server-port={_free_port(head_ip)}"]
        procs.append(_start_head(head_ip, port, [*common, *client], env, log_dir, grace_s))
        log.info("Ray head on %s at %s (log %s)", nodes[0], address, log_dir / "ray_head.log")

        def start_worker(node: str) -> subprocess.Popen:
            return _start_worker(node, address, common, env, log_dir, grace_s, step)

        procs.extend(start_worker(node) for node in nodes[1:])
        logs = [log_dir / f"ray_{'head' if i == 0 else n}.log" for i, n in enumerate(nodes)]
        restart = _restarter(nodes, procs, worker_starts, log_dir, start_worker)
        wait_for_nodes(address, len(nodes), env, start_timeout_s, procs, restart=restart, logs=logs)
        log.info("Ray cluster of %d nodes up at %s", len(nodes), address)
        yield address, env
    finally:
        _stop(procs, grace_s)
        with contextlib.suppress(FileNotFoundError):
            token_file.unlink()
        shutil.rmtree(temp_dir, ignore_errors=True)
        log.info("Ray cluster at %s stopped", address)


@contextlib.contextmanager
def ray_for_job(job) -> Iterator[tuple[list[str], dict[str, str]]]:
    """Ray's place for one training job (:class:`spader.training.run.TrainJob`).

    Yields:
        ``(overrides, env)`` for verl's launch: a private loopback instance (single node), the
        job's own cluster over its SLURM nodes (``training.nodes`` > 1), or the running cluster
        named by ``job.ray_address`` (its token comes from the job's environment).
    """
    if job.ray_address is not None:
        yield [], {"RAY_USAGE_STATS_ENABLED": "0"}
        return
    if job.train_nodes <= 1:
        rendezvous = job.workdir / f"torch_rendezvous_{secrets.token_hex(8)}"
        temp_dir = ray_temp_dir()
        try:  # its ports are chosen free by Ray (a private instance asks for none of its own)
            yield [f"++ray_kwargs.ray_init._temp_dir={temp_dir}"], loopback_env(rendezvous)
        finally:
            with contextlib.suppress(FileNotFoundError):
                rendezvous.unlink()
            shutil.rmtree(temp_dir, ignore_errors=True)
        return
    from spader.training.launch import ray_cpu_slots

    nodes = training_nodes(job)
    cpus = ray_cpu_slots(
        workers=job.workers, storage_units=1 if job.device == "cpu" else 8, threads=job.threads
    )
    gpus = job.workers
    with slurm_ray_cluster(
        nodes=nodes,
        cpus=cpus,
        gpus=gpus,
        token_file=job.workdir / "ray_auth_token",
        log_dir=job.workdir / "ray",
        step=step_request(job, gpus=worker_gpus(job)),
    ) as (address, env):
        # gloo and NCCL talk over the interface the nodes share, not over every interface
        iface = interface_of(address.rsplit(":", 1)[0])
        if iface:
            env = {**env, "GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface}
        yield [f"ray_kwargs.ray_init.address={address}"], env
