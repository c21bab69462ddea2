"""Reading and decoding request bodies under hard limits, before anything else sees them.

Every limit here is checked on the raw bytes, so a hostile body costs the service little and is
answered with a 4xx naming the limit:

* size: ``Content-Length`` is checked first, and the body is counted while it streams in, so an
  oversized body (declared or not) is refused after reading at most ``limit`` bytes;
* nesting: the depth of ``[``/``{`` outside JSON strings is measured with numpy before the JSON
  parser runs (the parser recurses once per level and would otherwise fail on deep nests);
* numbers: integers and decimals longer than a few dozen characters, and ``NaN``/``Infinity``,
  are refused while parsing (Python's ``int`` refuses more than 4,300 digits with a bare
  ``ValueError``, and nothing in a search request needs more than a small integer).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from spader.retrieval.errors import BadSearchRequestError

__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "json_depth", "parse_json", "read_limited"]

# A search request is an object holding a list of strings: depth 2. Some slack for clients that
# send extra structure we then reject by name, but never anything that makes the parser recurse far.
MAX_DEPTH = 16
MAX_NUMBER_CHARS = 40

_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)


async def read_limited(chunks: AsyncIterator[bytes], limit: int, declared: str | None = None) -> bytes:
    """The whole body, refusing it as soon as it is known to exceed ``limit`` bytes.

    Args:
        chunks: the body as it arrives (Starlette's ``request.stream()``).
        limit: the largest accepted body in bytes.
        declared: the ``Content-Length`` header, if any (checked before reading anything).

    Returns:
        The body.

    Raises:
        BadSearchRequestError: 413 when the body is larger than ``limit``; 400 for a
            ``Content-Length`` that is not a number.
    """
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadSearchRequestError(f"Content-Length {declared[:40]!a} is not a number", 400) from None
        if size > limit:
            raise BadSearchRequestError(
                f"request body of {size} bytes is larger than the limit of {limit} bytes", 413
            )
    parts: list[bytes] = []
    read = 0
    async for chunk in chunks:
        read += len(chunk)
        if read > limit:
            raise BadSearchRequestError(f"request body is larger than the limit of {limit} bytes", 413)
        parts.append(chunk)
    return b"".join(parts)


def json_depth(raw: bytes) -> int:
    """Deepest nesting of ``[``/``{`` in ``raw``, brackets inside JSON strings not counted.

    Vectorised (no Python loop per byte): a quote opens or closes a string unless an odd run of
    backslashes precedes it; brackets count only where an even number of real quotes precede them.

    Args:
        raw: a JSON document as bytes (invalid JSON gives some number; the parser rejects it later).

    Returns:
        The maximum depth (0 for a scalar).
    """
    b = np.frombuffer(raw, dtype=np.uint8)
    if b.size == 0:
        return 0
    pos = np.arange(b.size)
    last_plain = np.maximum.accumulate(np.where(b != 0x5C, pos, -1))  # last non-backslash at or before i
    quotes = np.flatnonzero(b == 0x22)
    before = np.where(quotes > 0, last_plain[np.maximum(quotes - 1, 0)], -1)
    run = np.where(quotes > 0, quotes - 1 - before, 0)  # backslashes right before each quote
    real = np.zeros(b.size, dtype=np.int32)
    real[quotes[run % 2 == 0]] = 1
    outside = (np.cumsum(real) - real) % 2 == 0  # an even number of real quotes before i
    step = np.isin(b, _OPEN).astype(np.int32) - np.isin(b, _CLOSE).astype(np.int32)
    step[~outside] = 0
    return int(max(0, np.cumsum(step).max()))


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text)} characters; the limit is {MAX_NUMBER_CHARS}")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text)} characters; the limit is {MAX_NUMBER_CHARS}")
    return float(text)


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> Any:
    """Decode a request body under the depth and number limits.

    Args:
        raw: the body (UTF-8, or UTF-16/32 with the encoding JSON allows).

    Returns:
        The decoded value.

    Raises:
        BadSearchRequestError: 400 naming what is wrong (not JSON, not text, nested deeper than
            :data:`MAX_DEPTH`, a number longer than :data:`MAX_NUMBER_CHARS`, NaN or Infinity).
    """
    depth = json_depth(raw)
    if depth > MAX_DEPTH:
        raise BadSearchRequestError(
            f"request body is JSON nested {depth} levels deep; the limit is {MAX_DEPTH}", 400
        )
    try:
        return json.loads(raw, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except UnicodeDecodeError as exc:
        raise BadSearchRequestError(f"request body is not valid JSON text: {exc}", 400) from None
    except RecursionError:  # unreachable after the depth check; kept so no input can become a 500
        raise BadSearchRequestError("request body is JSON nested too deeply", 400) from None
    except ValueError as exc:  # JSONDecodeError, and the limits above
        raise BadSearchRequestError(f"request body is not valid JSON: {exc}", 400) from None
