"""Integrity records of intermediate files: what a stage wrote (bytes, rows, sha256, which rule),
checked by every consumer before it reads the file.

A record is a small JSON file beside the data, ``<file>.integrity`` (no ``.json`` suffix, so
globs over a stage's ``*.json``/``*.jsonl`` outputs never pick records up)::

    {"file": "train.jsonl", "size": 123456, "rows": 6000, "sha256": "...",
     "producer": "mix_training_set", "mtime_ns": ..., "created": "2025-...Z", "extra": {}}

Writers: :func:`spader.data.records.write_frame` records every table it writes; the workflow glue
(:func:`spader.infra.glue.job`) records each file output of a job when it succeeds and verifies
each file input that has a record before the job body runs; downloads record the first complete
copy (:func:`spader.infra.download.fetch`). A file whose bytes, size or row count no longer match
its record raises :class:`IntegrityError` naming the file and the rule that rebuilds it. A file
without a record is accepted (files from outside the pipeline have none); a record without its
file is ignored.

Rows are lines for JSON Lines, the footer's row count for parquet, and not counted otherwise.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "SUFFIX",
    "IntegrityError",
    "Record",
    "count_rows",
    "forget",
    "job_rule",
    "read_record",
    "record_outputs",
    "record_path",
    "set_job_rule",
    "sha256_file",
    "verify",
    "verify_inputs",
    "write_record",
]

SUFFIX = ".integrity"
_CHUNK = 1 << 20

# The rule of the Snakemake job running in this process (set by the workflow glue), named in
# records as their producer. One job per process, so module state is enough.
_JOB_RULE: str | None = None
# Files verified in this process, keyed by (path, size, mtime_ns): a job whose glue verified an
# input does not hash it again when a reader verifies it too.
_VERIFIED: set[tuple[str, int, int]] = set()


class IntegrityError(RuntimeError):
    """An intermediate file does not match its record; the message names the file and the rule."""


@dataclass(frozen=True)
class Record:
    """What was written: size in bytes, rows (None when not counted), sha256 and the producer."""

    file: str
    size: int
    sha256: str
    rows: int | None = None
    producer: str | None = None
    mtime_ns: int = 0
    created: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def set_job_rule(rule: str | None) -> None:
    """Name the rule whose job runs in this process (the producer of what it records)."""
    global _JOB_RULE
    _JOB_RULE = rule


def job_rule() -> str | None:
    """The rule set by :func:`set_job_rule` (None outside a workflow job)."""
    return _JOB_RULE


def record_path(path: str | os.PathLike) -> Path:
    """``x/train.jsonl`` -> ``x/train.jsonl.integrity``."""
    path = Path(path)
    return path.with_name(path.name + SUFFIX)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def count_rows(path: str | os.PathLike) -> int | None:
    """Rows of a ``.jsonl`` (non-blank lines) or ``.parquet`` file (its footer); None for others.

    Raises:
        IntegrityError when a parquet file has no readable footer (truncated).
    """
    path = Path(path)
    if path.suffix == ".jsonl":
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    if path.suffix == ".parquet":
        import polars as pl

        try:
            return int(pl.scan_parquet(path).select(pl.len()).collect().item())
        except Exception as e:  # polars raises several error types for a broken footer
            raise IntegrityError(f"{path}: not a readable parquet file ({e})") from e
    return None


def write_record(
    path: str | os.PathLike,
    *,
    producer: str | None = None,
    sha256: str | None = None,
    rows: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Record:
    """Record ``path`` as it is now (atomically replacing an older record).

    Args:
        path: the data file.
        producer: the rule that wrote it (default: :func:`job_rule`).
        sha256: its digest when the caller computed it while writing (else hashed here).
        rows: its row count when known (else counted for ``.jsonl``/``.parquet``).
        extra: more facts to keep (downloads: source URL and HTTP validators).
    Returns:
        The record.
    """
    path = Path(path)
    st = path.stat()
    rec = Record(
        file=path.name,
        size=st.st_size,
        sha256=sha256 or sha256_file(path),
        rows=rows if rows is not None else count_rows(path),
        producer=producer or _JOB_RULE,
        mtime_ns=st.st_mtime_ns,
        created=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        extra=dict(extra or {}),
    )
    target = record_path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(asdict(rec), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(target)
    _VERIFIED.add((str(path.resolve()), st.st_size, st.st_mtime_ns))
    return rec


def forget(path: str | os.PathLike) -> None:
    """Delete the record of ``path`` (before the file is replaced: a file without a record is
    unverified, while one with a stale record would be reported as corrupt)."""
    record_path(path).unlink(missing_ok=True)


def read_record(path: str | os.PathLike) -> Record | None:
    """The record of ``path``, or None when it has none.

    Raises:
        IntegrityError when the record file itself is unreadable.
    """
    target = record_path(path)
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
        return Record(**{k: data[k] for k in Record.__dataclass_fields__ if k in data})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as e:
        raise IntegrityError(
            f"{target}: unreadable integrity record ({e}); delete it and {path} and rerun the pipeline"
        ) from e


def _rerun_hint(path: Path, rec: Record) -> str:
    rule = f"rule '{rec.producer}'" if rec.producer else "the step that wrote it"
    force = f" (or `snakemake --forcerun {rec.producer}`)" if rec.producer else ""
    return f"delete {path} and run the pipeline again, so that {rule} rebuilds it{force}"


def verify(path: str | os.PathLike, *, what: str = "") -> Record | None:
    """Check ``path`` against its record before reading it.

    Args:
        path: the file.
        what: who is about to read it, for the message (``"rule mix_training_set"``).
    Returns:
        The record, or None when the file has none (nothing to check).
    Raises:
        IntegrityError naming the file, what differs, the producing rule and how to rebuild.
    """
    path = Path(path)
    rec = read_record(path)
    if rec is None or not path.is_file():
        return rec
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _VERIFIED:
        return rec
    reader = f" before {what} reads it" if what else ""
    wrote = f"rule '{rec.producer}'" if rec.producer else "its producer"
    expected = f"{rec.size} bytes" + (f", {rec.rows} rows" if rec.rows is not None else "")
    problem = None
    if st.st_size != rec.size:
        problem = f"it has {st.st_size} bytes, {wrote} wrote {expected}"
    elif rec.rows is not None:
        try:
            rows = count_rows(path)
        except IntegrityError as e:
            rows, problem = None, str(e)
        if problem is None and rows != rec.rows:
            problem = f"it has {rows} rows, {wrote} wrote {expected}"
    if problem is None:
        digest = sha256_file(path)
        if digest != rec.sha256:
            problem = f"its sha256 is {digest}, {wrote} wrote {rec.sha256} ({expected})"
    if problem is not None:
        raise IntegrityError(
            f"{path} was changed after it was written (checked against {record_path(path)}{reader}): "
            f"{problem}. {_rerun_hint(path, rec).capitalize()}."
        )
    _VERIFIED.add(key)
    return rec


def _files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    return [Path(p) for p in paths if Path(p).is_file()]


def verify_inputs(paths: Iterable[str | os.PathLike], *, rule: str | None = None) -> int:
    """Verify every intermediate among ``paths`` that has a record. Directories, unrecorded files
    and downloads are skipped: the downloader verifies a download whenever it runs, and a release
    file edited by hand is a new input (Snakemake reruns what depends on it), not a damaged one.

    Returns:
        How many files were checked.
    """
    checked = 0
    for p in _files(paths):
        rec = read_record(p)
        if rec is None or rec.extra.get("source"):
            continue
        verify(p, what=f"rule '{rule}'" if rule else "")
        checked += 1
    return checked


def record_outputs(paths: Iterable[str | os.PathLike], *, producer: str | None = None) -> int:
    """Record every file among ``paths`` whose record is missing or older than the file (what the
    job's writers recorded themselves is kept). Returns how many records were written."""
    written = 0
    for p in _files(paths):
        st = p.stat()
        rec = read_record(p)
        if rec is not None and rec.size == st.st_size and rec.mtime_ns == st.st_mtime_ns:
            continue
        write_record(p, producer=producer)
        written += 1
    return written
