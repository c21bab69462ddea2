"""The retrieval service on every node of a multi-node training job.

verl places its agent-loop workers, and with them the search tool, on every Ray node (round-robin
over the nodes, ``AgentLoopManager._init_agent_loop_workers``). A service on the first node's
loopback is out of reach for the other nodes, and a service listening on the nodes' network would
let anyone on that network search through it. So every training node runs a replica of its own,
bound to its own loopback as on one node:

* the job runs ``python -m spader.training.node_search`` on each training node as a step of its
  allocation (``srun --overlap``, :func:`node_replicas`), the first node included; it starts the
  retrieval service there with the job's settings (its reranker on that node's GPUs, one replica
  per GPU as on a single node) and writes its host name and URL to ``<workdir>/search/<node>.json``
  (the shared file system);
* the search tool's YAML maps every host name to its node's URL, and each tool instance uses the
  one of the host it runs on (:func:`spader.integrations.verl.search_tool.service_url`), so a worker
  only ever talks to its own node's loopback.

**Health.** Each replica is judged on its node as a single node's service is judged by the job
(:class:`spader.training.watch.ServiceHealth`: its process, its silence, the failed share of its
queries), every :data:`spader.training.watch.SERVICE_CHECK_S` seconds; the verdict and the
service's counters go into the status file, which the job's watch reads (:class:`RelayedHealth`).
A replica that reports a problem, whose step exits or whose status is not refreshed for five
minutes stops the training, as a failing service does on one node.

**Stop.** When the training ends the job creates ``<workdir>/search/stop``: each replica writes its
final counters into its status file, stops its service and exits. Steps still running after the
grace period get SIGTERM through ``srun``, and SLURM ends them with the allocation in any case; a
replica's service also exits when its ``node_search`` process dies
(:func:`spader.retrieval.service.exit_with_parent`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from spader.retrieval.backend import SearchSettings

log = logging.getLogger(__name__)

__all__ = [
    "SEARCH_DIR",
    "NodeReplicas",
    "RelayedHealth",
    "main",
    "node_replicas",
    "read_status",
    "serve_node",
    "write_spec",
]

#: The work directory's sub-directory of the node replicas' spec, status files, logs and stop file.
SEARCH_DIR = "search"
_POLL_S = 1.0  # how often a replica looks for the stop file


def write_spec(
    path: str | os.PathLike,
    *,
    index_dir: str | os.PathLike,
    search: SearchSettings,
    threads: int,
    max_error_rate: float,
    check_s: float,
    stop_file: str | os.PathLike,
) -> Path:
    """The settings every node's replica starts with (one JSON file on the shared file system)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    spec = {
        "index_dir": os.path.abspath(index_dir),
        "search": dataclasses.asdict(search),
        "threads": int(threads),
        "max_error_rate": float(max_error_rate),
        "check_s": float(check_s),
        "stop_file": os.path.abspath(stop_file),
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_status(path: str | os.PathLike) -> dict[str, Any] | None:
    """A node replica's status (None while it has written none)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _write_status(path: Path, status: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(status, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _stats(url: str) -> dict[str, Any] | None:
    import httpx

    try:
        return httpx.get(f"{url}/stats", timeout=10.0, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return None


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def serve_node(
    spec_path: str | os.PathLike, status_path: str | os.PathLike, log_path: str | os.PathLike
) -> int:
    """The body of a node's replica (``python -m spader.training.node_search``): start the
    retrieval service on this node's loopback, report its URL, judge its health every
    ``check_s`` seconds and report that too, until the stop file appears, SIGTERM, or a problem.

    Returns:
        0 after a stop, 1 when the service became unusable (the status says why).
    """
    from spader.infra.procs import Terminated, raise_on_signals
    from spader.retrieval.service import running_service
    from spader.training.watch import ServiceHealth

    spec = json.loads(Path(spec_path).read_text())
    status_path = Path(status_path)
    stop_file = Path(spec["stop_file"])
    host = socket.gethostname()
    search = SearchSettings(**spec["search"])
    status: dict[str, Any] = {"host": host, "pid": os.getpid(), "url": None, "problem": None}
    try:
        with (
            raise_on_signals(),
            running_service(spec["index_dir"], search, log_path=log_path, threads=spec["threads"]) as url,
        ):
            health = ServiceHealth(
                url, max_error_rate=spec["max_error_rate"], label=f"the retrieval service on {host} ({url})"
            )
            status.update(url=url, service_pid=health.pid, time=time.time(), stats=_stats(url))
            _write_status(status_path, status)
            log.info("retrieval replica on %s ready at %s", host, url)
            try:
                next_check = time.monotonic() + spec["check_s"]
                while not stop_file.exists():
                    time.sleep(_POLL_S)
                    if time.monotonic() < next_check:
                        continue
                    next_check = time.monotonic() + spec["check_s"]
                    problem = health.problem()
                    status.update(time=time.time(), problem=problem, stats=_stats(url) or status.get("stats"))
                    _write_status(status_path, status)
                    if problem:
                        log.error("%s", problem)
                        return 1
                log.info("retrieval replica on %s: the job asked it to stop", host)
                return 0
            finally:  # the last counters, before running_service stops the service
                status.update(time=time.time(), stats=_stats(url) or status.get("stats"), stopped=True)
                _write_status(status_path, status)
    except Terminated as t:
        log.info("retrieval replica on %s: %s, stopped", host, t)
        return 0
    except Exception as exc:
        status.update(time=time.time(), problem=f"the retrieval service on {host} failed: {exc}")
        _write_status(status_path, status)
        raise


class RelayedHealth:
    """A node's replica as the job's watch sees it: what its ``node_search`` process reported, and
    whether that process (its ``srun`` step) still runs.

    Args:
        node: the node's name.
        status_path: its status file.
        proc: its ``srun`` step.
        log_path: its log (named in the messages).
        max_silence_s: how long the status may go without a refresh before the replica counts as hung
            (measured on this node's clock, from when it last saw the status change: the nodes'
            clocks need not agree).
    """

    def __init__(
        self,
        node: str,
        status_path: Path,
        proc: subprocess.Popen,
        log_path: Path,
        *,
        max_silence_s: float = 300.0,
    ):
        self.node = node
        self.status_path = Path(status_path)
        self.proc = proc
        self.log_path = Path(log_path)
        self.max_silence_s = max_silence_s
        self._reported: tuple[Any, float] | None = None  # the last report seen, and when (monotonic)

    def problem(self) -> str | None:
        """Why the node's replica is unusable now, or None."""
        status = read_status(self.status_path) or {}
        if status.get("problem"):
            return str(status["problem"])
        code = self.proc.poll()
        if code is not None:
            return (
                f"the retrieval service on node {self.node} stopped (its srun step exited with code {code}; "
                f"log {self.log_path})"
            )
        reported = status.get("time")
        if reported is None:
            return None
        now = time.monotonic()
        if self._reported is None or self._reported[0] != reported:
            self._reported = (reported, now)
        silent = now - self._reported[1]
        if silent > self.max_silence_s:
            return f"the retrieval service on node {self.node} has not reported for {silent:.0f} s"
        return None


