"""The retrieval service's HTTP/1.1 protocol: uvicorn's h11 protocol, made to answer every error
it can in JSON, to stop waiting for requests that do not arrive, and to cap open connections.

uvicorn answers a request it cannot parse itself, before the app sees it, with a plain-text
``400 Invalid HTTP request received.``; it waits for a request's headers and body as long as the
client likes; and it accepts connections until the process runs out of file descriptors. This
protocol (:func:`protocol_class`, passed to uvicorn as its ``http`` implementation) changes three
things and nothing else:

* **Framing errors in JSON.** Whatever h11 refuses while reading a request is answered with
  ``{"error": "malformed HTTP request: <what h11 found>"}``, status 400 (431 for headers over
  h11's 16 KiB limit): an invalid chunk size, a negative, non-numeric or conflicting duplicate
  ``Content-Length``, ``Content-Length`` together with ``Transfer-Encoding``, a transfer coding
  other than chunked, a NUL or another control character in a header, a header line without a
  colon, an invalid request line or HTTP version, bytes that are not HTTP at all (a TLS
  handshake sent to the plain port). The connection is then closed: after a framing error the
  rest of the stream cannot be trusted.
* **Read timeouts.** The headers of a request must arrive within ``header_timeout_s`` of its first
  byte (or of the connection, for its first request), the body within ``body_timeout_s`` of the
  headers; otherwise the client gets ``408`` with a JSON error naming the setting and the
  connection is closed. A connection that never sends a byte is closed after ``header_timeout_s``
  without an answer; one that stays idle after a response is closed by uvicorn's keep-alive
  timeout (75 s, :func:`spader.retrieval.service.serve`).
* **A connection cap.** A connection beyond ``max_connections`` open ones is answered ``503``
  with a JSON error (the client retries 5xx with backoff) and closed before any request is read.
* **Requests cut by a shutdown.** When the server stops, a request whose headers or body are still
  arriving is answered ``503`` with a JSON error at once (uvicorn would wait for it, then cancel it
  with a plain-text 500).

What the protocol cannot answer, and why: a client that closes its connection or resets it (no
one is left to answer); an error after the response has started (HTTP has no way to replace a
response half sent; the connection is closed); connections the kernel refuses before the process
sees them (a full listen backlog). WebSocket upgrades are not served (``ws="none"``): the upgrade
header is ignored and the request answered as plain HTTP.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

log = logging.getLogger(__name__)

__all__ = ["GuardedH11Protocol", "Limits", "protocol_class"]

# After an error answer the connection is half-closed and what the client still sends is read and
# dropped for this long: closing at once would make the kernel reset the connection when those
# bytes arrive, and a reset can discard the answer before the client reads it.
_LINGER_S = 2.0


@dataclass(frozen=True)
class Limits:
    """How long a request may take to arrive, and how many connections may be open."""

    header_timeout_s: float = 20.0
    body_timeout_s: float = 60.0
    max_connections: int = 1024


class _Connection(h11.Connection):
    """h11's connection, keeping the error it raised (uvicorn's handler does not pass it on)."""

    error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.error = exc
            raise


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with JSON errors, read timeouts and a connection cap (module doc)."""

    limits = Limits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        size = self.config.h11_max_incomplete_event_size
        self.conn = _Connection(h11.SERVER, size if size is not None else DEFAULT_MAX_INCOMPLETE_EVENT_SIZE)
        self._timer: Any = None
        self._waiting_for: str | None = None  # "headers" or "body": what the armed timer waits for
        self._requests = 0
        self._lingering = False

    # ---- connections -------------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            log.warning("refused a connection: %d open, the limit is %d", len(self.connections) - 1,
                        self.limits.max_connections)  # fmt: skip
            self._answer(
                503,
                f"the retrieval service has {len(self.connections) - 1} open connections, its limit "
                f"(retrieval.service.max_connections: {self.limits.max_connections}); retry later",
            )
            return
        self._arm("headers", self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # answered and closing: the rest of what the client sends is dropped
        super().data_received(data)

    def eof_received(self) -> bool | None:
        if self._lingering:
            self.transport.close()
        return None

    def _linger(self) -> None:
        """Close after an error answer without a reset: stop writing, drop what still arrives,
        close when the client does or after ``_LINGER_S``."""
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.transport.resume_reading()
        self.loop.call_later(_LINGER_S, self.transport.close)

    def shutdown(self) -> None:
        """The server stops: a request still arriving is answered now, in JSON."""
        arriving = self.conn.their_state is h11.SEND_BODY or (
            self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])
        )
        if arriving and not (self.cycle is not None and self.cycle.response_started):
            log.warning("the service is stopping: a request still arriving is answered 503")
            self._answer(503, "the retrieval service is shutting down and cut this request short; retry it")
            return
        super().shutdown()

    # ---- timers --------------------------------------------------------------------------------
    def _arm(self, what: str, seconds: float) -> None:
        if self._waiting_for == what:
            return
        self._disarm()
        self._waiting_for = what
        self._timer = self.loop.call_later(seconds, self._timed_out, what)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._waiting_for = None

    def handle_events(self) -> None:
        before = self.conn.their_state
        super().handle_events()
        if self.transport.is_closing():
            self._disarm()
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm("body", self.limits.body_timeout_s)
        elif state is h11.IDLE and (self.conn.trailing_data[0] or self._requests == 0):
            self._arm("headers", self.limits.header_timeout_s)  # a request has begun to arrive
        else:
            self._disarm()
        if before is h11.IDLE and state is not h11.IDLE:
            self._requests += 1

    def _timed_out(self, what: str) -> None:
        self._timer = self._waiting_for = None
        if self.transport.is_closing():
            return
        if what == "headers" and not self.conn.trailing_data[0]:
            self.transport.close()  # nothing was sent: nothing to answer
            return
        key = "header_timeout_s" if what == "headers" else "body_timeout_s"
        seconds = self.limits.header_timeout_s if what == "headers" else self.limits.body_timeout_s
        log.warning("request %s not received within %.0f s; closing the connection", what, seconds)
        self._answer(
            408, f"the request's {what} did not arrive within {seconds:g} s (retrieval.service.{key})"
        )

    # ---- answers -------------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        exc = self.conn.error
        hint = getattr(exc, "error_status_hint", 400)
        status = hint if 400 <= hint < 500 else 400
        detail = str(exc) if exc is not None and str(exc) else msg
        self._answer(status, f"malformed HTTP request: {detail}")

    def _answer(self, status: int, message: str) -> None:
        """Answer ``{"error": message}`` with ``status`` and close, unless the app has begun to
        answer this request (then only close: HTTP cannot replace a response half sent)."""
        self._disarm()
        cycle = self.cycle
        if cycle is not None:
            cycle.disconnected = True  # the app's receive() now reports a disconnect
            cycle.message_event.set()
        if self.transport.is_closing():
            return
        if cycle is not None and cycle.response_started:
            self._linger()  # an answer was (or is being) sent: nothing more can be said
            return
        body = json.dumps({"error": message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            out = self.conn.send(
                h11.Response(status_code=status, headers=headers, reason=STATUS_PHRASES[status])
            )
            out += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:  # h11 has no request to answer (none, or one it refused)
            head = b"HTTP/1.1 %d %s\r\n" % (status, STATUS_PHRASES[status])
            out = head + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n" + body
        self.transport.write(out)
        self._linger()


def protocol_class(limits: Limits) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn instantiates per connection, carrying ``limits``."""
    return type("RetrievalHTTPProtocol", (GuardedH11Protocol,), {"limits": limits})
