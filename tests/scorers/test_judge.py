"""R3-RAG's judge client against a local OpenAI-compatible test server that serves the tiny model
(tests/support/openai_test_server.py, standing in for sglang), and the judge server launcher."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest
from openai_test_server import TestServer, create_app

from spader.methods.r3rag.scoring import judge_messages
from spader.scorers.judge import JudgeClient, JudgeError, JudgeUnavailableError
from spader.scorers.judge_server import running_judge, split_gpus, visible_gpus

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "openai_test_server.py"
MESSAGES = judge_messages(
    "Which films did Ilse Varga direct?", "Search her films.", ["Varga films"], "Doc 1 ..."
)


def client(url, **kw):
    settings = {
        "timeout": 10.0,
        "retries": 2,
        "concurrency": 4,
        "max_tokens": 8,
        "temperature": 0.0,
        "unparsable": "zero",
        "backoff": 0.01,
        **kw,
    }
    return JudgeClient(url, "judge", **settings)


def test_the_tiny_model_answers_and_an_unparsable_verdict_scores_zero(tiny_model, caplog):
    with TestServer(create_app(tiny_model)) as server, client(server.url) as judge:
        judge.check()
        with caplog.at_level(logging.WARNING, logger="spader.scorers.judge"):
            verdicts = judge.judge_many([MESSAGES, MESSAGES])
    assert server.counters.requests == 2
    for v in verdicts:  # a random model does not write "Relevance: x.xx"; if it ever did, it parses
        assert 0.0 <= v.score <= 1.0 and isinstance(v.reply, str)
        if not v.parsed:
            assert v.score == 0.0
    assert sum(not v.parsed for v in verdicts) == sum(
        "without a 'Relevance" in r.message for r in caplog.records
    )


def test_verdicts_in_input_order_within_the_concurrency_limit():
    replies = [f"Looks fine.\nRelevance: 0.{i}" for i in range(1, 9)]
    with (
        TestServer(create_app(None, script=replies, delay_s=0.15)) as server,
        client(server.url, concurrency=3) as judge,
    ):
        verdicts = judge.judge_many([MESSAGES] * 8)
    assert server.counters.max_in_flight == 3
    assert sorted(v.score for v in verdicts) == pytest.approx([i / 10 for i in range(1, 9)])
    assert all(v.parsed for v in verdicts)


def test_transient_failures_are_retried_then_reported(caplog):
    with TestServer(create_app(None, script=["Relevance: 0.5"], fail_first=2)) as server:
        with client(server.url, retries=2) as judge:
            assert judge.judge(MESSAGES).score == 0.5
        assert server.counters.requests == 3  # two 503s, then the answer
    with TestServer(create_app(None, script=["Relevance: 0.5"], fail_first=10)) as server:
        with (
            client(server.url, retries=1) as judge,
            pytest.raises(JudgeUnavailableError, match="after 2 attempts"),
        ):
            judge.judge(MESSAGES)
        assert server.counters.requests == 2


def test_a_rejected_request_is_not_retried():
    with TestServer(create_app(None, script=["Relevance: 0.5"])) as server:
        with JudgeClient(
            server.url,
            "other-model",
            timeout=5,
            retries=3,
            concurrency=1,
            max_tokens=8,
            temperature=0.0,
            unparsable="zero",
            backoff=0.01,
        ) as judge:
            with pytest.raises(JudgeError, match="HTTP 404.*not served"):
                judge.judge(MESSAGES)
        assert server.counters.requests == 1


def test_a_slow_endpoint_times_out():
    with TestServer(create_app(None, script=["Relevance: 0.5"], delay_s=1.0)) as server:
        with client(server.url, timeout=0.3, retries=1) as judge:
            start = time.monotonic()
            with pytest.raises(JudgeUnavailableError, match="APITimeoutError"):
                judge.judge(MESSAGES)
            assert time.monotonic() - start < 0.9


def test_an_endpoint_that_is_down_fails_clearly():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    with client(f"http://127.0.0.1:{port}/v1", retries=1) as judge:
        with pytest.raises(JudgeUnavailableError, match=rf"127.0.0.1:{port}/v1.*is the judge server running"):
            judge.judge(MESSAGES)
        with pytest.raises(JudgeUnavailableError, match="not answering"):
            judge.check()


def test_settings_are_checked():
    with pytest.raises(ValueError, match="http"):
        JudgeClient(
            "127.0.0.1:8000",
            "m",
            timeout=1,
            retries=0,
            concurrency=1,
            max_tokens=8,
            temperature=0.0,
            unparsable="zero",
        )
    with pytest.raises(ValueError, match="concurrency=0"):
        JudgeClient(
            "http://127.0.0.1:1/v1",
            "m",
            timeout=1,
            retries=0,
            concurrency=0,
            max_tokens=8,
            temperature=0.0,
            unparsable="zero",
        )


def test_gpu_split():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 8) == ["4", "5", "6", "7"]
    assert visible_gpus({}, 3) == ["0", "1", "2"]
    assert split_gpus(["0", "1", "2", "3", "4", "5", "6", "7"], 4) == (
        ["0", "1", "2", "3"],
        ["4", "5", "6", "7"],
    )
    with pytest.raises(ValueError, match="training needs at least one"):
        split_gpus(["0"], 1)


@pytest.mark.slow
def test_launcher_starts_waits_for_and_stops_the_server(tiny_model, tmp_path):
    command = [
        sys.executable,
        str(SERVER_SCRIPT),
        "--model",
        str(tiny_model),
        "--port",
        "{port}",
        "--api-key",
        "{api_key}",
    ]
    log = tmp_path / "judge.log"
    with running_judge(
        tiny_model, gpus=["0"], served_name="judge", startup_timeout_s=120, command=command, log_path=log
    ) as endpoint:
        url = endpoint.url
        with client(url, api_key=endpoint.api_key) as judge:
            judge.check()
            assert 0.0 <= judge.judge(MESSAGES).score <= 1.0
    with pytest.raises(JudgeUnavailableError):  # stopped with the context
        client(url, retries=0).check()
    crash = [sys.executable, "-c", "import sys; print('no GPU here'); sys.exit(3)"]
    with pytest.raises(JudgeUnavailableError, match=r"exited with code 3(.|\n)*no GPU here"):
        with running_judge(tiny_model, gpus=["0"], served_name="judge", startup_timeout_s=60, command=crash):
            pass


def test_their_judge_call_leaves_the_temperature_to_the_server_and_fails_on_no_verdict():
    """R3-RAG's code: no temperature in the request (the server's default), an unparsable reply an
    error; the defaults send temperature 0 and score such a reply 0."""
    with TestServer(create_app(None, script=["no verdict here"])) as server:
        with client(server.url) as judge:
            assert judge.judge(MESSAGES).score == 0.0
        with client(server.url, temperature=None, unparsable="raise") as judge:
            with pytest.raises(JudgeError, match="without a 'Relevance"):
                judge.judge(MESSAGES)
        first, second = server.counters.bodies
    assert first["temperature"] == 0.0 and "temperature" not in second
