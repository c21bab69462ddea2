"""The content of local sources, as the param of their downloads.

A download's outputs are fixed by its source. For an http(s) URL or a hub revision the config
says which bytes those are; a local file (a ``file:`` URL or a path, such as the ``WebQSP.zip`` a
user downloads by hand and the demo's bundled releases, or a hub layout in a local directory) can
change in place under the same name. So the workflow gives the download of a local source the
sha256 of the file's content as a param (:func:`source_sha256`): a source edited or replaced in
place reruns its download and everything built from it, and the download checks its copy against
that digest (a file changed again between planning and copying fails the copy instead of
slipping through). The download notes the digest in its copy's integrity record
(:func:`record_source_digest`, ``extra.source_sha256``); a copy made before downloads did, whose
content is still the source's, plans without it (:func:`planned_sha256`), as it was built, so
that this scheme's first start reruns nothing that did not change.

Hashing runs when the workflow builds its DAG, so each digest is kept in the user's cache
directory (:func:`digest_cache_dir`, as the code fingerprints' facts are) keyed on the file's
path, device, inode, size, modification and status-change times: a start reads a few bytes per
source unless the file changed, and a changed file (or a copy elsewhere) is read once more. The
status-change time cannot be set by hand, so an edit that restores the size and modification time
is still read again. Reading costs about 3 s per GiB (measured on a 2-core machine; the 6.4 GB dump
about 18 s), once per change; a cached digest about 0.3 ms.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spader.infra import integrity
from spader.infra.atomic import atomic_write
from spader.infra.download import DownloadError, resolve_source
from spader.infra.integrity import sha256_file

__all__ = [
    "changed_since_copy",
    "content_sha256",
    "digest_cache_dir",
    "local_source",
    "planned_sha256",
    "record_source_digest",
    "source_sha256",
]

#: Bump when what a cached digest means changes.
_VERSION = 1


def digest_cache_dir() -> Path:
    """Where digests of local sources are kept between workflow starts (the user's cache
    directory)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spader" / f"source-digests-v{_VERSION}"


def local_source(source: str | Mapping[str, Any] | None, base: str | os.PathLike) -> Path | None:
    """The local file a source names, relative paths against ``base`` (the repository), or None
    for a remote one.

    ``source`` is a URL or path (``corpus.url``) or a release file's entry ``{url, hub}``
    (``datasets.<d>.files.<f>``), whose hub location is local when it has a ``local_dir``.

    >>> local_source("file:resources/demo/x.zip", "/repo"), local_source("https://e.org/x", "/repo")
    (PosixPath('/repo/resources/demo/x.zip'), None)
    >>> local_source({"url": None, "hub": {"local_dir": "/m", "filename": "t.jsonl"}}, "/repo")
    PosixPath('/m/t.jsonl')
    """
    if isinstance(source, Mapping):
        hub = source.get("hub")
        if hub:
            return Path(base) / hub["local_dir"] / hub["filename"] if hub.get("local_dir") else None
        source = source.get("url")
    if not source:
        return None
    try:
        where = resolve_source(str(source))
    except DownloadError:
        return None  # an unsupported URL: its download says so
    return Path(base) / where if isinstance(where, Path) else None


def content_sha256(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """The sha256 of a file's content, read once per change of the file (see the module).

    Raises:
        OSError: the file cannot be read.
    """
    path = Path(path).resolve()
    st = path.stat()
    key = hashlib.sha256(
        f"{path}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}".encode()
    ).hexdigest()
    cached = Path(cache_dir) / key if cache_dir is not None else None
    if cached is not None:
        try:
            digest = cached.read_text(encoding="ascii").strip()
            if len(digest) == 64:
                return digest
        except (OSError, UnicodeDecodeError):
            pass
    digest = sha256_file(path)
    if cached is not None:
        try:
            atomic_write(cached, digest + "\n")
        except OSError:  # an unwritable cache is only a slower start
            pass
    return digest


def source_sha256(
    source: str | Mapping[str, Any] | None,
    base: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
) -> str | None:
    """The sha256 of a local source's content; None for a remote source or a local file that is
    not there (its download then fails, naming it)."""
    path = local_source(source, base)
    if path is None or not path.is_file():
        return None
    return content_sha256(path, cache_dir)


def planned_sha256(digest: str | None, copy: str | os.PathLike) -> str | None:
    """The content digest a local source's download plans with: ``digest``, except for an
    existing ``copy`` made before downloads noted it (no ``extra.source_sha256`` in its integrity
    record) whose recorded content is the source's: None, the param it was built with.

    >>> planned_sha256("ab" * 32, "/nonexistent/copy.zip") == "ab" * 32
    True
    """
    if digest is None:
        return None
    rec = integrity.read_record(copy)
    if rec is not None and "source_sha256" not in (rec.extra or {}) and rec.sha256 == digest:
        return None
    return digest


def record_source_digest(copy: str | os.PathLike, digest: str | None) -> None:
    """Note in ``copy``'s integrity record (written first when the copy has none) the source
    content its download was planned with."""
    if digest is None:
        return
    if integrity.read_record(copy) is None:
        integrity.write_record(copy)
    integrity.annotate([copy], source_sha256=digest)


def changed_since_copy(
    source: str | Mapping[str, Any] | None,
    base: str | os.PathLike,
    copy: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
) -> bool:
    """Whether a local source's content differs from what its existing ``copy`` was made from
    (the digest its download noted, else the copy's own): a named run does not share such a copy
    with the default run (:mod:`spader.infra.named_runs`)."""
    digest = source_sha256(source, base, cache_dir)
    rec = integrity.read_record(copy) if digest is not None else None
    return rec is not None and (rec.extra or {}).get("source_sha256", rec.sha256) != digest
