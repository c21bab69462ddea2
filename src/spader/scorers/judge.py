"""R3-RAG's step judge: a client of an OpenAI-compatible chat-completions endpoint.

One request per search turn, with the prompt of :func:`spader.methods.r3rag.scoring.judge_messages`; the
reply's ``Relevance: x.xx`` is the turn's process score (:func:`spader.methods.r3rag.scoring.parse_relevance`;
an unparsable reply scores 0 and is logged). The endpoint is sglang serving the judge model on GPUs
of the training node (:mod:`spader.scorers.judge_server`), or any URL given in the config.

Robustness: every request has a timeout; connection errors, timeouts, 429 and 5xx answers are
retried a bounded number of times (:func:`spader.infra.retry.retrying`, the project's one policy),
then :class:`JudgeUnavailableError` names the endpoint; a 4xx answer raises :class:`JudgeError` at
once (a bad request stays bad). At most ``concurrency`` requests are in flight, across all threads
that share the client.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import openai

from spader.infra.retry import retrying
from spader.methods.r3rag.scoring import parse_relevance

__all__ = ["JUDGE_KEY_ENV", "JudgeClient", "JudgeError", "JudgeUnavailableError", "Verdict"]

#: The environment variable that carries the API key of the judge server a training job started
#: (:mod:`spader.scorers.judge_server`) to the client in verl's processes.
JUDGE_KEY_ENV = "SPADER_JUDGE_API_KEY"

log = logging.getLogger(__name__)

# Failures worth another attempt: the server may be starting, busy or restarting.
_TRANSIENT = (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)


class JudgeError(RuntimeError):
    """The judge endpoint rejected a request (HTTP 4xx) or answered without a reply."""


class JudgeUnavailableError(JudgeError):
    """The judge endpoint could not be reached or kept failing after the retries."""


@dataclass(frozen=True)
class Verdict:
    """One judged turn: the score in [0, 1], whether the reply held one, and the reply itself."""

    score: float
    parsed: bool
    reply: str


class JudgeClient:
    """Blocking, thread-safe client of the judge endpoint.

    Args:
        base_url: the endpoint's OpenAI base URL, ``http://host:port/v1``.
        model: the model name the endpoint serves.
        timeout: seconds per request.
        retries: further attempts after a transient failure.
        concurrency: most requests in flight at once.
        max_tokens: reply budget (R3-RAG's original: 4,096; the verdict opens the reply).
        temperature: sampling temperature of the judge (0: greedy; None: not sent, the server's
            default, as R3-RAG's code calls its judge).
        unparsable: ``zero`` (a reply without a verdict scores 0 and is logged) or ``raise``
            (:class:`JudgeError`, as R3-RAG's code fails on it).
        backoff: the n-th retry waits ``backoff * 2 ** (n - 1)`` seconds (at most 30).
        api_key: sent as the bearer token (default: :data:`JUDGE_KEY_ENV` of the environment, the
            key of the server the job started; servers without a key ignore it).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout: float,
        retries: int,
        concurrency: int,
        max_tokens: int,
        temperature: float | None,
        backoff: float = 0.5,
        api_key: str | None = None,
        unparsable: str,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"judge URL must be http(s)://..., got {base_url!r}")
        if concurrency < 1 or retries < 0 or timeout <= 0 or max_tokens < 1:
            raise ValueError(
                f"judge settings out of range: concurrency={concurrency} (>= 1), retries={retries} (>= 0), "
                f"timeout={timeout} (> 0), max_tokens={max_tokens} (>= 1)"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.concurrency = int(concurrency)
        self.max_tokens = int(max_tokens)
        self.temperature = None if temperature is None else float(temperature)
        if unparsable not in ("zero", "raise"):
            raise ValueError(f"unparsable must be zero or raise, got {unparsable!r}")
        self.unparsable = unparsable
        self._slots = threading.BoundedSemaphore(self.concurrency)
        # a judge on this machine is never reached through a proxy set in the environment
        local = urlsplit(self.base_url).hostname in ("127.0.0.1", "localhost", "::1")
        http_client = openai.DefaultHttpxClient(trust_env=False) if local else None
        # our retry policy, not the SDK's: max_retries=0
        self._client = openai.OpenAI(
            base_url=self.base_url,
            api_key=api_key if api_key is not None else os.environ.get(JUDGE_KEY_ENV, "unused"),
            timeout=timeout,
            max_retries=0,
            http_client=http_client,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> JudgeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _complete(self, messages: Sequence[dict]) -> str:
        try:
            for attempt in retrying(
                retries=self.retries,
                backoff=self.backoff,
                on=_TRANSIENT,
                what=f"judge request to {self.base_url}",
            ):
                with attempt, self._slots:
                    sampling = {} if self.temperature is None else {"temperature": self.temperature}
                    response = self._client.chat.completions.create(
                        model=self.model, messages=list(messages), max_tokens=self.max_tokens, **sampling
                    )
        except _TRANSIENT as exc:
            raise JudgeUnavailableError(
                f"judge endpoint {self.base_url} failed after {self.retries + 1} attempts "
                f"({type(exc).__name__}: {exc}); is the judge server running?"
            ) from exc
        except openai.APIStatusError as exc:
            raise JudgeError(
                f"judge endpoint {self.base_url} rejected the request (HTTP {exc.status_code}): {exc.message}"
            ) from exc
        if not response.choices:
            raise JudgeError(f"judge endpoint {self.base_url} answered without a choice")
        return response.choices[0].message.content or ""

    def judge(self, messages: Sequence[dict]) -> Verdict:
        """Score one turn (one request); an unparsable reply scores 0 and is logged (or raises
        :class:`JudgeError` with ``unparsable="raise"``)."""
        reply = self._complete(messages)
        score = parse_relevance(reply)
        if score is None and self.unparsable == "raise":
            raise JudgeError(f"judge reply without a 'Relevance: x.xx' verdict: {reply[-200:]!r}")
        if score is None:
            log.warning("judge reply without a 'Relevance: x.xx' verdict (scored 0): %r", reply[-200:])
            return Verdict(0.0, False, reply)
        return Verdict(score, True, reply)

    def judge_many(self, conversations: Sequence[Sequence[dict]]) -> list[Verdict]:
        """Score many turns, ``concurrency`` requests at a time; results in input order."""
        if not conversations:
            return []
        workers = min(self.concurrency, len(conversations))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="judge") as pool:
            return list(pool.map(self.judge, conversations))

    def check(self) -> None:
        """Fail fast with :class:`JudgeUnavailableError` when the endpoint does not answer
        ``GET /models`` (one attempt per retry, same policy)."""
        try:
            for attempt in retrying(
                retries=self.retries,
                backoff=self.backoff,
                on=_TRANSIENT,
                what=f"judge check of {self.base_url}",
            ):
                with attempt:
                    self._client.models.list()
        except _TRANSIENT as exc:
            raise JudgeUnavailableError(
                f"judge endpoint {self.base_url} is not answering ({type(exc).__name__}: {exc})"
            ) from exc
