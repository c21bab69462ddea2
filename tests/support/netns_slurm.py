"""A SLURM cluster of several nodes on this one machine, for tests: each node is a network, UTS and
mount namespace of the test's own making, with its own host name and address.

* **Network.** Two nodes are joined by one veth pair made inside their namespaces (``eth0`` in
  each, ``<subnet>.1`` and ``<subnet>.2``/24); each also has its own loopback. Nothing touches the
  machine's own network namespace: the nodes reach each other and their loopbacks, and no other
  address (they have no other route).
* **Files.** Each node sees the machine's file system (a shared file system, as on a cluster),
  except ``/etc/slurm``, ``/etc/hosts`` and ``/run/munge``, over which the cluster's own directory is
  bind-mounted in the node's mount namespace: every SLURM command inside finds this cluster's
  configuration at the default place (the SLURM executor plugin drops ``SLURM_CONF`` before its
  inner ``srun``), the node names resolve to the nodes' addresses, and munge is this cluster's own
  daemon with its own key. The machine's own SLURM (``.ci/slurm-up.sh``) is neither read nor touched.
* **Daemons.** One ``munged`` and ``slurmctld`` on the first node, one ``slurmd`` per node; their pid,
  log, state and spool files are in the cluster's directory (``%n`` in the slurmd paths).
* **Confinement.** Where the machine mounts cgroup v1's ``cpuset`` and ``memory`` hierarchies
  writable, the nodes confine every step as a production cluster does (:func:`confinement`):
  ``TaskPlugin=task/cgroup,task/affinity``, ``ProctrackType=proctrack/cgroup`` and a
  ``cgroup.conf`` with ``CgroupPlugin=cgroup/v1``, ``ConstrainCores``, ``ConstrainRAMSpace`` and
  ``ConstrainDevices``: a step runs in a cpuset of its CPUs, bound to them, under a memory limit.
  Each node then claims the machine's real CPUs (binding needs CPUs that exist); SLURM's cgroups
  are ``slurm_<node>`` at the top of each hierarchy, removed by :meth:`NetnsSlurm.stop`. Elsewhere
  ``task/affinity`` alone (no cgroups: CPU binding only). ``cgroup/v2`` cannot run beside v1
  hierarchies (slurmd: ``fatal: Hybrid mode is not supported``).
* **GPUs.** Each node has ``gpus`` fake GPUs (GRES ``gpu``): character devices of the cluster's own
  (major 240, reserved for local use; no driver answers them). Opening one fails with ``ENXIO``
  where the step's devices cgroup lets it through and with ``EPERM`` where ``ConstrainDevices``
  denies it, so a step shows which GPUs SLURM gave it.

:meth:`NetnsSlurm.stop` ends every process in the nodes' network namespaces (the daemons and
anything a job left), then the namespaces' holders; the namespaces and the veth pair go with them.
Root is needed (namespaces, mounts).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmscriptd", "slurmd", "munged")
CGROUP_V1 = Path("/sys/fs/cgroup")
CONSTRAINED = ("cpuset", "memory", "devices", "freezer")  # task/cgroup's and proctrack/cgroup's


def confinement() -> dict[str, str | None]:
    """The strictest step confinement the nodes can run here: ``task_plugin``, ``proctrack`` and
    ``cgroup_conf`` (None: no cgroup.conf). Task/cgroup with cgroup v1 where its hierarchies are
    mounted writable (this machine's kind: v1 controllers beside an empty v2 mount, in which
    ``cgroup/v2`` refuses to start); task/affinity (CPU binding, no cgroups) elsewhere."""
    if all(os.access(CGROUP_V1 / c / "cgroup.procs", os.W_OK) for c in CONSTRAINED):
        return {
            "task_plugin": "task/cgroup,task/affinity",
            "proctrack": "proctrack/cgroup",
            "cgroup_conf": "CgroupPlugin=cgroup/v1\nConstrainCores=yes\nConstrainRAMSpace=yes\n"
            "ConstrainDevices=yes\n",
        }
    return {"task_plugin": "task/affinity", "proctrack": "proctrack/linuxproc", "cgroup_conf": None}


def netns_problem() -> str:
    """Why such a cluster cannot start here, or ``""``."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and bind mounts)"
    for tool in ("unshare", "nsenter", "ip", "slurmctld", "slurmd", "munged", "sinfo", "sbatch", "srun"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is not installed (Debian: apt-get install slurmctld slurmd slurm-client munge iproute2)"
    if not Path("/run/munge").is_dir():  # each node's namespace mounts the cluster's munge socket there
        return (
            "/run/munge does not exist: the nodes mount their munge socket's directory over it "
            "(create it with `install -d -o munge -g munge -m 0755 /run/munge`, as .ci/slurm-up.sh does)"
        )
    probe = subprocess.run(
        ["unshare", "--net", "--uts", "--mount", "--propagation", "private", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"cannot create namespaces: {probe.stderr.strip()}"
    return ""


class NetnsSlurm:
    """The cluster (see the module docstring); :meth:`start` and :meth:`stop` it.

    Args:
        nodes: host names, the first one runs the controller; default two names of this cluster's
            own (SLURM names its cgroups after the node: two clusters at once must not share one).
        subnet: the first three octets of the nodes' /24.
        cpus: what each node claims; default the machine's CPUs (SLURM binds steps to them).
        mem_mb: what each node claims (``config_overrides``; each job's and step's memory limit
            is what it asked for).
        gpus: fake GPUs per node (see the module docstring).
        confine: the steps' confinement (:func:`confinement`); False: ``task/none``, nothing.
    """

    def __init__(
        self,
        nodes: tuple[str, ...] | None = None,
        *,
        subnet: str = "10.213.7",
        cpus: int | None = None,
        mem_mb: int = 16000,
        gpus: int = 2,
        confine: bool = True,
    ):
        if nodes is None:
            tag = secrets.token_hex(2)
            nodes = (f"sp{tag}n1", f"sp{tag}n2")
        if len(nodes) != 2:
            raise ValueError("one veth pair joins exactly two nodes")
        self.nodes = nodes
        self.address = {n: f"{subnet}.{i + 1}" for i, n in enumerate(nodes)}
        self.cpus, self.mem_mb, self.gpus = cpus or len(os.sched_getaffinity(0)), mem_mb, gpus
        self.confinement = (
            confinement()
            if confine
            else {"task_plugin": "task/none", "proctrack": "proctrack/linuxproc", "cgroup_conf": None}
        )
        # short: slurmstepd's sockets live in the spool directory (108-byte limit of a socket path)
        self.root = Path(tempfile.mkdtemp(prefix="spn-", dir="/tmp"))
        self.holders: dict[str, subprocess.Popen] = {}
        self.netns: dict[int, str] = {}  # network namespace (inode) -> node

    # -- paths and commands -------------------------------------------------------------------
    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    def gpu_device(self, i: int) -> Path:
        """The device file of every node's ``i``-th fake GPU."""
        return self.root / "dev" / f"gpu{i}"

    def enter(self, node: str, cwd: str | os.PathLike | None = None) -> list[str]:
        """The prefix that runs a command on ``node`` (in its namespaces), in ``cwd`` (entering a
        mount namespace starts at its root)."""
        wd = [f"--wd={os.path.abspath(cwd)}"] if cwd is not None else []
        return ["nsenter", "-t", str(self.holders[node].pid), "-n", "-u", "-m", *wd, "--"]

    def run(self, node: str, argv: list[str], *, cwd=None, **kwargs) -> subprocess.CompletedProcess:
        """``subprocess.run`` of ``argv`` on ``node`` (output captured as text unless told)."""
        if "stdout" not in kwargs and "stderr" not in kwargs:
            kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 60)
        return subprocess.run([*self.enter(node, cwd), *argv], **kwargs)

    def _config(self) -> str:
        r = self.root
        lines = [
            "ClusterName=spnetns",
            f"SlurmctldHost={self.nodes[0]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "MpiDefault=none",
            f"ProctrackType={self.confinement['proctrack']}",
            f"TaskPlugin={self.confinement['task_plugin']}",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd.%n.pid",
            f"StateSaveLocation={r}/spool/ctld",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.%n.log",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "DefMemPerCPU=500",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MinJobAge=300",
            "GresTypes=gpu",
            *(
                f"NodeName={n} NodeAddr={a} CPUs={self.cpus} RealMemory={self.mem_mb} Gres=gpu:{self.gpus}"
                " State=UNKNOWN"
                for n, a in self.address.items()
            ),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    # -- life cycle ------------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> NetnsSlurm:
        r = self.root
        for d in ("etc/slurm", "munge", "spool/ctld", "log", "run"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        (r / "etc" / "hosts").write_text(
            "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in self.address.items())
        )
        (r / "etc" / "slurm" / "slurm.conf").write_text(self._config())
        (r / "dev").mkdir()
        for i in range(self.gpus):
            os.mknod(self.gpu_device(i), 0o600 | stat.S_IFCHR, os.makedev(240, i))
        (r / "etc" / "slurm" / "gres.conf").write_text(
            "".join(f"Name=gpu File={self.gpu_device(i)}\n" for i in range(self.gpus))
        )
        if self.confinement["cgroup_conf"]:
            (r / "etc" / "slurm" / "cgroup.conf").write_text(self.confinement["cgroup_conf"])
        for node in self.nodes:
            ready = r / "run" / f"{node}.ready"
            script = (
                f"hostname {node} && ip link set lo up"
                f" && mount --bind {r}/etc/slurm /etc/slurm && mount --bind {r}/etc/hosts /etc/hosts"
                f" && mount --bind {r}/munge /run/munge && touch {ready} && exec sleep infinity"
            )
            self.holders[node] = subprocess.Popen(
                [
                    "unshare",
                    "--net",
                    "--uts",
                    "--mount",
                    "--propagation",
                    "private",
                    "--",
                    "sh",
                    "-c",
                    script,
                ],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._wait(lambda ready=ready: ready.exists(), 20, f"the namespaces of {node}")
            self.netns[os.stat(f"/proc/{self.holders[node].pid}/ns/net").st_ino] = node
        a, b = self.nodes
        self._check(self.run(a, ["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
                                 str(self.holders[b].pid)]))  # fmt: skip
        for node in self.nodes:
            self._check(self.run(node, ["ip", "addr", "add", f"{self.address[node]}/24", "dev", "eth0"]))
            self._check(self.run(node, ["ip", "link", "set", "eth0", "up"]))
        self._check(
            self.run(
                a,
                ["/usr/sbin/munged", f"--key-file={key}", "--socket=/run/munge/munge.socket.2",
                 f"--pid-file={r}/run/munged.pid", f"--log-file={r}/log/munged.log",
                 f"--seed-file={r}/run/munged.seed", "--force"],
            )
        )  # fmt: skip
        self._check(self.run(a, ["slurmctld"]))
        for node in self.nodes:
            self._check(self.run(node, ["slurmd"]))

        def idle() -> bool:
            out = self.run(a, ["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.split("\n")
            states = dict(line.split() for line in out if line.strip())
            return all(states.get(n) == "idle" for n in self.nodes)

        self._wait(idle, timeout_s, "both nodes idle in sinfo")
        return self

    def _wait(self, ok, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not reached within {timeout_s:.0f} s; logs in {self.log_dir}")
            time.sleep(0.25)

    @staticmethod
    def _check(res: subprocess.CompletedProcess) -> None:
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(res.args)} failed ({res.returncode}): {res.stderr.strip()}")

    def processes(self) -> list[tuple[int, str, str, str]]:
        """``(pid, node, name, command line)`` of every process in the nodes' network namespaces
        but the holders."""
        holders = {h.pid for h in self.holders.values()}
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in holders:
                continue
            try:
                node = self.netns.get(os.stat(f"/proc/{entry}/ns/net").st_ino)
                if node is None:
                    continue
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                name = Path(f"/proc/{entry}/comm").read_text().strip()
                state = next(
                    (
                        x
                        for x in Path(f"/proc/{entry}/status").read_text().splitlines()
                        if x.startswith("State:")
                    ),
                    "",
                )
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            if "zombie" not in state:
                found.append((int(entry), node, name, cmd))
        return found

    def leftovers(self) -> list[tuple[int, str, str, str]]:
        """The processes in the nodes' namespaces other than the cluster's daemons."""
        return [p for p in self.processes() if p[2] not in DAEMONS]

    def _remove_cgroups(self) -> None:
        """The nodes' SLURM cgroups (``slurm_<node>`` in each v1 hierarchy), deepest first; their
        processes have ended."""
        for node in self.nodes:
            for top in CGROUP_V1.glob(f"*/slurm_{node}"):
                for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        d.rmdir()
                with contextlib.suppress(OSError):
                    top.rmdir()

    def stop(self, keep_logs: Path | None = None) -> None:
        """End every process of the nodes, then the holders; remove the cluster's directory (its
        logs copied to ``keep_logs`` first, when given)."""
        try:
            if self.netns:
                for signum, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
                    for pid, *_ in self.processes():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signum)
                    deadline = time.monotonic() + wait_s
                    while self.processes() and time.monotonic() < deadline:
                        time.sleep(0.2)
        finally:
            for holder in self.holders.values():
                if holder.poll() is None:
                    holder.kill()
                holder.wait()
            self._remove_cgroups()
            if keep_logs is not None and self.log_dir.exists():
                shutil.copytree(self.log_dir, keep_logs, dirs_exist_ok=True)
            shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running_cluster(logs: Path):
    """A started two-node cluster, stopped on exit with its logs kept under ``logs``; the test is
    skipped, naming why, where the namespaces cannot start here."""
    import pytest

    problem = netns_problem()
    if problem:
        pytest.skip(f"a two-node SLURM in network namespaces cannot start here: {problem}")
    slurm = NetnsSlurm()
    try:
        yield slurm.start()
    finally:
        slurm.stop(keep_logs=logs)
