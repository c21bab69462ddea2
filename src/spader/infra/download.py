"""Fetch release files (http(s), ``file:`` URLs, local paths).

:func:`fetch` never leaves a partial file at its destination: bytes go to ``<dest>.part``, an
interrupted transfer resumes from there only when the source is unchanged (HTTP ``Range`` with
``If-Range``, :mod:`spader.infra.transfer`), transient failures are retried with the project's
retry policy (:func:`spader.infra.retry.retrying`), and the file is renamed into place only after
its size and checksum match: the configured ones, else those recorded by the first complete
download. That record lives with every other integrity record of its tree
(``resources/.integrity/<path under resources>.json``, :mod:`spader.infra.integrity`) and names the
source as configured (the caller passes it as ``record_source`` when it anchored a relative path),
so no record holds an absolute path. The transfer's own state stays beside the file, as it is data
rather than a record: ``<dest>.part`` and its ``.part.meta`` while a transfer is unfinished, and
``<dest>.verified``, a second hard link of a verified download, so that a Snakemake rerun of a job
it marked incomplete reuses it. A download whose record was deleted while its ``.verified`` twin
remains is refused (nothing is left to check it against) unless the config gives its checksum.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from spader.infra import integrity, node, transfer
from spader.infra.retry import retrying

log = logging.getLogger(__name__)

__all__ = [
    "KEEP_SUFFIX",
    "DownloadError",
    "anchor_source",
    "fetch",
    "keep_path",
    "resolve_source",
    "sha256sum",
]

KEEP_SUFFIX = integrity.DOWNLOAD_TWIN_SUFFIX


class DownloadError(RuntimeError):
    """A download failed for good; the message names the source and the destination."""


def resolve_source(source: str) -> str | Path:
    """Classify ``source``: an http(s) URL is returned as is, anything else as a local :class:`Path`.

    ``file:///abs/path`` and ``file:relative/path`` URLs and plain paths are local; relative paths
    stay relative (to the current directory; see :func:`anchor_source`).
    """
    parsed = urlparse(source)
    if parsed.scheme in ("http", "https"):
        return source
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise DownloadError(
                f"file URL {source!r} names host {parsed.netloc!r}; only local files are supported"
            )
        return Path(unquote(parsed.path)).expanduser()
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter would be a Windows drive
        raise DownloadError(
            f"unsupported URL scheme {parsed.scheme!r} in {source!r} (http, https, file or a path)"
        )
    return Path(source).expanduser()


def anchor_source(source: str, base: str | os.PathLike) -> str:
    """``source`` with a relative local path made absolute against ``base``.

    Config files name bundled files relative to the repository (``file:resources/demo/x.zip``);
    jobs may run from any working directory, so the download scripts anchor such sources at the
    repository that holds the workflow. URLs and absolute paths are returned unchanged.

    Args:
        source: http(s) URL, ``file:`` URL or path.
        base: directory that relative paths are relative to.
    Returns:
        The source, as a plain absolute path when it was a relative local one.
    """
    resolved = resolve_source(source)
    if isinstance(resolved, Path) and not resolved.is_absolute():
        return str(Path(base) / resolved)
    return source


def sha256sum(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    return integrity.sha256_file(path)


def keep_path(dest: str | os.PathLike) -> Path:
    """``<dest>.verified``: a second hard link of a verified download (see :func:`fetch`)."""
    dest = Path(dest)
    return dest.with_name(dest.name + KEEP_SUFFIX)


def _record_for(dest: Path, source: str) -> integrity.Record | None:
    """The record of an earlier complete download of ``dest`` from ``source`` (None: none, or it
    came from another source, which the new one need not match)."""
    rec = integrity.read_record(dest)
    return rec if rec is not None and rec.extra.get("source") == source else None


def _mismatch(path: Path, sha256: str | None, size: int | None) -> tuple[str | None, str | None]:
    """``(what differs or None, the sha256 when it was computed)``."""
    actual = path.stat().st_size
    if size is not None and actual != size:
        return f"{actual} bytes, expected {size}", None
    if sha256 is None:
        return None, None
    digest = sha256sum(path)
    return (f"sha256 {digest}, expected {sha256}" if digest != sha256 else None), digest


def _keep(dest: Path) -> None:
    keep = keep_path(dest)
    keep.unlink(missing_ok=True)
    try:
        os.link(dest, keep)
    except OSError as exc:  # a file system without hard links: only the resume-from-part path remains
        log.info("cannot keep a hard link of %s (%s); an interrupted run will download it again", dest, exc)


def fetch(
    source: str,
    dest: str | os.PathLike,
    *,
    sha256: str | None = None,
    size: int | None = None,
    retries: int = 5,
    backoff: float = 2.0,
    timeout: float = 60.0,
    desc: str | None = None,
    sleep: Callable[[float], None] | None = None,
    record_source: str | None = None,
    measure: Callable[..., Any] | None = None,
) -> Path:
    """Download or copy ``source`` to ``dest`` atomically, resuming and retrying as needed, once the
    disk has room for what is left (:func:`_check_room`; a PreflightError names what is short).

    Expected size and sha256 come from the arguments (config) or, when those are None, from the
    record of the first complete download of ``dest`` from the same source
    (:func:`spader.infra.integrity.record_path`): later runs verify against it, and a new transfer
    that differs from it is refused. A verified file also gets a second hard link,
    ``<dest>.verified``: when Snakemake deletes ``dest`` before rerunning a job it marked
    incomplete (an interrupted ``snakemake``), the next call verifies that copy and links it back
    instead of transferring the file again.

    Args:
        source: http(s) URL, ``file:`` URL (``file:///abs/path`` or ``file:relative/path``) or path.
        dest: final path; the transfer writes ``<dest>.part`` and renames it when complete.
        sha256: expected hex digest, checked before the rename (mismatch: the part file is
            deleted and :class:`DownloadError` raised).
        size: expected size in bytes, checked the same way.
        retries: further attempts after a transient failure (connection error, timeout, 5xx,
            429, a body shorter than declared or expected); each resumes from the bytes on disk.
        backoff: the n-th retry waits ``backoff * 2 ** (n - 1)`` seconds (at most 30 s).
        timeout: seconds without progress (connect or read) before an attempt fails.
        desc: progress-bar label (default: the file name).
        sleep: replaces ``time.sleep`` between attempts (tests).
        record_source: the source as the record names it (default ``source``): the configured
            value, before a relative path was made absolute, so that records stay relocatable.
        measure: how the node is measured (:func:`spader.infra.node.measure_node`; tests).

    Returns:
        ``dest`` as a :class:`Path`.
    """
    dest = Path(dest)
    named = record_source or source
    _forget_another_source(dest, named)
    rec = _record_for(dest, named)
    want = _expected(dest, rec, sha256, size)
    if _present_and_verified(source, dest, named, rec, want) or _relinked(dest, want):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    _check_room(source, dest, part, want.size, measure)
    meta = _transfer(
        source, part, desc or dest.name, want, retries=retries, backoff=backoff, timeout=timeout, sleep=sleep
    )
    digest = _verified_part(source, dest, part, rec, want)
    _install(source, dest, part, meta, digest, named)
    return dest


def _check_room(
    source: str, dest: Path, part: Path, size: int | None, measure: Callable[..., Any] | None
) -> None:
    """Free disk at ``dest`` against what is left to transfer: ``size`` (configured or recorded,
    else a local source's) less the part already there; a debug line when the size is not known.

    Raises:
        spader.infra.node.PreflightError: less free disk than the transfer needs (one line).
    """
    if size is None:
        local = resolve_source(source)
        size = local.stat().st_size if isinstance(local, Path) and local.is_file() else None
    unknown = () if size is not None else (f"the size of {source} (none configured or recorded)",)
    have = part.stat().st_size if part.is_file() else 0
    needs = node.Needs(
        f"download {dest.name}",
        disk_gib=None if size is None else max(0, size - have) / node.GIB,
        disk_what="what is left to transfer",
        unknown=unknown,
    )
    node.check_here(needs, dest.parent, measure=measure, logger=log)


def _expected(dest: Path, rec: integrity.Record | None, sha256: str | None, size: int | None) -> _Expected:
    """What ``dest`` must be: the configured sha256 and size, else those of its earlier record (a
    configured sha256 names other content than the record's: its size does not hold then)."""
    return _Expected(
        sha256=sha256.lower() if sha256 else (rec.sha256 if rec else None),
        size=size if size is not None else (rec.size if rec and not sha256 else None),
        origin="configured" if sha256 or size is not None else f"recorded in {integrity.record_path(dest)}",
        configured=bool(sha256) or size is not None,
    )


def _install(source: str, dest: Path, part: Path, meta: transfer.PartMeta, digest: str, named: str) -> None:
    """Rename the verified ``part`` to ``dest``, record where it came from and keep a second link."""
    integrity.forget(dest)
    os.replace(part, dest)
    transfer.meta_path(part).unlink(missing_ok=True)
    integrity.write_record(
        dest,
        sha256=digest,
        extra={"source": named, "etag": meta.etag, "last_modified": meta.last_modified},
    )
    _keep(dest)
    log.info("%s -> %s (%d bytes, sha256 %s)", source, dest, dest.stat().st_size, digest)


@dataclass(frozen=True)
class _Expected:
    """What a download must be: sha256 and size (configured, or recorded at its first download)."""

    sha256: str | None
    size: int | None
    origin: str  # where the expectation comes from, for messages
    configured: bool  # True: from the config; False: from the record (or nothing)


def _forget_another_source(dest: Path, named: str) -> None:
    """What is at ``dest`` came from another source: it is not the file asked for; drop it."""
    earlier = integrity.read_record(dest)
    if earlier is not None and earlier.extra.get("source") not in (None, named):
        log.info("%s was downloaded from %s, not %s; fetching again", dest, earlier.extra["source"], named)
        for stale in (dest, keep_path(dest), integrity.record_path(dest)):
            stale.unlink(missing_ok=True)


def _present_and_verified(source, dest: Path, named: str, rec, want: _Expected) -> bool:
    """True when ``dest`` is there and verifies (recording it on first sight); a file that does not
    verify is deleted (and downloaded again); a file whose record is gone is refused."""
    if (
        dest.exists()
        and rec is None
        and want.sha256 is None
        and want.size is None
        and keep_path(dest).exists()
    ):
        raise DownloadError(
            f"{source}: {dest} was downloaded earlier (its verified copy {keep_path(dest)} exists) but its "
            f"integrity record {integrity.record_path(dest)} is gone, so it cannot be checked; delete "
            f"{dest} and {keep_path(dest)} to download it again"
        )
    if not dest.exists():
        return False
    problem, digest = _mismatch(dest, want.sha256, want.size)
    if problem is not None:
        log.warning("existing %s does not verify (%s, %s); downloading again", dest, problem, want.origin)
        dest.unlink()
        return False
    if rec is None or not keep_path(dest).exists():
        # first sight of a file placed by hand or by an older version: record it as it is
        integrity.write_record(dest, sha256=digest or sha256sum(dest), extra={"source": named})
        _keep(dest)
    how = "verified" if want.sha256 else "nothing to verify it against; recorded"
    log.info("%s already present (%d bytes, %s); not downloading again", dest, dest.stat().st_size, how)
    return True


def _relinked(dest: Path, want: _Expected) -> bool:
    """True when the verified hard link of an earlier download still verifies and is linked back."""
    keep = keep_path(dest)
    if not keep.exists():
        return False
    if want.sha256 is not None and _mismatch(keep, want.sha256, want.size)[0] is None:
        os.link(keep, dest)
        log.info("%s: reusing the verified download %s (%d bytes)", dest, keep, dest.stat().st_size)
        return True
    keep.unlink()
    return False


def _transfer(source, part: Path, label: str, want: _Expected, *, retries, backoff, timeout, sleep):
    """Copy or download ``source`` into ``part``, resuming and retrying transient failures."""
    where = resolve_source(source)
    try:
        for attempt in retrying(
            retries=retries,
            backoff=backoff,
            on=(transfer.Transient,),
            what=f"download of {source}",
            sleep=sleep,
        ):
            with attempt:
                if isinstance(where, Path):
                    return transfer.copy_local(where, part, label, checked=want.sha256 is not None)
                return transfer.http_get(
                    where, part, label, timeout=timeout, expected=want.size, checked=want.sha256 is not None
                )
    except transfer.Transient as exc:
        kept = part.stat().st_size if part.exists() else 0
        raise DownloadError(
            f"{source}: giving up after {retries + 1} attempts ({exc}); {kept} bytes kept in {part} for a later resume"
        ) from exc
    except transfer.Fatal as exc:
        raise DownloadError(str(exc)) from exc
    raise AssertionError("unreachable: retrying() either returns a result or raises")


def _verified_part(source, dest: Path, part: Path, rec, want: _Expected) -> str:
    """The sha256 of the complete ``part``; one that differs from what is expected is deleted."""
    digest = sha256sum(part)
    problem = key = None
    if want.size is not None and part.stat().st_size != want.size:
        problem, key = (
            f"downloaded {part.stat().st_size} bytes into {dest}, expected {want.size}",
            "size_bytes",
        )
    elif want.sha256 is not None and digest != want.sha256:
        problem, key = f"sha256 of {dest} is {digest}, expected {want.sha256}", "sha256"
    if problem is None:
        return digest
    transfer.remove_part(part)
    if rec is not None and not want.configured:
        raise DownloadError(
            f"{source}: {problem} ({want.origin}): the remote file changed since its first download, or "
            f"the transfer was corrupted; if the change is expected, delete {integrity.record_path(dest)} "
            "and run again"
        )
    raise DownloadError(f"{source}: {problem} ({key})")
