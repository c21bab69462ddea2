"""The R3-RAG judge served on GPUs of the training node (sglang's OpenAI-compatible server).

The training job of an ``r3rag`` variant with the LLM judge and no configured URL sets aside the
last ``judge.gpus`` of the node's visible GPUs (:func:`split_gpus`), starts the judge there
(:func:`running_judge`, bound to 127.0.0.1) and trains on the others. The server runs in its own
process group and is stopped, with everything it started, when the job ends or fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from spader.scorers.judge import JudgeUnavailableError

__all__ = ["judge_server_command", "running_judge", "split_gpus", "visible_gpus"]

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


def judge_server_command(
    model_dir: str | os.PathLike,
    *,
    port: int,
    gpus: int,
    tensor_parallel: int,
    served_name: str,
    mem_fraction: float,
) -> list[str]:
    """sglang's server on 127.0.0.1 for the judge model: ``gpus / tensor_parallel`` data-parallel
    replicas of ``tensor_parallel`` GPUs each (a 14B judge fits on one GPU, so replicas serve more
    requests at once than one model split over all of them).

    >>> judge_server_command("/m", port=1, gpus=4, tensor_parallel=2, served_name="j", mem_fraction=0.8)[-4:]
    ['--dp-size', '2', '--mem-fraction-static', '0.8']
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
        "127.0.0.1",
        "--port",
        str(port),
        "--tp-size",
        str(tensor_parallel),
        "--dp-size",
        str(gpus // tensor_parallel),
        "--mem-fraction-static",
        str(mem_fraction),
    ]


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
) -> Iterator[str]:
    """Start the judge server on ``gpus``, wait until ``GET /v1/models`` answers, stop it on exit.

    Args:
        model_dir: local directory of the judge model.
        gpus: GPU ids the server may use (``CUDA_VISIBLE_DEVICES`` of its process).
        served_name: model name the endpoint serves (the client asks for it).
        startup_timeout_s: how long loading may take.
        mem_fraction: sglang's static memory fraction on those GPUs.
        tensor_parallel: GPUs per replica.
        log_path: file the server's output is appended to (default: a temporary file).
        command: replaces the sglang command; ``{port}`` in an argument is filled in (tests run a
            CPU stand-in server through it).
    Yields:
        The OpenAI base URL, ``http://127.0.0.1:<port>/v1``.
    Raises:
        JudgeUnavailableError: the server exited or did not answer in time (the end of its log
            is in the message).
    """
    port = _free_port()
    if command is None:
        cmd = judge_server_command(
            model_dir,
            port=port,
            gpus=len(gpus),
            tensor_parallel=tensor_parallel,
            served_name=served_name,
            mem_fraction=mem_fraction,
        )
    else:
        cmd = [str(a).replace("{port}", str(port)) for a in command]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
    with tempfile.TemporaryDirectory(prefix="spader-judge-") as tmp:
        log_file = Path(log_path) if log_path else Path(tmp) / "judge.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        base = f"http://127.0.0.1:{port}/v1"
        log.info("starting judge server on GPUs %s (pid %d, log %s)", ",".join(gpus), proc.pid, log_file)
        try:
            _wait_ready(proc, base, log_file, startup_timeout_s)
            log.info("judge server ready at %s", base)
            yield base
        finally:
            _stop(proc)
            log.info("judge server stopped")


def _wait_ready(proc: subprocess.Popen, base: str, log_file: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                raise JudgeUnavailableError(
                    f"judge server exited with code {code} before answering; log {log_file}:\n{_tail(log_file)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{base}/models").status_code == 200:
                    return
            time.sleep(0.5)
    _stop(proc)
    raise JudgeUnavailableError(
        f"judge server did not answer {base}/models within {timeout:.0f} s; log {log_file}:\n{_tail(log_file)}"
    )
