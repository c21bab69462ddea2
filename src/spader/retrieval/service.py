"""Run the retrieval service: in the foreground (:func:`serve`, the ``serve`` CLI) or as a
subprocess for the duration of a job (:func:`running_service`, used by the train and evaluate glue).

A service started for a job never outlives it: :func:`running_service` stops it when the job
leaves the ``with`` block (also on an exception or SIGTERM), and the service itself exits when the
job's process dies in any way, SIGKILL included: it asks Linux for SIGTERM when its parent dies
(``PR_SET_PDEATHSIG``) and a watchdog thread checks once a second that its parent is still the
process that started it (for systems without that call, and for the moment before it is made).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from spader.infra.atomic import atomic_write
from spader.retrieval.backend import SearchSettings
from spader.retrieval.client import RetrievalClient
from spader.retrieval.errors import ServiceError

log = logging.getLogger(__name__)

__all__ = [
    "connected_client",
    "exit_with_parent",
    "reranker_on_job_gpus",
    "running_service",
    "serve",
    "serve_command",
]

_STOP_GRACE_S = 30.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_ORPHAN_GRACE_S = 20.0  # after SIGTERM, an orphaned service that has not exited is ended hard


def exit_with_parent(parent_pid: int, *, poll_s: float = 1.0) -> None:
    """Make this process exit when ``parent_pid`` (the job that started it) dies.

    Linux sends SIGTERM when the parent dies (``PR_SET_PDEATHSIG``; the server then shuts down
    gracefully); a daemon thread also compares ``os.getppid()`` with ``parent_pid`` every
    ``poll_s`` seconds, which covers a parent that died before the call and systems without
    ``prctl``. An orphan still running ``_ORPHAN_GRACE_S`` seconds after its SIGTERM exits hard.

    Args:
        parent_pid: the pid of the process that started this one.
        poll_s: watchdog period in seconds.
    """
    import ctypes
    import threading

    with contextlib.suppress(OSError, AttributeError):  # not Linux: the watchdog alone
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        log.warning("parent process %d is gone: retrieval service %d exits", parent_pid, os.getpid())
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(_ORPHAN_GRACE_S)
        log.error(
            "retrieval service %d did not exit within %.0f s of SIGTERM; exiting hard",
            os.getpid(),
            _ORPHAN_GRACE_S,
        )
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def reranker_on_job_gpus(retrieval: Mapping[str, Any], gpus: int) -> dict[str, Any]:
    """The retrieval settings of a training job: one reranker replica on every GPU of the job,
    unless ``retrieval.reranker.devices`` names devices.

    Every GPU then carries the same reranker footprint, so the GPUs of a tensor-parallel group
    keep equal free memory (sglang refuses to start otherwise) and all of them rerank. The
    service starts before verl and holds its whole footprint from start-up (weights, the
    activations of the largest pass, the CUDA context: ~3.9 GiB per GPU for bge-reranker-v2-m3 at
    the paper config's 81,920 tokens per pass), so sglang sizes its KV cache from what is free
    after the replicas loaded; measured numbers and the accounting are in docs/retrieval.md
    ("Reranker replicas and GPU memory").

    Args:
        retrieval: ``config["retrieval"]`` as the job has it.
        gpus: GPUs of the job (``cuda:0`` ... ``cuda:<gpus-1>`` as the job sees them).

    Returns:
        A copy with ``reranker.devices`` filled in (unchanged without a reranker, without GPUs, or
        when devices are configured).
    """
    out = dict(retrieval)
    reranker = dict(out.get("reranker") or {})
    if reranker.get("devices") is None and (reranker.get("path") or reranker.get("model")) and gpus > 0:
        reranker["devices"] = [f"cuda:{i}" for i in range(gpus)]
    out["reranker"] = reranker
    return out


def _bind(host: str, port: int) -> socket.socket:
    """The service's listening socket, bound to ``host:port``.

    The protocol is named (``IPPROTO_TCP``) and ``TCP_NODELAY`` set on it (Linux passes it on to
    every accepted connection): asyncio turns Nagle's algorithm off only on sockets whose protocol
    is ``IPPROTO_TCP``, and one made with protocol 0 kept it on, so the response's header and body,
    written separately, waited for the client's delayed ACK: ~40 ms added to every request.

    Raises:
        ServiceError: the address cannot be bound (a port in use, an address not of this host),
            naming the address.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ServiceError(f"cannot listen on {host}:{port}: not a TCP port (0-65535; 0 picks a free one)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError, UnicodeError) as exc:
        sock.close()
        hint = " (another process listens there: choose another --port, or 0 for a free one)"
        raise ServiceError(
            f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}"
            f"{hint if getattr(exc, 'errno', None) == errno.EADDRINUSE else ''}"
        ) from None
    return sock


def warn_beyond_loopback(sock: socket.socket) -> bool:
    """Say so in the log when the service listens beyond this machine's loopback: it has no
    authentication, so whoever reaches the address can search with it and load it. Returns
    whether it does."""
    address, port = sock.getsockname()[:2]
    if ipaddress.ip_address(address.split("%")[0]).is_loopback:
        return False
    log.warning(
        "the retrieval service listens on %s:%d, beyond this machine's loopback: it has no "
        "authentication, so anyone who can reach that address can send it searches (bind 127.0.0.1, "
        "the default, unless the network around it is trusted)",
        address,
        port,
    )
    return True


_FD_RESERVE = 256  # descriptors kept for the index files, the JVM, torch and logs


def _raise_fd_limit(connections: int) -> None:
    """Raise the soft limit on open files so that ``connections`` fit beside what the process
    needs itself (the hard limit allowing); warn when it cannot."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + _FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning(
            "open-file limit %d is below retrieval.service.max_connections (%d) + %d: connections beyond "
            "%d fail at accept() instead of being answered 503",
            soft,
            connections,
            _FD_RESERVE,
            soft - _FD_RESERVE,
        )


def serve(
    index_dir: str | os.PathLike,
    settings: SearchSettings,
    *,
    host: str | None = None,
    port: int = 8000,
    port_file: str | os.PathLike | None = None,
    threads: int = 1,
    devices: str | list[str] | None = None,
    parent_pid: int | None = None,
) -> None:
    """Serve ``index_dir`` until interrupted (SIGINT/SIGTERM).

    The reranker directory, the address and the index are checked before anything slow runs, each
    failure one error naming what is wrong: :class:`~spader.retrieval.errors.RerankerUnavailableError`
    (the model directory), :class:`~spader.retrieval.errors.ServiceError` (a port in use),
    :class:`~spader.retrieval.errors.IndexUnavailableError` (the index path). SIGINT, SIGTERM and
    SIGHUP stop the service: open requests are answered 503 in JSON and the function returns.

    Args:
        index_dir: Lucene index with raw documents.
        settings: search settings (``settings.host`` unless ``host`` is given).
        host: bind address (default ``settings.host``, 127.0.0.1).
        port: TCP port; 0 picks a free one.
        port_file: where the bound port is written (for ``port=0``; written before start-up).
        threads: search and CPU reranking threads.
        devices: reranker devices, one replica each (default ``settings.devices``, else the first
            GPU, else CPU).
        parent_pid: exit when this process dies (:func:`exit_with_parent`).
    """
    if parent_pid is not None:
        exit_with_parent(parent_pid)
    import uvicorn  # noqa: F401 (a missing server fails before anything slow runs)

    from spader.retrieval.app import create_app
    from spader.retrieval.backend import Bm25RerankBackend
    from spader.retrieval.index import verify_index
    from spader.retrieval.reranker import check_reranker_dir

    # What can be checked at once first: a damaged reranker download, the port, then the index.
    if settings.reranker is not None and Path(settings.reranker).is_dir():
        check_reranker_dir(settings.reranker)
    sock = _bind(host or settings.host, port)
    warn_beyond_loopback(sock)
    verify_index(index_dir)
    bound = sock.getsockname()[1]
    if port_file is not None:
        atomic_write(port_file, str(bound))
    log.info("retrieval service for %s on %s:%d (loading)", index_dir, host or settings.host, bound)
    # Loaded before the server starts, so that a damaged reranker or index ends the start with one
    # line naming it (an error in the app's start-up would be uvicorn's traceback). Clients wait:
    # /health answers once the server runs.
    backend = Bm25RerankBackend(index_dir, settings, threads=threads, devices=devices)
    backend.warm_up()
    app = create_app(lambda: backend, warmed=True)
    server = _stoppable_server(_uvicorn_config(app, settings), app)
    server.run(sockets=[sock])
    if server.stopped_by:
        log.info("retrieval service for %s stopped (%s)", index_dir, server.stopped_by)


def _uvicorn_config(app, settings: SearchSettings):
    """uvicorn's configuration of the service: the project's HTTP protocol, its limits and timeouts."""
    import uvicorn

    from spader.retrieval.protocol import Limits, protocol_class

    # Idle keep-alive connections are closed by the client first (httpx: after 5 s), never by the
    # server (uvicorn's default is also 5 s): when both close at once, a request sent on the
    # closing connection fails with a read error (seen under 512 concurrent clients).
    limits = Limits(settings.header_timeout_s, settings.body_timeout_s, settings.max_connections)
    _raise_fd_limit(settings.max_connections)
    return uvicorn.Config(
        app,
        http=protocol_class(limits),  # JSON for framing errors, read timeouts, a connection cap
        ws="none",
        log_level="info",
        access_log=False,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=75,
    )


def _stoppable_server(config, app):
    """uvicorn's server, stopped by SIGINT, SIGTERM or SIGHUP without a traceback: the first signal
    closes the app's scheduler (open requests get a JSON 503 at once, the reranking in progress is
    abandoned at its next batch) and starts uvicorn's graceful shutdown; the process then returns
    from :func:`serve` normally (uvicorn would raise the signal again after shutting down, ending
    in a KeyboardInterrupt traceback or death by SIGTERM). A second SIGINT forces the exit.
    ``server.stopped_by`` names the signal."""
    import uvicorn

    from spader.retrieval.app import close_app

    class Server(uvicorn.Server):
        stopped_by: str | None = None

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig, frame):
            first = self.stopped_by is None
            self.stopped_by = self.stopped_by or signal.Signals(sig).name
            super().handle_exit(sig, frame)
            if first:
                reason = f"it received {signal.Signals(sig).name}"
                try:
                    asyncio.get_running_loop().call_soon_threadsafe(close_app, app, reason)
                except RuntimeError:  # no loop runs yet: nothing is open
                    pass

    return Server(config)


def serve_command(
    index_dir: str | os.PathLike,
    settings: SearchSettings,
    *,
    port: int = 0,
    port_file: str | os.PathLike | None = None,
    threads: int = 1,
    parent_pid: int | None = None,
) -> list[str]:
    """The ``python -m spader.retrieval serve ...`` command line carrying ``settings``.

    Args:
        index_dir: the index to serve.
        settings: every search and service setting (the reranker devices included).
        port: TCP port (0: a free one, written to ``port_file``).
        port_file: where the service writes its port.
        threads: search and CPU reranking threads.
        parent_pid: the service exits when this process dies.

    Returns:
        The argv.
    """
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
        "--cache-entries": settings.cache_entries,
        "--cache-bytes": settings.cache_bytes,
        "--slice-queries": settings.slice_queries,
        "--header-timeout": settings.header_timeout_s,
        "--body-timeout": settings.body_timeout_s,
        "--max-connections": settings.max_connections,
    }
    if settings.rerank_max_batch_tokens is not None:
        flags["--max-batch-tokens"] = settings.rerank_max_batch_tokens
    if settings.devices is not None:
        flags["--devices"] = ",".join(settings.devices)
    if port_file is not None:
        flags["--port-file"] = port_file
    if parent_pid is not None:
        flags["--parent-pid"] = parent_pid
    cmd = [sys.executable, "-m", "spader.retrieval", "serve", "--fp16" if settings.fp16 else "--no-fp16"]
    cmd.append("--overlap" if settings.overlap else "--no-overlap")
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

    try:  # trust_env=False: a proxy set in the environment must not see a local request
        return httpx.get(f"{url}/health", timeout=5.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _log_stats(url: str, stats_file: Path | None = None) -> None:
    """Log the service's counters before it stops: how many of the job's queries repeated an
    earlier one (served from the cache or shared while in flight) is measured here, per job; and
    keep them in ``stats_file`` (its failed queries are what the GPU smoke test reads)."""
    import httpx

    try:
        stats = httpx.get(f"{url}/stats", timeout=5.0, trust_env=False).json()
        if stats_file is not None:
            stats_file.write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        queries = max(1, int(stats["queries"]))
        reused = int(stats["cache"]["hits"]) + int(stats["coalesced"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        log.warning("retrieval service at %s: no final stats (%s)", url, exc)
        return
    latency = stats.get("latency_ms") or {}
    log.info(
        "retrieval service stats: %d requests, %d queries, %d (%.1f%%) answered from the cache or "
        "a computation in flight, %d computed, %d reranker pairs; latency p50 %s ms, p99 %s ms; "
        "BM25 %s s, reranking %s s; %s",
        stats["requests"],
        stats["queries"],
        reused,
        100.0 * reused / queries,
        stats["computed"],
        stats["pairs_reranked"],
        latency.get("p50_ms"),
        latency.get("p99_ms"),
        stats.get("bm25_s"),
        stats.get("rerank_s"),
        json.dumps(stats, sort_keys=True),
    )


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
    search: SearchSettings,
    *,
    log_path: str | os.PathLike | None = None,
    threads: int | None = None,
) -> Iterator[str]:
    """Start the service as a subprocess, wait until ``/health`` answers, stop it on exit.

    Args:
        index_dir: Lucene index with raw documents (a prebuilt one is checked the same way).
        search: the search and service settings (:meth:`SearchSettings.from_config` of the job's
            retrieval settings, the reranker resolved to a local directory).
        log_path: file the service's output is appended to (default: a temporary file, shown
            in the error when the start fails).
        threads: search and CPU reranking threads (default 1).

    The service exits by itself if this process dies (:func:`exit_with_parent`). Linux ties that
    signal to the thread that started the child: enter the block from the thread that runs the
    job (the main thread), not from a short-lived worker thread.

    Yields:
        The base URL, ``http://127.0.0.1:<free port>``.

    Raises:
        ServiceError: the service exited or was not healthy within
            ``search.startup_timeout_s``; the message names the index and shows
            the end of the service log.
    """
    if not isinstance(search, SearchSettings):
        raise TypeError(
            f"running_service takes SearchSettings (SearchSettings.from_config of the retrieval settings), "
            f"got {type(search).__name__}"
        )
    connect_host = "127.0.0.1" if search.host in ("0.0.0.0", "") else search.host
    if ":" in connect_host:
        connect_host = "::1" if connect_host == "::" else connect_host
        connect_host = f"[{connect_host}]"
    with tempfile.TemporaryDirectory(prefix="spader-retrieval-") as tmp:
        port_file = Path(tmp) / "port"
        log_file = Path(log_path) if log_path else Path(tmp) / "service.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        cmd = serve_command(
            index_dir, search, port=0, port_file=port_file, threads=threads or 1, parent_pid=os.getpid()
        )
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        log.info("starting retrieval service for %s (pid %d, log %s)", index_dir, proc.pid, log_file)
        url = None
        try:
            url = _wait_ready(proc, port_file, connect_host, index_dir, log_file, search.startup_timeout_s)
            log.info("retrieval service ready at %s", url)
            yield url
        finally:
            if url is not None:
                _log_stats(url, stats_path(log_path) if log_path else None)
            _stop(proc)
            log.info("retrieval service for %s stopped", index_dir)


def stats_path(log_path: str | os.PathLike) -> Path:
    """Where :func:`running_service` keeps the service's final counters, next to its log."""
    return Path(log_path).with_name(Path(log_path).stem + "_stats.json")


@contextlib.contextmanager
def connected_client(
    index_dir: str | os.PathLike,
    search: SearchSettings,
    *,
    log_path: str | os.PathLike | None = None,
    threads: int | None = None,
) -> Iterator[RetrievalClient]:
    """A client of a service started for the block (:func:`running_service`), with the settings'
    request timeout and retries; both are closed when the block is left."""
    with (
        running_service(index_dir, search, log_path=log_path, threads=threads) as url,
        RetrievalClient(url, timeout=search.request_timeout_s, retries=search.retries) as client,
    ):
        yield client


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
