"""The one retry policy of the project (downloads, the retrieval client), built on tenacity.

Transient failures (connection errors, timeouts, 5xx, truncated bodies: each caller names its
own exception types) are retried a bounded number of times with capped exponential backoff;
everything else propagates at once. Every retry is logged with the attempt number and the wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

__all__ = ["retrying"]

log = logging.getLogger(__name__)


def retrying(
    *,
    retries: int,
    backoff: float,
    max_wait: float = 30.0,
    on: tuple[type[BaseException], ...],
    what: str | Callable[[], str],
    sleep: Callable[[float], None] | None = None,
) -> Retrying:
    """A tenacity ``Retrying`` for ``retries`` further attempts after the first one.

    Use it as ``for attempt in retrying(...): with attempt: <one try>``, or call it on a function.
    After the last attempt the last exception is re-raised unchanged (``reraise=True``), so callers
    wrap it in their own error type.

    Args:
        retries: further attempts after the first (0: try once).
        backoff: the n-th retry waits ``backoff * 2 ** (n - 1)`` seconds, at most ``max_wait``.
        max_wait: cap on one wait, in seconds.
        on: exception types that count as transient.
        what: label of the operation for the log (or a callable producing it).
        sleep: replaces ``time.sleep`` (tests).

    Returns:
        The configured ``Retrying`` object.
    """
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")

    def _log(state: RetryCallState) -> None:
        label = what() if callable(what) else what
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%s failed (%s: %s); retry %d/%d in %.1f s",
            label,
            type(exc).__name__,
            exc,
            state.attempt_number,
            retries,
            wait,
        )

    kwargs = {} if sleep is None else {"sleep": sleep}
    return Retrying(
        stop=stop_after_attempt(retries + 1),
        wait=wait_exponential(multiplier=backoff, exp_base=2, min=0, max=max_wait),
        retry=retry_if_exception_type(on),
        before_sleep=_log,
        reraise=True,
        **kwargs,
    )
