"""Integrity records of what the pipeline writes: bytes, rows, sha256 and the rule that wrote it,
checked by every consumer before it reads the file or directory.

Where records live: in ONE hidden directory per data tree, out of the user's way. The tree is the
nearest ancestor directory named ``results`` (what jobs write) or ``resources`` (downloads); a path
under neither keeps its records in ``.integrity/`` beside it. The record of ``<tree>/<rel>`` is
``<tree>/.integrity/<rel>.json``::

    results/qwen3_8b/models/spader/                 (a directory output: model weights)
    results/qwen3_8b/models/spader.json
    results/.integrity/qwen3_8b/models/spader.json       <- the directory's manifest
    results/.integrity/qwen3_8b/models/spader.json.json  <- the metadata file's record

One file per record, written to a temporary name and renamed into place: jobs running at once on
a cluster's shared file system each write only the records of their own outputs, and a reader never
sees half a record (no database whose locking a network file system may not honour). Records hold
paths relative to their tree only, so a results directory that is moved or copied (the demo run
from a copy of the repository) keeps valid records. The directory is git-ignored.

A file's record::

    {"path": "demo/data/mix/train.jsonl", "kind": "file", "size": 123456, "rows": 6000,
     "sha256": "...", "producer": "mix_training_set", "mtime_ns": ..., "created": "2025-...Z",
     "extra": {}}

A directory's record (``kind: directory``) is a manifest: ``files`` lists every file under it
(``[relative path, bytes, sha256]``, sorted), ``size`` is their total and ``sha256`` the digest of
the manifest itself. A file added, removed, resized or changed in place is reported by name.

Writers: :func:`spader.data.records.write_frame` records every table it writes; the workflow glue
(:func:`spader.infra.glue.job`) records each output of a job, files and directories, when it
succeeds, and verifies each input that has a record before the job body runs, downloads included
(a download damaged in place, even with its size and modification time kept, is caught by the next
job that reads it); downloads record the first complete copy (:func:`spader.infra.download.fetch`).
A file whose bytes, size or row count no longer match its record raises :class:`IntegrityError`
naming the file and the rule that rebuilds it.

A missing record is reported where one is expected (:func:`expects_record`): for everything under
the workflow's ``results`` tree (every job records its outputs) and for downloads (a file with the ``.verified``
twin the downloader keeps). Elsewhere (files from outside the pipeline: a prebuilt index, a local
model directory) a file without a record is accepted. Records of the earlier layout, a
``<file>.integrity`` sidecar, are moved into the tree's directory when first read.

Rows are lines for JSON Lines, the footer's row count for parquet, and not counted otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spader.infra.atomic import atomic_write

log = logging.getLogger(__name__)

__all__ = [
    "DOWNLOAD_TWIN_SUFFIX",
    "STORE",
    "TREES",
    "IntegrityError",
    "Record",
    "annotate",
    "count_rows",
    "expects_record",
    "forget",
    "job_rule",
    "read_record",
    "record_outputs",
    "record_path",
    "set_job_rule",
    "sha256_file",
    "store_root",
    "verify",
    "verify_inputs",
    "write_record",
]

#: The hidden directory of a tree that holds its records.
STORE = ".integrity"
#: Names of the directories whose subtrees keep their records in one place.
TREES = ("results", "resources")
#: Suffix of the second hard link the downloader keeps of every verified download
#: (:func:`spader.infra.download.keep_path`): its presence marks a file as a download.
DOWNLOAD_TWIN_SUFFIX = ".verified"
_LEGACY_SUFFIX = ".integrity"  # the earlier layout: a record beside each file
_SNAKEMAKE_FLAG = ".snakemake_timestamp"
_CHUNK = 1 << 20
_HASH_THREADS = 4  # hashlib releases the GIL: a directory of shards is hashed in parallel

# The rule of the Snakemake job running in this process (set by the workflow glue), named in
# records as their producer. One job per process, so module state is enough.
_JOB_RULE: str | None = None
# What was verified in this process, keyed by path and (size, mtime) of the file or of every file
# of a directory: a job whose glue verified an input does not hash it again when a reader does.
_VERIFIED: set[tuple] = set()


class IntegrityError(RuntimeError):
    """An intermediate does not match its record, or its record is missing where one is
    expected; the message names the file and the rule that rebuilds it."""


@dataclass(frozen=True)
class Record:
    """What was written: size in bytes, rows (None when not counted), sha256 and the producer.

    ``path`` is relative to the record's tree (:func:`store_root`); ``files`` is the manifest of
    a directory (``[relative path, bytes, sha256]`` per file), empty for a file.
    """

    path: str
    size: int
    sha256: str
    kind: str = "file"
    rows: int | None = None
    producer: str | None = None
    mtime_ns: int = 0
    created: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    files: list[list[Any]] = field(default_factory=list)


def set_job_rule(rule: str | None) -> None:
    """Name the rule whose job runs in this process (the producer of what it records). A new job
    forgets what earlier ones verified: its inputs are hashed again, whatever their size and time."""
    global _JOB_RULE
    _JOB_RULE = rule
    _VERIFIED.clear()


def job_rule() -> str | None:
    """The rule set by :func:`set_job_rule` (None outside a workflow job)."""
    return _JOB_RULE


def store_root(path: str | os.PathLike) -> Path:
    """The tree whose record directory holds the record of ``path``: the nearest ancestor named
    ``results`` or ``resources`` (as written, else of the absolute path), else ``path``'s own
    directory."""
    path = Path(os.path.normpath(path))
    for candidates in (path.parents, Path(os.path.abspath(path)).parents):
        for parent in candidates:
            if parent.name in TREES:
                return parent
    return path.parent


def _relative(path: Path, root: Path) -> Path:
    try:
        return path.relative_to(root)
    except ValueError:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(root))


def record_path(path: str | os.PathLike) -> Path:
    """``results/demo/data/mix/train.jsonl`` -> ``results/.integrity/demo/data/mix/train.jsonl.json``."""
    path = Path(os.path.normpath(path))
    root = store_root(path)
    rel = _relative(path, root)
    return root / STORE / rel.parent / f"{rel.name}.json"


def _legacy_path(path: Path) -> Path:
    return path.with_name(path.name + _LEGACY_SUFFIX)


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


def _tree_files(directory: Path) -> list[tuple[str, Path]]:
    """``(relative path, path)`` of every file under ``directory``, sorted; left out are record
    directories of a tree that happens to lie inside, and the empty flag file Snakemake touches
    in every directory output after its job (``.snakemake_timestamp``: it carries the output's
    time, and is written after the job recorded the directory)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != STORE)
        for name in filenames:
            if name == _SNAKEMAKE_FLAG and Path(dirpath) == directory:
                continue
            full = Path(dirpath) / name
            if full.is_file():
                out.append((full.relative_to(directory).as_posix(), full))
    return sorted(out)


