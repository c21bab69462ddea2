"""The R3-RAG judge served on GPUs of the training node (sglang's OpenAI-compatible server).

The training job of an ``r3rag`` variant with the LLM judge and no configured URL sets aside the
last ``judge.gpus`` of the node's visible GPUs (:func:`split_gpus`), starts the judge there
(:func:`running_judge`, bound to 127.0.0.1) and trains on the others. The server runs in its own
process group and is stopped, with everything it started, when the job ends or fails.

A training job over several nodes serves the judge on a node of its own instead: ``launcher``
(``srun ... --nodelist=<node>``) starts the same server there, bound to that node's address on the
network the nodes share (``host``) rather than to loopback, and the job's API key is what keeps
other clients out.

The server's port is found by binding port 0 and releasing it, so another process may take it
before sglang binds it; and any process of the node can listen on 127.0.0.1. Before the job uses
the endpoint it therefore checks that the server answering is the one it started:

* an API key made for this job alone (``secrets``) is given to sglang (``--api-key``) and to the
  judge's client (the environment variable :data:`spader.scorers.judge.JUDGE_KEY_ENV` of verl's
  processes); the server must list the served model name under ``/v1/models`` when asked with the
  key, and refuse the same request without it (a server that answers anyone was not started
  with this key);
* where the operating system says which process listens on the port (Linux, through psutil), it
  must be the server this job started or one of its children.

Anything else answering on the port is refused with :class:`JudgeUnavailableError` naming the
port and what answered; the job's own server is then stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from spader.scorers.judge import JUDGE_KEY_ENV, JudgeUnavailableError

__all__ = ["JudgeEndpoint", "judge_server_command", "running_judge", "split_gpus", "visible_gpus"]

log = logging.getLogger(__name__)


def visible_gpus(environ: Mapping[str, str], count: int) -> list[str]:
    """The GPU ids this job may use: ``CUDA_VISIBLE_DEVICES`` when set (SLURM sets it), else
    ``0..count-1``."""
    listed = [g.strip() for g in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return listed if listed else [str(i) for i in range(count)]


def split_gpus(gpus: Sequence[str], judge_gpus: int) -> tuple[list[str], list[str]]:
    """``(training, judge)``: the judge takes the last ``judge_gpus`` ids, training the rest.

    >>> split_gpus(["0", "1", "2", "3"], 1)
    (['0', '1', '2'], ['3'])
    """
    if judge_gpus < 1 or judge_gpus >= len(gpus):
        raise ValueError(
            f"judge.gpus must be between 1 and {len(gpus) - 1} on a node with {len(gpus)} GPUs "
            f"(training needs at least one), got {judge_gpus}"
        )
    return list(gpus[:-judge_gpus]), list(gpus[-judge_gpus:])


@dataclass(frozen=True)
class JudgeEndpoint:
    """A judge server this job started and checked: its OpenAI base URL and its API key."""

    url: str
    api_key: str

    def env(self) -> dict[str, str]:
        """The environment that gives the key to the judge's client in verl's processes."""
        return {JUDGE_KEY_ENV: self.api_key}


def judge_server_command(
    model_dir: str | os.PathLike,
    *,
    port: int,
    gpus: int,
    tensor_parallel: int,
    served_name: str,
    mem_fraction: float,
    api_key: str,
    host: str = "127.0.0.1",
) -> list[str]:
    """sglang's server on ``host`` (default 127.0.0.1) for the judge model: ``gpus / tensor_parallel`` data-parallel
    replicas of ``tensor_parallel`` GPUs each (a 14B judge fits on one GPU, so replicas serve more
    requests at once than one model split over all of them), answering only requests that carry
    ``api_key``.

    >>> judge_server_command("/m", port=1, gpus=4, tensor_parallel=2, served_name="j", mem_fraction=0.8,
    ...                      api_key="k")[-6:]
    ['--dp-size', '2', '--mem-fraction-static', '0.8', '--api-key', 'k']
    """
    if gpus < 1 or tensor_parallel < 1 or gpus % tensor_parallel:
        raise ValueError(
            f"judge.gpus ({gpus}) must be a positive multiple of judge.tensor_parallel ({tensor_parallel})"
        )
    return [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        os.path.abspath(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(tensor_parallel),
        "--dp-size",
        str(gpus // tensor_parallel),
        "--mem-fraction-static",
        str(mem_fraction),
        "--api-key",
        api_key,
    ]


def new_api_key() -> str:
    """A fresh key for one job's judge server: 64 hex digits. Never starts with ``-``, which a
    command-line parser (sglang's included) would read as an option rather than as the value of
    ``--api-key``; URL-safe base64 keys do so once in 64.

    >>> key = new_api_key()
    >>> len(key), set(key) <= set("0123456789abcdef")
    (64, True)
    """
    return secrets.token_hex(32)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        log.warning("judge server did not stop within %.0f s of SIGTERM; killing it", grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def running_judge(
    model_dir: str | os.PathLike,
    *,
    gpus: Sequence[str],
    served_name: str,
    startup_timeout_s: float,
    mem_fraction: float = 0.85,
    tensor_parallel: int = 1,
    log_path: str | os.PathLike | None = None,
    command: Sequence[str] | None = None,
    host: str = "127.0.0.1",
    launcher: Sequence[str] = (),
) -> Iterator[JudgeEndpoint]:
    """Start the judge server on ``gpus``, wait until it answers ``GET /v1/models`` as the server
    this job started (module doc: served name, API key, the process on the port), stop it on exit.

    Args:
        model_dir: local directory of the judge model.
        gpus: GPU ids the server may use (``CUDA_VISIBLE_DEVICES`` of its process).
        served_name: model name the endpoint serves (the client asks for it).
        startup_timeout_s: how long loading may take.
        mem_fraction: sglang's static memory fraction on those GPUs.
        tensor_parallel: GPUs per replica.
        log_path: file the server's output is appended to (default: a temporary file).
        command: replaces the sglang command; ``{port}``, ``{api_key}`` and ``{host}`` in an argument
            are filled in (tests run a CPU stand-in server through it).
        host: the address the server binds and the client uses (another node's, with ``launcher``).
        launcher: a command prefix that runs the server elsewhere (``srun`` onto another node of the
            allocation; its port is then chosen here and checked by the API key alone).
    Yields:
        The endpoint: the OpenAI base URL ``http://<host>:<port>/v1`` and the job's API key.
    Raises:
        JudgeUnavailableError: the server exited or did not answer in time (the end of its log
            is in the message), or something other than this job's server answers on its port.
    """
    port = _free_port()
    key = new_api_key()
    cmd = _command(model_dir, command, port, key, host, gpus, tensor_parallel, served_name, mem_fraction)
    with tempfile.TemporaryDirectory(prefix="spader-judge-") as tmp:
        log_file = Path(log_path) if log_path else Path(tmp) / "judge.log"
        proc = _start_server([*launcher, *cmd], gpus, log_file)
        base = f"http://{_url_host(host)}:{port}/v1"
        log.info("starting judge server on GPUs %s (pid %d, log %s)", ",".join(gpus), proc.pid, log_file)
        try:
            _wait_ready(proc, base, key, served_name, log_file, startup_timeout_s)
            log.info("judge server ready at %s (served model %s, checked)", base, served_name)
            yield JudgeEndpoint(base, key)
        finally:
            _stop(proc)
            log.info("judge server stopped")


def _command(
    model_dir: str | os.PathLike,
    command: Sequence[str] | None,
    port: int,
    key: str,
    host: str,
    gpus: Sequence[str],
    tensor_parallel: int,
    served_name: str,
    mem_fraction: float,
) -> list[str]:
    """The server's command: sglang's, or ``command`` with its placeholders filled in."""
    if command is not None:
        return [
            str(a).replace("{port}", str(port)).replace("{api_key}", key).replace("{host}", host)
            for a in command
        ]
    return judge_server_command(
        model_dir,
        port=port,
        gpus=len(gpus),
        tensor_parallel=tensor_parallel,
        served_name=served_name,
        mem_fraction=mem_fraction,
        api_key=key,
        host=host,
    )


def _start_server(cmd: list[str], gpus: Sequence[str], log_file: Path) -> subprocess.Popen:
    """The server's process, started in its own session on ``gpus``, its output appended to ``log_file``."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _listener(port: int, *, tries: int = 5) -> int | None:
    """The pid of the process listening on 127.0.0.1:``port`` (or on every address), -1 when the
    system does not say (another user's process), None when nothing listens or it cannot be asked.

    psutil finds a socket's process by scanning ``/proc/<pid>/fd``; a scan that races with a
    process opening files can miss it, so an unknown owner is looked up again a few times."""
    import psutil

    for attempt in range(tries):
        try:
            conns = psutil.net_connections(kind="tcp")
        except (psutil.AccessDenied, OSError):
            return None
        listening = [
            c
            for c in conns
            if c.status == psutil.CONN_LISTEN
            and c.laddr
            and c.laddr.port == port
            and c.laddr.ip in ("127.0.0.1", "0.0.0.0", "::", "::1", "::ffff:127.0.0.1")
        ]
        if not listening:
            return None
        if listening[0].pid is not None:
            return listening[0].pid
        if attempt < tries - 1:
            time.sleep(0.2)
    return -1


def _ours(proc: subprocess.Popen, pid: int) -> bool:
    import psutil

    if pid == proc.pid:
        return True
    try:
        return pid in {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return False


def _identity_problem(
    client: httpx.Client, proc: subprocess.Popen, base: str, port: int, key: str, served_name: str
) -> tuple[bool, str | None]:
    """``(answered, problem)``: whether a server answered, and why it is not this job's server
    (None: it is). Not answering yet (connection refused, still loading) is ``(False, None)``."""
    try:
        keyed = client.get(f"{base}/models", headers={"Authorization": f"Bearer {key}"})
    except httpx.HTTPError:
        return False, None
    if keyed.status_code in (401, 403):
        return (
            True,
            f"it refuses this job's API key (HTTP {keyed.status_code}): a server started with another key",
        )
    if keyed.status_code != 200:
        return False, None  # starting up (sglang answers 503 while it loads)
    try:
        served = [str(m.get("id")) for m in keyed.json().get("data", [])]
    except (ValueError, AttributeError, TypeError):
        return True, f"its /v1/models answer is not an OpenAI model list: {keyed.text[:200]!r}"
    if served_name not in served:
        return True, f"it serves {served}, not '{served_name}'"
    with contextlib.suppress(httpx.HTTPError):
        open_ = client.get(f"{base}/models")
        if open_.status_code == 200:
            return True, "it answers without this job's API key: it was not started with it"
    holder = _listener(port)
    if holder == -1:
        return True, "the port is held by a process of another user"
    if holder is not None and not _ours(proc, holder):
        return (
            True,
            f"the port is held by process {holder}, not the judge server this job started (pid {proc.pid})",
        )
    return True, None


def _wait_ready(
    proc: subprocess.Popen, base: str, key: str, served_name: str, log_file: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    port = int(base.rsplit(":", 1)[1].split("/", 1)[0])
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                raise JudgeUnavailableError(
                    f"judge server exited with code {code} before answering; log {log_file}:\n{_tail(log_file)}"
                )
            answered, problem = _identity_problem(client, proc, base, port, key, served_name)
            if problem is not None:
                _stop(proc)
                raise JudgeUnavailableError(
                    f"something other than this job's judge server answers on port {port} ({base}): "
                    f"{problem}. Refused; the job's server (pid {proc.pid}) is stopped. Rerun the job "
                    f"(it picks another port); log {log_file}"
                )
            if answered:
                return
            time.sleep(0.5)
    _stop(proc)
    raise JudgeUnavailableError(
        f"judge server did not answer {base}/models within {timeout:.0f} s; log {log_file}:\n{_tail(log_file)}"
    )
