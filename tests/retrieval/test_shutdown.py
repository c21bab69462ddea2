"""The service's start and stop, each ending in one line or a JSON answer, never a traceback, through
the real ``serve`` command line: a port in use, a damaged reranker (cut-short weights, no tokenizer;
the message names the model directory), Ctrl-C (SIGINT) while a request is being reranked and
another is still arriving (both answered 503 in JSON at once, the process exits 0 within seconds),
SIGTERM with requests cut mid-headers and mid-body (held out)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from spader.retrieval.errors import RerankerUnavailableError
from spader.retrieval.reranker import check_reranker_dir

QUERIES = [f"films river lake church album number {i}" for i in range(256)]


def _serve(index, log: Path, port_file: Path, *extra: str) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "spader.retrieval",
        "serve",
        "--index",
        str(index),
        "--port-file",
        str(port_file),
    ]
    return subprocess.Popen([*argv, *extra], stdout=open(log, "w"), stderr=subprocess.STDOUT)


def _ready(proc: subprocess.Popen, port_file: Path, log: Path, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        if port_file.exists():
            url = f"http://127.0.0.1:{int(port_file.read_text())}"
            try:
                if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"the service did not start:\n{log.read_text()[-3000:]}")


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spader.retrieval", *argv], capture_output=True, text=True, timeout=300
    )


def test_a_port_in_use_is_one_line_naming_the_address(bm25_index):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _cli("serve", "--index", str(bm25_index), "--reranker", "none", "--port", str(port))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"python -m spader.retrieval: error: cannot listen on 127.0.0.1:{port}: Address already in use (another process listens there: "
        "choose another --port, or 0 for a free one)"
    )


def _damaged(tiny_reranker: Path, tmp_path: Path, damage: str) -> Path:
    out = tmp_path / f"reranker-{damage}"
    shutil.copytree(tiny_reranker, out)
    weights = out / "model.safetensors"
    if damage == "truncated weights":
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
    elif damage == "no tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json", "sentencepiece.bpe.model"):
            (out / name).unlink(missing_ok=True)
    elif damage == "garbled header":  # held out
        data = bytearray(weights.read_bytes())
        data[8:16] = b"\xff" * 8
        weights.write_bytes(bytes(data))
    elif damage == "no weights":  # held out
        weights.unlink()
    elif damage == "padded weights":  # held out: the size no longer matches either way
        with open(weights, "ab") as f:
            f.write(b"\0" * 100)
    return out


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            "truncated weights",
            r"model\.safetensors has [\d,]+ bytes where its header declares [\d,]+ \(cut short",
        ),
        ("no tokenizer", r"no tokenizer \(tokenizer\.json, .* are all missing\)"),
        ("garbled header", r"model\.safetensors (is cut short|is not a safetensors file)"),
        ("no weights", r"no weights \(\*\.safetensors or \*\.bin\)"),
        ("padded weights", r"model\.safetensors has [\d,]+ bytes where its header declares"),
    ],
)
def test_a_damaged_reranker_directory_is_named_with_what_is_wrong(tiny_reranker, tmp_path, damage, message):
    model = _damaged(tiny_reranker, tmp_path, damage)
    with pytest.raises(RerankerUnavailableError, match=rf"^reranker model directory {model}: {message}"):
        check_reranker_dir(model)


def test_the_service_refuses_a_damaged_reranker_in_one_line(bm25_index, tiny_reranker, tmp_path):
    model = _damaged(tiny_reranker, tmp_path, "truncated weights")
    proc = _cli(
        "serve", "--index", str(bm25_index), "--reranker", str(model), "--devices", "cpu", "--port", "0"
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1].startswith(
        f"python -m spader.retrieval: error: reranker model directory {model}: model.safetensors has "
    )
    assert "Traceback" not in proc.stderr


def test_an_intact_reranker_directory_passes(tiny_reranker):
    check_reranker_dir(tiny_reranker)


def _head(url: str, length: int) -> bytes:
    return (
        b"POST /retrieve HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % (
            url.removeprefix("http://").encode(),
            length,
        )
    )


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def _response(sock: socket.socket) -> tuple[int, dict, dict]:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
            if len(body) >= int(headers.get("content-length", 0)):
                return int(lines[0].split()[1]), headers, json.loads(body)
    raise AssertionError(f"no complete response: {data!r}")


def test_ctrl_c_while_a_request_is_reranked_answers_json_and_exits_cleanly(
    bm25_index, tiny_reranker, tmp_path
):
    log, port_file = tmp_path / "service.log", tmp_path / "port"
    # one pair per forward pass: reranking a request takes seconds, long enough to be interrupted
    proc = _serve(bm25_index, log, port_file, "--reranker", str(tiny_reranker), "--devices", "cpu",
                  "--batch-size", "1", "--cache-entries", "0", "--max-queries", "512")  # fmt: skip
    try:
        url = _ready(proc, port_file, log)
        answer: dict = {}

        def big_request():
            started = time.monotonic()
            r = httpx.post(
                f"{url}/retrieve", json={"queries": QUERIES, "initial_k": 8}, timeout=120, trust_env=False
            )
            answer.update(
                status=r.status_code,
                type=r.headers["content-type"],
                body=r.json(),
                s=time.monotonic() - started,
            )

        thread = threading.Thread(target=big_request)
        thread.start()
        deadline = time.monotonic() + 120
        while httpx.get(f"{url}/stats", timeout=10, trust_env=False).json()["pairs_reranked"] == 0:
            assert time.monotonic() < deadline and thread.is_alive(), answer
            time.sleep(0.1)
        arriving = _connect(url)  # a second request, its body half sent
        arriving.sendall(_head(url, 100) + b'{"queries": ["Lake')
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        status, headers, body = _response(arriving)
        arriving.close()
        thread.join(60)
        rc = proc.wait(60)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert answer["status"] == 503 and answer["type"] == "application/json", answer
    assert "shutting down (it received SIGINT)" in answer["body"]["error"]
    assert (status, headers["content-type"]) == (503, "application/json") and "shutting down" in body["error"]
    assert rc == 0 and took < 20, (rc, took, text[-3000:])
    assert "Traceback" not in text and "stopped (SIGINT)" in text, text[-3000:]


def test_sigterm_answers_requests_cut_mid_headers_and_mid_body_in_json(bm25_index, tmp_path):
    """Held out: another signal, no reranker, a request whose headers are half sent."""
    log, port_file = tmp_path / "service.log", tmp_path / "port"
    proc = _serve(bm25_index, log, port_file, "--reranker", "none")
    try:
        url = _ready(proc, port_file, log)
        mid_headers, mid_body = _connect(url), _connect(url)
        mid_headers.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        mid_body.sendall(_head(url, 50) + b'{"que')
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        answers = [_response(s) for s in (mid_headers, mid_body)]
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    for status, headers, body in answers:
        assert (status, headers["content-type"]) == (503, "application/json") and "shutting down" in body[
            "error"
        ]
    text = log.read_text()
    assert rc == 0 and "Traceback" not in text and "stopped (SIGTERM)" in text, text[-3000:]