def _fingerprint(path: Path) -> tuple:
    """What a rewrite of ``path`` changes cheaply: size and mtime (of each file of a directory)."""
    if path.is_dir():
        return tuple((rel, f.stat().st_size, f.stat().st_mtime_ns) for rel, f in _tree_files(path))
    st = path.stat()
    return (st.st_size, st.st_mtime_ns)


def _manifest(directory: Path) -> list[list[Any]]:
    files = _tree_files(directory)
    with ThreadPoolExecutor(max_workers=min(_HASH_THREADS, max(1, len(files)))) as pool:
        digests = list(pool.map(sha256_file, [f for _, f in files]))
    return [[rel, f.stat().st_size, d] for (rel, f), d in zip(files, digests, strict=True)]


def _manifest_digest(files: list[list[Any]]) -> str:
    h = hashlib.sha256()
    for rel, size, digest in files:
        h.update(f"{rel}\0{size}\0{digest}\n".encode())
    return h.hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _store(path: Path, rec: Record) -> None:
    # a temporary name no other writer uses (jobs on several nodes may write records in one
    # directory), removed when the write fails (a full disk): no .tmp among the records
    atomic_write(record_path(path), json.dumps(asdict(rec), indent=2, sort_keys=True) + "\n")
    _legacy_path(path).unlink(missing_ok=True)


