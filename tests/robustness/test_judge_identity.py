"""The judge server's start-up check accepts only the server the job started: it must serve the
configured model name, accept the job's API key (made per job, passed as ``--api-key`` and to the
client) and refuse requests without it, and be the process listening on the port. Impostors on the
port are the OpenAI-compatible test server (tests/support/openai_test_server.py, standing in for
sglang, which needs a GPU) in this process; the job's own "server" is then a process that is still
loading (it never binds), as sglang is for minutes while another process answers on its port."""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

import pytest
from openai_test_server import TestServer, create_app

from spader.scorers import judge_server
from spader.scorers.judge import JUDGE_KEY_ENV, JudgeClient, JudgeError, JudgeUnavailableError
from spader.scorers.judge_server import judge_server_command, running_judge

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "openai_test_server.py"
MESSAGES = [{"role": "user", "content": "Relevance?"}]
LOADING = [sys.executable, "-c", "import time; time.sleep(120)"]  # our server, still loading


def _client(url: str, **kw) -> JudgeClient:
    return JudgeClient(
        url,
        "judge",
        timeout=10,
        retries=1,
        concurrency=2,
        max_tokens=8,
        temperature=0.0,
        unparsable="zero",
        backoff=0.01,
        **kw,
    )


@pytest.mark.slow
def test_the_job_starts_its_server_with_a_key_of_its_own_and_the_client_gets_it(tmp_path, monkeypatch):
    command = [sys.executable, str(SERVER_SCRIPT), "--port", "{port}", "--api-key", "{api_key}",
               "--served-name", "judge", "--reply", "Relevance: 0.75"]  # fmt: skip
    keys = []
    for _ in range(2):
        with running_judge(
            None,
            gpus=["0"],
            served_name="judge",
            startup_timeout_s=60,
            command=command,
            log_path=tmp_path / "j.log",
        ) as endpoint:
            keys.append(endpoint.api_key)
            assert endpoint.env() == {JUDGE_KEY_ENV: endpoint.api_key}
            with pytest.raises(JudgeError, match="HTTP 401"):  # without the key: refused
                _client(endpoint.url, api_key="not-the-key").judge(MESSAGES)
            monkeypatch.setenv(JUDGE_KEY_ENV, endpoint.api_key)  # what verl's processes receive
            with _client(endpoint.url) as judge:
                judge.check()
                assert judge.judge(MESSAGES).score == 0.75
    assert len(set(keys)) == 2 and all(len(k) >= 40 for k in keys)  # a new key per job


def test_every_job_key_reaches_the_server_as_the_value_of_api_key():
    # A key starting with "-" (URL-safe base64 does so once in 64) is read by argparse as an option
    # and the server exits with a usage error before it answers.
    parser = argparse.ArgumentParser()
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--port", type=int, required=True)
    for _ in range(500):
        key = judge_server.new_api_key()
        args = parser.parse_args(["--api-key", key, "--port", "1"])
        assert args.api_key == key


def test_the_sglang_command_carries_the_key():
    cmd = judge_server_command(
        "/m", port=1, gpus=1, tensor_parallel=1, served_name="judge", mem_fraction=0.8, api_key="k3y"
    )
    assert cmd[cmd.index("--api-key") + 1] == "k3y" and cmd[cmd.index("--host") + 1] == "127.0.0.1"


def _impostor(monkeypatch, wrap=None, **app) -> TestServer:
    asgi = create_app(None, script=["Relevance: 1.0"], **app)
    server = TestServer(wrap(asgi) if wrap else asgi).__enter__()
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    # FAKE: the port the job picked is taken by another process before its server binds it
    monkeypatch.setattr(judge_server, "_free_port", lambda: port)
    return server


class _AnyKey:
    """An impostor that wants some key, whatever it is: it answers the job's key and refuses no key."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not dict(scope["headers"]).get(b"authorization"):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)


@pytest.mark.parametrize(
    ("app", "problem"),
    [
        ({"served_name": "judge"}, "it answers without this job's API key"),
        ({"served_name": "judge", "api_key": "someone-else"}, "it refuses this job's API key (HTTP 401)"),
        ({"served_name": "Qwen2.5-7B"}, "it serves ['Qwen2.5-7B'], not 'judge'"),
        ({"served_name": "judge", "wrap": _AnyKey}, "the port is held by process"),
    ],
    ids=["no-key", "another-key", "another-model", "any-key-other-process"],
)
def test_a_process_answering_on_the_port_that_is_not_ours_is_refused(monkeypatch, tmp_path, app, problem):
    server = _impostor(monkeypatch, **app)
    port = server.url.rsplit(":", 1)[1].split("/")[0]
    try:
        started = time.monotonic()
        with pytest.raises(JudgeUnavailableError) as err:
            with running_judge(
                None,
                gpus=["0"],
                served_name="judge",
                startup_timeout_s=60,
                command=LOADING,
                log_path=tmp_path / "j.log",
            ):
                pytest.fail("the impostor was accepted")
        assert time.monotonic() - started < 30
        message = str(err.value)
        assert f"something other than this job's judge server answers on port {port}" in message
        assert problem in message and "Refused; the job's server" in message
    finally:
        server.__exit__(None, None, None)


def test_nothing_listening_until_the_deadline_is_reported(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(judge_server, "_free_port", lambda: port)
    with pytest.raises(JudgeUnavailableError, match=r"did not answer .*/models within 2 s"):
        with running_judge(None, gpus=["0"], served_name="judge", startup_timeout_s=2, command=LOADING):
            pass
