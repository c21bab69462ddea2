"""What the service's start says about its address: a port outside 0-65535 is one line (exit 2),
and an address beyond the loopback is bound with a warning that the service has no
authentication."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import pytest

from spader.retrieval.service import warn_beyond_loopback


def _serve(tmp_path, *args) -> subprocess.CompletedProcess:
    """``serve`` of an index that does not exist: it stops at the index, after the address."""
    return subprocess.run(
        [sys.executable, "-m", "spader.retrieval", "serve", "--index", str(tmp_path / "no-index"),
         "--reranker", "none", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("port", ["70000", "65536", "-1", "99999999999999999999"])
def test_a_port_that_is_no_tcp_port_is_one_line(tmp_path, port):
    proc = _serve(tmp_path, f"--port={port}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"python -m spader.retrieval: error: cannot listen on 127.0.0.1:{port}: not a TCP port (0-65535; 0 "
        "picks a free one)"
    ]


def test_a_host_that_is_no_address_of_this_machine_is_one_line(tmp_path):
    proc = _serve(tmp_path, "--host", "999.1.1.1", "--port", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("python -m spader.retrieval: error: cannot listen on 999.1.1.1:0")
    )


def test_listening_beyond_the_loopback_says_the_service_is_unauthenticated(tmp_path):
    proc = _serve(tmp_path, "--host", "0.0.0.0", "--port", "0")
    warning, error = proc.stderr.strip().splitlines()[-2:]
    assert "WARNING" in warning and "listens on 0.0.0.0:" in warning and "no authentication" in warning
    assert error.startswith("python -m spader.retrieval: error:") and "no-index" in error
    quiet = _serve(tmp_path, "--host", "127.0.0.1", "--port", "0")
    assert "no authentication" not in quiet.stderr and quiet.returncode == 2


@pytest.mark.parametrize(("host", "warned"), [("0.0.0.0", True), ("127.0.0.1", False), ("127.0.0.2", False)])
def test_which_addresses_are_beyond_the_loopback(caplog, host, warned):
    with socket.socket() as sock, caplog.at_level(logging.WARNING, logger="spader.retrieval.service"):
        sock.bind((host, 0))
        assert warn_beyond_loopback(sock) is warned
    assert ("no authentication" in caplog.text) is warned