def write_record(
    path: str | os.PathLike,
    *,
    producer: str | None = None,
    sha256: str | None = None,
    rows: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Record:
    """Record ``path`` (a file, or a directory as a manifest of its files) as it is now,
    atomically replacing an older record.

    Args:
        path: the data file or directory.
        producer: the rule that wrote it (default: :func:`job_rule`).
        sha256: a file's digest when the caller computed it while writing (else hashed here).
        rows: a file's row count when known (else counted for ``.jsonl``/``.parquet``).
        extra: more facts to keep (downloads: the source as configured, HTTP validators).
    Returns:
        The record.
    """
    path = Path(os.path.normpath(path))
    rel = _relative(path, store_root(path)).as_posix()
    producer = producer or _JOB_RULE
    if path.is_dir():
        fingerprint = _fingerprint(path)
        files = _manifest(path)
        rec = Record(
            path=rel,
            kind="directory",
            size=sum(f[1] for f in files),
            sha256=_manifest_digest(files),
            producer=producer,
            mtime_ns=path.stat().st_mtime_ns,
            created=_now(),
            extra=dict(extra or {}),
            files=files,
        )
    else:
        st = path.stat()
        fingerprint = (st.st_size, st.st_mtime_ns)
        rec = Record(
            path=rel,
            size=st.st_size,
            sha256=sha256 or sha256_file(path),
            rows=rows if rows is not None else count_rows(path),
            producer=producer,
            mtime_ns=st.st_mtime_ns,
            created=_now(),
            extra=dict(extra or {}),
        )
    _store(path, rec)
    _VERIFIED.add((os.path.abspath(path), fingerprint))
    return rec


def forget(path: str | os.PathLike) -> None:
    """Delete the record of ``path`` (before the file is replaced: a stale record would report
    the new content as corrupt)."""
    path = Path(os.path.normpath(path))
    record_path(path).unlink(missing_ok=True)
    _legacy_path(path).unlink(missing_ok=True)


def _parse(text: str) -> Record:
    data = json.loads(text)
    if "path" not in data and "file" in data:  # the earlier layout named the file only
        data["path"] = data["file"]
    return Record(**{k: data[k] for k in Record.__dataclass_fields__ if k in data})


def read_record(path: str | os.PathLike) -> Record | None:
    """The record of ``path``, or None when it has none.

    Raises:
        IntegrityError when the record file itself is unreadable.
    """
    path = Path(os.path.normpath(path))
    target = record_path(path)
    try:
        return _parse(target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError) as e:
        raise IntegrityError(
            f"{target}: unreadable integrity record ({e}); delete it and {path} and rerun the pipeline"
        ) from e
    legacy = _legacy_path(path)
    try:
        rec = _parse(legacy.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None
    rec = Record(**{**asdict(rec), "path": _relative(path, store_root(path)).as_posix()})
    _store(path, rec)  # moved into the tree's record directory
    log.info("moved the integrity record %s to %s", legacy, target)
    return rec


def expects_record(path: str | os.PathLike) -> str | None:
    """Why ``path`` must have a record (None when it need not): it lies in the workflow's
    ``results`` tree (the one in the working directory, or one that holds records already), where
    every job records its outputs; or it is a download (the downloader keeps a ``.verified`` twin
    of each). A checkout that happens to sit in some other directory named ``results`` has no
    record directory there, so its files are not expected to have records."""
    path = Path(os.path.normpath(path))
    root = store_root(path)
    if root.name == "results" and (
        (root / STORE).is_dir() or os.path.abspath(root) == os.path.abspath("results")
    ):
        return "every output under results/ is recorded by the job that writes it"
    if path.with_name(path.name + DOWNLOAD_TWIN_SUFFIX).exists():
        return "it was downloaded (its verified copy exists) and every download is recorded"
    return None


def _rerun_hint(path: Path, rec: Record) -> str:
    rule = f"rule '{rec.producer}'" if rec.producer else "the step that wrote it"
    force = f" (or `snakemake --forcerun {rec.producer}`)" if rec.producer else ""
    return f"delete {path} and run the pipeline again, so that {rule} rebuilds it{force}"


def _missing(path: Path, why: str, reader: str) -> IntegrityError:
    twin = path.with_name(path.name + DOWNLOAD_TWIN_SUFFIX)
    also = f" and {twin}" if twin.exists() else ""
    return IntegrityError(
        f"{path} has no integrity record ({record_path(path)} is missing{reader}), although {why}: "
        f"it cannot be checked. Delete {path}{also} and run the pipeline again, so that it is rebuilt "
        "(or downloaded) and recorded; or, if you know it is intact (written before records existed), "
        f"record it as it is: spader integrity record {path}"
    )


def _file_problem(path: Path, rec: Record, wrote: str) -> str | None:
    st = path.stat()
    expected = f"{rec.size} bytes" + (f", {rec.rows} rows" if rec.rows is not None else "")
    if st.st_size != rec.size:
        return f"it has {st.st_size} bytes, {wrote} wrote {expected}"
    if rec.rows is not None:
        try:
            rows = count_rows(path)
        except IntegrityError as e:
            return str(e)
        if rows != rec.rows:
            return f"it has {rows} rows, {wrote} wrote {expected}"
    digest = sha256_file(path)
    if digest != rec.sha256:
        return f"its sha256 is {digest}, {wrote} wrote {rec.sha256} ({expected})"
    return None


def _directory_problem(path: Path, rec: Record, wrote: str) -> str | None:
    now = dict((rel, f) for rel, f in _tree_files(path))
    then = {rel: (size, digest) for rel, size, digest in rec.files}
    missing = sorted(set(then) - set(now))
    added = sorted(set(now) - set(then))
    if missing:
        return f"{len(missing)} of the {len(then)} files {wrote} wrote are missing ({', '.join(missing[:5])})"
    if added:
        return f"{len(added)} files were added after {wrote} wrote it ({', '.join(added[:5])})"
    resized = [(rel, now[rel].stat().st_size, then[rel][0]) for rel in sorted(then)]
    resized = [r for r in resized if r[1] != r[2]]
    if resized:
        rel, size, was = resized[0]
        return f"{rel} has {size} bytes, {wrote} wrote {was}"
    rels = sorted(then)
    with ThreadPoolExecutor(max_workers=min(_HASH_THREADS, max(1, len(rels)))) as pool:
        digests = list(pool.map(sha256_file, [now[r] for r in rels]))
    changed = [r for r, d in zip(rels, digests, strict=True) if d != then[r][1]]
    if changed:
        rel = changed[0]
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        return f"{rel}{more} changed: its sha256 is {digests[rels.index(rel)]}, {wrote} wrote {then[rel][1]}"
    return None


def verify(path: str | os.PathLike, *, what: str = "") -> Record | None:
    """Check a file or directory against its record before reading it.

    Args:
        path: the file or directory.
        what: who is about to read it, for the message (``"rule mix_training_set"``).
    Returns:
        The record, or None when there is none and none is expected (nothing to check).
    Raises:
        IntegrityError naming the file, what differs, the producing rule and how to rebuild; or
        that its record is missing where one is expected (:func:`expects_record`).
    """
    path = Path(os.path.normpath(path))
    if not path.exists():
        return read_record(path)
    reader = f", before {what} reads it" if what else ""
    rec = read_record(path)
    if rec is None:
        why = expects_record(path)
        if why is not None:
            raise _missing(path, why, reader)
        return None
    key = (os.path.abspath(path), _fingerprint(path))
    if key in _VERIFIED:
        return rec
    wrote = f"rule '{rec.producer}'" if rec.producer else "its producer"
    if path.is_dir() != (rec.kind == "directory"):
        problem = f"it is a {'directory' if path.is_dir() else 'file'}, {wrote} wrote a {rec.kind}"
    elif path.is_dir():
        problem = _directory_problem(path, rec, wrote)
    else:
        problem = _file_problem(path, rec, wrote)
    if problem is not None:
        raise IntegrityError(
            f"{path} was changed after it was written (checked against {record_path(path)}{reader}): "
            f"{problem}. {_rerun_hint(path, rec).capitalize()}."
        )
    _VERIFIED.add(key)
    return rec


def verify_inputs(paths: Iterable[str | os.PathLike], *, rule: str | None = None) -> int:
    """Verify every input among ``paths``, files and directories, downloads included: those with
    a record against it, those without one where a record is expected (:func:`expects_record`)
    reported as such.

    Returns:
        How many inputs were checked against a record.
    """
    checked = 0
    for p in (Path(p) for p in paths):
        if p.exists() and verify(p, what=f"rule '{rule}'" if rule else "") is not None:
            checked += 1
    return checked


def record_outputs(paths: Iterable[str | os.PathLike], *, producer: str | None = None) -> int:
    """Record every output among ``paths``: each directory as a manifest, each file whose record
    is missing or older than the file (what the job's writers recorded themselves is kept).

    Returns:
        How many records were written.
    """
    written = 0
    for p in (Path(p) for p in paths):
        if p.is_file():
            st = p.stat()
            rec = read_record(p)
            if rec is not None and rec.size == st.st_size and rec.mtime_ns == st.st_mtime_ns:
                continue
        elif not p.is_dir():
            continue
        write_record(p, producer=producer)
        written += 1
    return written


def annotate(paths: Iterable[str | os.PathLike], **facts: Any) -> int:
    """Add ``facts`` to the ``extra`` of the existing records of ``paths`` (a job's outputs, after
    :func:`record_outputs`): the code param a job was planned with, for instance, which a stage
    whose code changes rerun nothing plans with again (``spader.infra.stage_code``).

    Returns:
        How many records were updated (paths without a record are skipped).
    """
    updated = 0
    for p in (Path(os.path.normpath(p)) for p in paths):
        rec = read_record(p)
        if rec is None:
            continue
        extra = {**(rec.extra or {}), **facts}
        if extra != rec.extra:
            _store(p, dataclasses.replace(rec, extra=extra))
            updated += 1
    return updated


HELP = "record files or directories as they are (record), or check them against their records (verify)"


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["record", "verify"])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--producer", default=None, help="the rule that wrote them (record)")


def run(args) -> int:
    """Record (outputs written before records existed, known to be intact) or verify ``args.paths``;
    returns the exit status (1 when a check fails, 2 when a path does not exist)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    status = 0
    for p in args.paths:
        if not os.path.exists(p):  # a dangling link too
            log.error("%s: no such file or directory (nothing to %s)", p, args.action)
            status = 2
            continue
        try:
            if args.action == "record":
                rec = write_record(p, producer=args.producer)
                log.info("%s: recorded in %s (%s, %d bytes)", p, record_path(p), rec.kind, rec.size)
            elif verify(p) is None:
                log.info("%s: no record, none expected", p)
            else:
                log.info("%s: matches %s", p, record_path(p))
        except (IntegrityError, OSError) as exc:
            log.error("%s", exc)
            status = max(status, 1)
    return status


def main(argv: list[str] | None = None) -> int:
    """``python -m spader.infra.integrity record|verify PATH... [--producer RULE]`` (``spader integrity``)."""
    from spader.config.command import run_command

    return run_command("python -m spader.infra.integrity", add_arguments, run, argv, description=HELP)


if __name__ == "__main__":
    raise SystemExit(main())
