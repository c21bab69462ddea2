"""Reading lines of a file with a bound: a damaged or wrong file of one 3 GiB line must end in an
error naming its line, after reading no more than the bound, never in a MemoryError.

The readers of release files (:mod:`spader.data.readers`) and of the corpus dump
(:mod:`spader.retrieval.corpus`) read through :func:`bounded_lines` and turn
:class:`LineTooLongError` into their own error naming the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

__all__ = ["MAX_LINE_BYTES", "LineTooLongError", "bounded_lines", "read_bounded"]

#: The longest line a corpus or release file may hold (a passage is about 1 KB, a QAMPARI record
#: with its proofs tens of KB).
MAX_LINE_BYTES = 64 << 20


class LineTooLongError(ValueError):
    """Line ``line`` is longer than ``limit`` bytes (only ``limit`` bytes of it were read)."""

    def __init__(self, line: int, limit: int):
        self.line, self.limit = line, limit
        super().__init__(f"line longer than {limit:,} bytes (read no further; a damaged or wrong file?)")


def bounded_lines(stream: IO[bytes], max_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(1-based line number, bytes)`` of each line of a binary stream, newline included.

    Raises:
        LineTooLongError: a line has more than ``max_bytes`` bytes before its newline; at most
            ``max_bytes + 1`` of its bytes were read.
    """
    number = 0
    while raw := stream.readline(max_bytes + 1):
        number += 1
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            raise LineTooLongError(number, max_bytes)
        yield number, raw


def read_bounded(stream: IO[bytes], max_bytes: int) -> bytes | None:
    """The whole stream, or None when it holds more than ``max_bytes`` bytes (at most
    ``max_bytes + 1`` are read)."""
    data = stream.read(max_bytes + 1)
    return None if len(data) > max_bytes else data
