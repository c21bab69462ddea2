"""Run the retrieval service: in the foreground (:func:`serve`, the ``serve`` CLI) or as a
subprocess for the duration of a job (:func:`running_service`, used by the train and evaluate glue).
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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from spader.retrieval.backend import SearchSettings
from spader.retrieval.errors import ServiceError

log = logging.getLogger(__name__)

__all__ = ["running_service", "serve", "serve_command"]

_STOP_GRACE_S = 30.0


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def serve(
    index_dir: str | os.PathLike,
    settings: SearchSettings,
    *,
    host: str | None = None,
    port: int = 8000,
    port_file: str | os.PathLike | None = None,
    threads: int = 1,
    device: str | None = None,
) -> None:
    """Serve ``index_dir`` until interrupted (SIGINT/SIGTERM).

    The index is checked before anything else, so a missing or corrupt index stops the start
    with :class:`~spader.retrieval.errors.IndexUnavailableError` naming the path.

    Args:
        index_dir: Lucene index with raw documents.
        settings: search settings (``settings.host`` unless ``host`` is given).
        host: bind address (default ``settings.host``, 127.0.0.1).
        port: TCP port; 0 picks a free one.
        port_file: where the bound port is written (for ``port=0``; written before start-up).
        threads: search and CPU reranking threads.
        device: reranker device (default: first GPU, else CPU).
    """
    import uvicorn

    from spader.retrieval.app import create_app
    from spader.retrieval.backend import Bm25RerankBackend
    from spader.retrieval.index import verify_index

    verify_index(index_dir)
    sock = _bind(host or settings.host, port)
    bound = sock.getsockname()[1]
    if port_file is not None:
        tmp = Path(str(port_file) + ".tmp")
        tmp.write_text(str(bound))
        os.replace(tmp, port_file)
    log.info("retrieval service for %s on %s:%d (loading)", index_dir, host or settings.host, bound)
    app = create_app(lambda: Bm25RerankBackend(index_dir, settings, threads=threads, device=device))
    config = uvicorn.Config(app, log_level="info", access_log=False, timeout_graceful_shutdown=10)
    uvicorn.Server(config).run(sockets=[sock])


def serve_command(
    index_dir: str | os.PathLike,
    settings: SearchSettings,
    *,
    port: int = 0,
    port_file: str | os.PathLike | None = None,
    threads: int = 1,
) -> list[str]:
    """The ``python -m spader.retrieval serve ...`` command line carrying ``settings``."""
    flags = {
        "--index": index_dir,
        "--host": settings.host,
        "--port": port,
        "--threads": threads,
        "--reranker": settings.reranker or "none",
        "--k1": settings.k1,
        "--b": settings.b,
        "--initial-k": settings.initial_k,
        "--topk": settings.topk,
        "--batch-size": settings.rerank_batch_size,
        "--max-length": settings.rerank_max_length,
        "--max-queries": settings.max_queries_per_request,
        "--max-query-chars": settings.max_query_chars,
    }
    if port_file is not None:
        flags["--port-file"] = port_file
    cmd = [sys.executable, "-m", "spader.retrieval", "serve", "--fp16" if settings.fp16 else "--no-fp16"]
    for flag, value in flags.items():
        cmd += [flag, str(value)]
    return cmd


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # the whole group: the JVM's threads live in the child itself
    try:
        proc.wait(_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        log.warning(
            "retrieval service (pid %d) ignored SIGTERM for %.0f s; killing it", proc.pid, _STOP_GRACE_S
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def running_service(
    index_dir: str | os.PathLike,
    settings: Mapping[str, Any],
    *,
    log_path: str | os.PathLike | None = None,
    threads: int | None = None,
) -> Iterator[str]:
    """Start the service as a subprocess, wait until ``/health`` answers, stop it on exit.

    Args:
        index_dir: Lucene index with raw documents (a prebuilt one is checked the same way).
        settings: ``config["retrieval"]`` as the rules pass it (``params.retrieval``), with
            ``settings["reranker"]["path"]`` the resolved local model directory.
        log_path: file the service's output is appended to (default: a temporary file, shown
            in the error when the start fails).
        threads: search and CPU reranking threads (default 1).

    Yields:
        The base URL, ``http://127.0.0.1:<free port>``.

    Raises:
        ServiceError: the service exited or was not healthy within
            ``settings["service"]["startup_timeout_s"]``; the message names the index and shows
            the end of the service log.
    """
    search = SearchSettings.from_config(settings)
    connect_host = "127.0.0.1" if search.host in ("0.0.0.0", "") else search.host
    if ":" in connect_host:
        connect_host = "::1" if connect_host == "::" else connect_host
        connect_host = f"[{connect_host}]"
    with tempfile.TemporaryDirectory(prefix="spader-retrieval-") as tmp:
        port_file = Path(tmp) / "port"
        log_file = Path(log_path) if log_path else Path(tmp) / "service.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        cmd = serve_command(index_dir, search, port=0, port_file=port_file, threads=threads or 1)
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        log.info("starting retrieval service for %s (pid %d, log %s)", index_dir, proc.pid, log_file)
        try:
            url = _wait_ready(proc, port_file, connect_host, index_dir, log_file, search.startup_timeout_s)
            log.info("retrieval service ready at %s", url)
            yield url
        finally:
            _stop(proc)
            log.info("retrieval service for %s stopped", index_dir)


def _wait_ready(proc, port_file: Path, host: str, index_dir, log_file: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    url = None
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise ServiceError(
                f"retrieval service for index {index_dir} exited with code {code} before it was ready; "
                f"end of its log ({log_file}):\n{_tail(log_file)}"
            )
        if url is None and port_file.exists():
            url = f"http://{host}:{int(port_file.read_text())}"
        if url is not None and _healthy(url):
            return url
        time.sleep(0.25)
    raise ServiceError(
        f"retrieval service for index {index_dir} was not healthy after {timeout:.0f} s "
        f"(retrieval.service.startup_timeout_s); end of its log ({log_file}):\n{_tail(log_file)}"
    )
