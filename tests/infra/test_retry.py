"""spader.infra.retry: bounded attempts, exponential waits, only the named exceptions retried."""

from __future__ import annotations

import logging

import pytest

from spader.infra.retry import retrying


class Flaky(Exception):
    pass


def _run(fails: int, retries: int, waits: list[float]):
    calls = []

    def op():
        calls.append(1)
        if len(calls) <= fails:
            raise Flaky(f"failure {len(calls)}")
        return "ok"

    policy = retrying(retries=retries, backoff=0.5, max_wait=1.5, on=(Flaky,), what="op", sleep=waits.append)
    return policy(op), calls


def test_retries_then_succeeds_with_capped_exponential_waits(caplog):
    waits: list[float] = []
    with caplog.at_level(logging.WARNING, logger="spader.infra.retry"):
        result, calls = _run(fails=4, retries=5, waits=waits)
    assert result == "ok" and len(calls) == 5
    assert waits == [0.5, 1.0, 1.5, 1.5]  # 0.5 * 2**(n-1), capped at 1.5
    assert "op failed (Flaky: failure 1); retry 1/5 in 0.5 s" in caplog.text


def test_gives_up_with_the_last_exception():
    waits: list[float] = []
    with pytest.raises(Flaky, match="failure 3"):
        _run(fails=10, retries=2, waits=waits)
    assert len(waits) == 2


def test_other_exceptions_are_not_retried():
    waits: list[float] = []
    policy = retrying(retries=3, backoff=1.0, on=(Flaky,), what="op", sleep=waits.append)
    with pytest.raises(KeyError):
        policy(lambda: {}["missing"])
    assert waits == []


def test_negative_retries_refused():
    with pytest.raises(ValueError, match="retries must be >= 0"):
        retrying(retries=-1, backoff=1.0, on=(Flaky,), what="op")
