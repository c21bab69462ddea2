"""The QAMPARI Wikipedia 2021 chunk format (docs/data.md, "The chunked Wikipedia corpus").

One JSON object per line of ``*.jsonl`` files, inside ``chunked_wikipedia.tar.gz`` under some
prefix (``wikipedia_chunks/chunks_v5/wikipedia_chunks_<i>.jsonl`` in the release)::

    {"id": "<pageid>__<n>", "contents": "<title> <text>", "meta": {"title": ..., "content": <text>, ...}}

Only ``id``, ``contents`` and ``meta.title`` are corroborated by consumers of the real files, so
the passage text falls back to ``contents`` without its leading title when ``meta.content`` is
missing.

Chunk files are the ``*.jsonl`` files, plain or gzip-compressed (``*.jsonl.gz``, as Anserini's
JsonCollection also reads them). Nothing else in the source is read, and nothing is skipped
without a word:

* a chunk file compressed another way (``*.jsonl.bz2``, ``.xz``, ``.zst``, ``.zip``...) is refused by
  name, since its passages would otherwise be lost;
* a symbolic or hard link in an archive named like a chunk file is refused by name (its passages
  would be lost, or read twice);
* a hidden file, one rule for an archive and a directory: a name or a directory on its path
  starting with ``.`` (macOS's AppleDouble ``._*`` metadata files, ``.DS_Store``, an editor's
  ``.x.jsonl.swp``, what is under ``.git/``), is not read, whatever its name ends with
  (:func:`is_hidden`);
* every other member or file (directories aside) is counted by kind in :attr:`ChunkReader.skipped`
  and named in the log, and the index build writes the counts into its record (``stats.json``).

A damaged archive is reported as :class:`CorpusFormatError` naming the archive (and the member
being read): compressed data cut short or damaged, a tar header that does not check, and data left
after what the tar reader took for the end of the archive (a damaged header there makes the reader
stop early without an error, and the gzip checksum at the very end would then go unread: the
archive is therefore always read to its last byte). A line that is not UTF-8 names its file and line,
and so does a line longer than :data:`MAX_LINE_BYTES` (read up to that bound, never whole: a
damaged file of one 3 GiB line must not exhaust the memory).
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import lzma
import os
import tarfile
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spader.infra.lines import MAX_LINE_BYTES, LineTooLongError, bounded_lines

__all__ = [
    "MAX_LINE_BYTES",
    "ChunkReader",
    "CorpusFormatError",
    "Passage",
    "check_record_line",
    "chunk_file_kind",
    "is_hidden",
    "passage_from_record",
    "read_lines",
]

log = logging.getLogger(__name__)

# Suffixes of chunk files compressed in a way the reader does not read: refused by name.
_OTHER_COMPRESSIONS = (".bz2", ".xz", ".lzma", ".zst", ".zstd", ".lz4", ".zip", ".7z", ".br", ".z", ".tar")


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


def is_hidden(name: str | os.PathLike) -> bool:
    """Whether a path inside the corpus (an archive member's name, or a file's path relative to
    the corpus directory) is hidden: one of its parts starts with ``.`` (``.`` and ``..`` aside).

    >>> is_hidden("wikipedia_chunks/._wikipedia_chunks_0.jsonl"), is_hidden(".git/x.jsonl")
    (True, True)
    >>> is_hidden("./wikipedia_chunks/chunks_v5/wikipedia_chunks_0.jsonl")
    False
    """
    return any(part.startswith(".") and part not in (".", "..") for part in Path(name).parts)


def chunk_file_kind(name: str) -> str | None:
    """``"plain"`` for ``*.jsonl``, ``"gzip"`` for ``*.jsonl.gz``, ``"other"`` for a chunk file
    compressed in another way (``*.jsonl.bz2``...), None for any other name."""
    lower = name.lower()
    if lower.endswith(".jsonl"):
        return "plain"
    if lower.endswith(".jsonl.gz"):
        return "gzip"
    stem, dot, suffix = lower.rpartition(".")
    if dot and stem.endswith(".jsonl") and f".{suffix}" in _OTHER_COMPRESSIONS:
        return "other"
    return None


def _refuse_other_compression(where: str) -> CorpusFormatError:
    return CorpusFormatError(
        f"{where}: a chunk file compressed in a way the reader does not read; chunk files are "
        ".jsonl or .jsonl.gz (its passages would otherwise be left out)"
    )


class ChunkReader:
    """Iterate over the lines of every chunk file of a corpus, with byte progress.

    ``source`` is a directory (searched recursively, files in sorted order) or a tar archive
    (``.tar``, ``.tar.gz``, ...; members in archive order, whatever their prefix). Archives are
    streamed, never extracted: the real dump holds ~30 GB of jsonl. Chunk files are ``*.jsonl``
    and ``*.jsonl.gz`` (see the module docstring for what is refused and what is counted).

    Iterating yields ``(file, line number, line)`` for non-blank lines; ``file`` is the path, or
    ``archive:member`` for archives (error messages name both). After the iteration,
    :attr:`members` lists the chunk files read and :attr:`skipped` counts what was not read, by
    kind (``hidden file``, ``other file``, ``symbolic link``, ``hard link``, ``special file``).
    """

    def __init__(self, source: str | os.PathLike):
        self.source = Path(source)
        self.skipped: Counter = Counter()
        self.skipped_names: list[str] = []
        if self.source.is_dir():
            self.files = []
            for p in sorted(self.source.rglob("*")):
                if p.is_dir():
                    continue
                if is_hidden(p.relative_to(self.source)):
                    self._skip(str(p), "hidden file")
                    continue
                kind = chunk_file_kind(p.name) if p.is_file() else None
                if kind == "other":
                    raise _refuse_other_compression(str(p))
                if kind is not None:
                    self.files.append(p)
                else:
                    self._skip(str(p), "other file" if p.is_file() else "special file")
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

    def _skip(self, name: str, kind: str) -> None:
        self.skipped[kind] += 1
        if len(self.skipped_names) < 20:
            self.skipped_names.append(f"{name} ({kind})")

    def log_skipped(self) -> None:
        """Log what the source held that is not a chunk file (nothing is skipped without a word)."""
        if self.skipped:
            more = sum(self.skipped.values()) - len(self.skipped_names)
            log.warning(
                "%s: %s not read (not chunk files): %s%s",
                self.source,
                ", ".join(f"{n} {k}{'s' if n > 1 else ''}" for k, n in sorted(self.skipped.items())),
                ", ".join(self.skipped_names),
                f" and {more} more" if more > 0 else "",
            )

    def bytes_read(self) -> int:
        """Input bytes consumed so far (compressed bytes for an archive)."""
        return self._done + (self._current.tell() if self._current is not None else 0)

    def __iter__(self) -> Iterator[tuple[str, int, str]]:
        if self.files is not None:
            for path in self.files:
                self.members.append(str(path))
                with open(path, "rb") as f:
                    self._current = f
                    if chunk_file_kind(path.name) == "gzip":
                        yield from _gzip_lines(str(path), f)
                    else:
                        yield from read_lines(str(path), f)
                self._current = None
                self._done += path.stat().st_size
            self.log_skipped()
            return
        try:
            with open(self.source, "rb") as raw, tarfile.open(fileobj=raw, mode="r:*") as tf:
                self._current = raw
                for member in tf:
                    yield from self._member(tf, member)
                _read_to_the_end(tf)
                self._current = None
                self._done = self.total_bytes
        except _ARCHIVE_ERRORS as exc:
            after = f" (after member {self.members[-1]})" if self.members else ""
            raise CorpusFormatError(f"{self.source}: damaged archive{after}: {_problem(exc)}") from exc
        self.log_skipped()

    def _member(self, tf: tarfile.TarFile, member: tarfile.TarInfo) -> Iterator[tuple[str, int, str]]:
        where = f"{self.source}:{member.name}"
        kind = chunk_file_kind(member.name)
        if member.isdir():
            return
        if is_hidden(member.name):
            self._skip(member.name, "hidden file")
            return
        if member.issym() or member.islnk():
            link = "symbolic link" if member.issym() else "hard link"
            if kind is not None:
                raise CorpusFormatError(
                    f"{where}: a {link} to {member.linkname}; chunk files must be regular members "
                    "(a link's passages would be lost or read twice)"
                )
            self._skip(member.name, link)
            return
        if not member.isfile():
            self._skip(member.name, "special file")
            return
        if kind == "other":
            raise _refuse_other_compression(where)
        if kind is None:
            self._skip(member.name, "other file")
            return
        stream = tf.extractfile(member)
        if stream is None:  # a regular member always has a stream; kept for safety
            self._skip(member.name, "special file")
            return
        self.members.append(member.name)
        if kind == "gzip":
            yield from _gzip_lines(where, stream)
        else:
            yield from read_lines(where, stream)


def _gzip_lines(name: str, stream) -> Iterator[tuple[str, int, str]]:
    """Lines of a gzip-compressed chunk file; damaged compressed data names the file."""
    try:
        with gzip.GzipFile(fileobj=stream, mode="rb") as gz:
            yield from read_lines(name, gz)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise CorpusFormatError(f"{name}: damaged gzip data: {_problem(exc)}") from None


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


def read_lines(name: str, stream, *, max_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[str, int, str]]:
    """``(name, line number, text)`` of each non-blank line of a binary stream, decoded as UTF-8,
    each read up to ``max_bytes`` bytes and no further.

    Raises:
        CorpusFormatError: a line is longer than ``max_bytes`` (named by file and line, after
            reading at most ``max_bytes`` of it) or is not UTF-8.
    """
    lines = bounded_lines(stream, max_bytes)
    while True:
        try:
            number, raw = next(lines)
        except StopIteration:
            return
        except LineTooLongError as exc:
            raise CorpusFormatError(f"{name}:{exc.line}: {exc}") from None
        if raw.isspace():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusFormatError(
                f"{name}:{number}: invalid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line)"
            ) from None
        yield name, number, line