@dataclasses.dataclass
class NodeReplicas:
    """The replicas started on the job's nodes (:func:`node_replicas`)."""

    nodes: list[str]
    directory: Path
    startup_timeout_s: float
    procs: list[subprocess.Popen] = dataclasses.field(default_factory=list)
    max_silence_s: float = 300.0

    @property
    def stop_file(self) -> Path:
        return self.directory / "stop"

    def status_path(self, node: str) -> Path:
        """The node's status: host name, URL, the last health verdict and the service's counters."""
        return self.directory / f"{node}.json"

    def log_path(self, node: str) -> Path:
        """The output of the node's ``node_search`` step."""
        return self.directory / f"{node}.log"

    def service_log_path(self, node: str) -> Path:
        """The output of the node's retrieval service."""
        return self.directory / f"{node}.service.log"

    def wait_ready(self) -> dict[str, str]:
        """Until every replica reported its URL; returns ``{host name: URL}``.

        Raises:
            ServiceError: a replica's step exited, or one did not report within the start-up
                timeout (``retrieval.service.startup_timeout_s``); the message shows its log's end.
        """
        from spader.retrieval.errors import ServiceError

        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            ready: dict[str, dict] = {}
            for node, proc in zip(self.nodes, self.procs, strict=True):
                status = read_status(self.status_path(node)) or {}
                if status.get("url") and not status.get("problem"):
                    ready[node] = status
                elif proc.poll() is not None or status.get("problem"):
                    why = status.get("problem") or f"its srun step exited with code {proc.returncode}"
                    raise ServiceError(
                        f"the retrieval service on node {node} did not start ({why}); end of its log "
                        f"({self.log_path(node)}):\n{_tail(self.log_path(node))}"
                    )
            if len(ready) == len(self.nodes):
                urls = {status["host"]: status["url"] for status in ready.values()}
                if len(urls) < len(ready):
                    hosts = {node: status["host"] for node, status in ready.items()}
                    raise ServiceError(
                        f"the nodes' replicas report host names {hosts}: the search tool finds its "
                        "node's replica by host name, so every node needs a name of its own"
                    )
                return urls
            if time.monotonic() > deadline:
                late = [n for n in self.nodes if not (read_status(self.status_path(n)) or {}).get("url")]
                raise ServiceError(
                    f"the retrieval service on node(s) {', '.join(late)} did not report ready within "
                    f"{self.startup_timeout_s:.0f} s (retrieval.service.startup_timeout_s); end of the "
                    f"log of {late[0]} ({self.log_path(late[0])}):\n{_tail(self.log_path(late[0]))}"
                )
            time.sleep(0.5)

    def healths(self) -> list[RelayedHealth]:
        """One :class:`RelayedHealth` per node, for the job's watch."""
        return [
            RelayedHealth(
                node, self.status_path(node), proc, self.log_path(node), max_silence_s=self.max_silence_s
            )
            for node, proc in zip(self.nodes, self.procs, strict=True)
        ]


