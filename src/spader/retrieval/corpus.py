"""The QAMPARI Wikipedia 2021 chunk format (docs/data.md section 1.4).

One JSON object per line of ``*.jsonl`` files, inside ``chunked_wikipedia.tar.gz`` under some
prefix (``wikipedia_chunks/chunks_v5/wikipedia_chunks_<i>.jsonl`` in the release)::

    {"id": "<pageid>__<n>", "contents": "<title> <text>", "meta": {"title": ..., "content": <text>, ...}}

Only ``id``, ``contents`` and ``meta.title`` are corroborated by consumers of the real files, so
the passage text falls back to ``contents`` without its leading title when ``meta.content`` is
missing.

A damaged archive is reported as :class:`CorpusFormatError` naming the archive (and the member
being read): compressed data cut short or damaged, a tar header that does not check, and data left
after what the tar reader took for the end of the archive (a damaged header there makes the reader
stop early without an error, and the gzip checksum at the very end would then go unread: the
archive is therefore always read to its last byte). A line that is not UTF-8 names its file and line.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ChunkReader", "CorpusFormatError", "Passage", "check_record_line", "passage_from_record"]


class CorpusFormatError(ValueError):
    """A corpus line is not a chunk record; the message names the file, the line and the field."""


@dataclass(frozen=True)
class Passage:
    """One retrieved passage as the service returns it."""

    id: str
    title: str
    text: str
    score: float

    def to_dict(self, with_score: bool = True) -> dict[str, Any]:
        """``{id, title, text, score}`` (``score`` left out when ``with_score`` is false)."""
        d: dict[str, Any] = {"id": self.id, "title": self.title, "text": self.text}
        if with_score:
            d["score"] = self.score
        return d


def passage_from_record(record: dict[str, Any], score: float) -> Passage:
    """Build a :class:`Passage` from a chunk record (the raw document stored in the index).

    Args:
        record: ``{"id", "contents", "meta": {"title", "content", ...}}``; ``meta`` is optional.
        score: the passage's retrieval score.
    """
    meta = record.get("meta") or {}
    contents = record.get("contents") or ""
    title = meta.get("title") or ""
    text = meta.get("content")
    if text is None:
        text = contents[len(title) :].lstrip() if title and contents.startswith(title) else contents
    return Passage(id=str(record["id"]), title=title, text=text, score=float(score))


def check_record_line(line: str, where: str) -> None:
    """Raise :class:`CorpusFormatError` naming ``where`` (``file:line``) if ``line`` is not a chunk record."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorpusFormatError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise CorpusFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for field in ("id", "contents"):
        value = record.get(field)
        if not isinstance(value, str) or not value.strip():
            raise CorpusFormatError(f"{where}: field {field!r} must be a non-empty string, got {value!r:.80}")
    if "meta" in record and not isinstance(record["meta"], dict):
        raise CorpusFormatError(f"{where}: field 'meta' must be an object")


class ChunkReader:
    """Iterate over the lines of every ``*.jsonl`` file of a corpus, with byte progress.

    ``source`` is a directory (searched recursively, files in sorted order) or a tar archive
    (``.tar``, ``.tar.gz``, ...; members in archive order, whatever their prefix). Archives are
    streamed, never extracted: the real dump holds ~30 GB of jsonl.

    Iterating yields ``(file, line number, line)`` for non-blank lines; ``file`` is the path, or
    ``archive:member`` for archives (error messages name both).
    """

    def __init__(self, source: str | os.PathLike):
        self.source = Path(source)
        if self.source.is_dir():
            self.files = sorted(p for p in self.source.rglob("*.jsonl") if p.is_file())
            self.total_bytes = sum(p.stat().st_size for p in self.files)
        elif self.source.is_file():
            if not tarfile.is_tarfile(self.source):
                raise CorpusFormatError(
                    f"corpus input {self.source} is neither a directory nor a tar archive"
                )
            self.files = None
            self.total_bytes = self.source.stat().st_size
        else:
            raise FileNotFoundError(
                f"corpus input {self.source} does not exist (a directory of .jsonl files or a .tar.gz)"
            )
        self.members: list[str] = []
        self._done = 0
        self._current: io.BufferedIOBase | None = None

    def bytes_read(self) -> int:
        """Input bytes consumed so far (compressed bytes for an archive)."""
        return self._done + (self._current.tell() if self._current is not None else 0)

    def __iter__(self) -> Iterator[tuple[str, int, str]]:
        if self.files is not None:
            for path in self.files:
                self.members.append(str(path))
                with open(path, "rb") as f:
                    self._current = f
                    yield from _lines(str(path), f)
                self._current = None
                self._done += path.stat().st_size
            return
        try:
            with open(self.source, "rb") as raw, tarfile.open(fileobj=raw, mode="r:*") as tf:
                self._current = raw
                for member in tf:
                    if member.isfile() and member.name.endswith(".jsonl"):
                        stream = tf.extractfile(member)
                        if stream is not None:
                            self.members.append(member.name)
                            yield from _lines(f"{self.source}:{member.name}", stream)
                _read_to_the_end(tf)
                self._current = None
                self._done = self.total_bytes
        except _ARCHIVE_ERRORS as exc:
            after = f" (after member {self.members[-1]})" if self.members else ""
            raise CorpusFormatError(f"{self.source}: damaged archive{after}: {_problem(exc)}") from exc


# What tarfile, gzip, bz2 and lzma raise on damaged bytes.
_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError)


def _problem(exc: BaseException) -> str:
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, EOFError) or "unexpected end" in detail:
        return f"it ends early, as a truncated download does ({detail})"
    return detail


def _read_to_the_end(tf: tarfile.TarFile) -> None:
    """Read what follows the last member: only the zero blocks that end a tar archive may remain.

    tarfile ends its member list at the first header that does not check (past the first one),
    silently; and a compressed stream's checksum is only checked when its last byte is read.
    """
    stream = tf.fileobj
    while block := stream.read(1 << 20):
        if block.strip(b"\0"):
            raise CorpusFormatError(
                f"{tf.name or 'archive'}: damaged archive: data follows what reads as its end "
                "(a damaged tar header; the members after it would be lost)"
            )


def _lines(name: str, stream) -> Iterator[tuple[str, int, str]]:
    for number, raw in enumerate(stream, start=1):
        if raw.isspace():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusFormatError(
                f"{name}:{number}: invalid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line)"
            ) from None
        yield name, number, line
