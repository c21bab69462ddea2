"""Reading and decoding request bodies under hard limits, before anything else sees them.

Every limit here is checked on the raw bytes, so a hostile body costs the service little and is
answered with a 4xx naming the limit:

* size: ``Content-Length`` is checked first, and the body is counted while it streams in, so an
  oversized body (declared or not) is refused after reading at most ``limit`` bytes;
* nesting: the depth of ``[``/``{`` outside JSON strings is measured with numpy before the JSON
  parser runs (the parser recurses once per level and would otherwise fail on deep nests); a body
  with no more brackets in all than the limit skips the measurement (an ordinary request has two);
* numbers: integers and decimals longer than a few dozen characters, ``NaN``/``Infinity`` and
  literals that overflow to infinity (``1e999``) are refused while parsing (Python's ``int`` refuses more than 4,300 digits with a bare
  ``ValueError``, and nothing in a search request needs more than a small integer).
"""

from __future__ import annotations

import json
import math
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
_BRACKETS = np.frombuffer(b"[{]}", dtype=np.uint8)


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

    Escapes are neutralised first with two byte replacements (``\\\\`` then ``\\"``, left to
    right as JSON pairs them), so every quote left opens or closes a string; then, vectorised, a
    bracket counts only where an even number of quotes precede it. Linear; on a 5.6 MB body full of
    escapes and brackets 5-8x faster than the per-byte position arrays it replaces
    (``bench/retrieval_bodies.py``).

    Args:
        raw: a JSON document as bytes (invalid JSON gives some number; the parser rejects it later).

    Returns:
        The maximum depth (0 for a scalar).
    """
    clean = raw.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    b = np.frombuffer(clean, dtype=np.uint8)
    brackets = np.flatnonzero(np.isin(b, _BRACKETS))
    if brackets.size == 0:
        return 0
    quotes = np.flatnonzero(b == 0x22)
    outside = brackets[np.searchsorted(quotes, brackets) % 2 == 0]
    if outside.size == 0:
        return 0
    step = np.where(np.isin(b[outside], _OPEN), 1, -1).astype(np.int32)
    return int(max(0, np.cumsum(step).max()))


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text)} characters; the limit is {MAX_NUMBER_CHARS}")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text)} characters; the limit is {MAX_NUMBER_CHARS}")
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is too large for a number (it would be infinite)")
    return value


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of the body, refused when it names a key twice: which value is meant is
    ambiguous (the decoder would keep the last one silently)."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(
                f"field {key!r} is given twice in one object (which value is meant is ambiguous)"
            )
        obj[key] = value
    return obj


def parse_json(raw: bytes) -> Any:
    """Decode a request body under the depth and number limits.

    Args:
        raw: the body (UTF-8, or UTF-16/32 with the encoding JSON allows).

    Returns:
        The decoded value.

    Raises:
        BadSearchRequestError: 400 naming what is wrong (not JSON, not text, nested deeper than
            :data:`MAX_DEPTH`, a number longer than :data:`MAX_NUMBER_CHARS`, NaN or Infinity, a key
            given twice in one object).
    """
    depth = json_depth(raw) if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH else 0
    if depth > MAX_DEPTH:
        raise BadSearchRequestError(
            f"request body is JSON nested {depth} levels deep; the limit is {MAX_DEPTH}", 400
        )
    try:
        return json.loads(
            raw, parse_int=_int, parse_float=_float, parse_constant=_constant, object_pairs_hook=_object
        )
    except UnicodeDecodeError as exc:
        raise BadSearchRequestError(f"request body is not valid JSON text: {exc}", 400) from None
    except RecursionError:  # unreachable after the depth check; kept so no input can become a 500
        raise BadSearchRequestError("request body is JSON nested too deeply", 400) from None
    except ValueError as exc:  # JSONDecodeError, and the limits above
        raise BadSearchRequestError(f"request body is not valid JSON: {exc}", 400) from None