def _start_replica(replicas: NodeReplicas, node: str, spec: Path, step: Mapping[str, int] | None = None
                   ) -> subprocess.Popen:  # fmt: skip
    """The ``node_search`` step of ``node`` (``srun``, asking for ``step``) serving ``spec``; returns
    its process."""
    from spader.training.ray_cluster import srun_on

    argv = [
        *srun_on(node, **(step or {})),
        sys.executable,
        "-m",
        "spader.training.node_search",
        "--spec",
        str(spec),
        "--status",
        str(replicas.status_path(node)),
        "--log",
        str(replicas.service_log_path(node)),
    ]
    with open(replicas.log_path(node), "ab") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


@contextlib.contextmanager
def node_replicas(
    nodes: Sequence[str],
    *,
    index_dir: str | os.PathLike,
    search: SearchSettings,
    threads: int,
    max_error_rate: float,
    directory: str | os.PathLike,
    check_s: float | None = None,
    grace_s: float = 30.0,
    step: Mapping[str, int] | None = None,
) -> Iterator[NodeReplicas]:
    """Start a retrieval replica on each of ``nodes`` (steps of this allocation); stop them on exit.

    The block is entered as soon as the steps are started; :meth:`NodeReplicas.wait_ready` waits
    until they serve.

    Args:
        nodes: the allocation's training nodes.
        index_dir: the index every replica serves (on the shared file system).
        search: the search and service settings (the reranker's devices are each node's own GPUs).
        threads: search and CPU reranking threads of each replica.
        max_error_rate: ``training.max_search_error_rate``, judged on each node.
        directory: where the spec, the status files, the logs and the stop file go (the work
            directory's ``search/``).
        check_s: seconds between two health checks on a node (default
            :data:`spader.training.watch.SERVICE_CHECK_S`).
        grace_s: seconds the replicas get to stop after the stop file, and between SIGTERM and
            SIGKILL after that.
        step: what each replica's step asks SLURM for (CPUs, memory:
            :func:`spader.training.ray_cluster.step_request`; None: SLURM's default).
    """
    from spader.training.watch import SERVICE_CHECK_S

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    replicas = NodeReplicas(list(nodes), directory, float(search.startup_timeout_s))
    for stale in [replicas.stop_file, *(replicas.status_path(n) for n in nodes)]:  # an earlier attempt's
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    spec = write_spec(
        directory / "spec.json",
        index_dir=index_dir,
        search=search,
        threads=threads,
        max_error_rate=max_error_rate,
        check_s=SERVICE_CHECK_S if check_s is None else check_s,
        stop_file=replicas.stop_file,
    )
    try:
        for node in nodes:
            replicas.procs.append(_start_replica(replicas, node, spec, step))
            log.info("retrieval replica on %s starting (log %s)", node, replicas.log_path(node))
        yield replicas
    finally:
        replicas.stop_file.touch()
        _stop(replicas.procs, grace_s)
        log.info("retrieval replicas on %s stopped", ", ".join(nodes))


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    """Wait ``grace_s`` for the steps to end after the stop file, then SIGTERM them (``srun``
    passes it on), then SIGKILL."""
    for signum in (None, signal.SIGTERM, signal.SIGKILL):
        if signum is not None:
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signum)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        if all(p.poll() is not None for p in procs):
            return
    for p in procs:
        p.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spader.training.node_search --spec FILE --status FILE --log FILE``."""
    parser = argparse.ArgumentParser(prog="python -m spader.training.node_search")
    parser.add_argument("--spec", required=True, help="the replicas' settings (written by the job)")
    parser.add_argument("--status", required=True, help="where this node's status goes")
    parser.add_argument("--log", required=True, help="the service's log")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health check
    return serve_node(args.spec, args.status, args.log)


if __name__ == "__main__":
    sys.exit(main())
