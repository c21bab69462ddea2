"""Fetch release files (http(s), ``file:`` URLs, local paths) and unpack archives safely.

:func:`fetch` never leaves a partial file at its destination: bytes go to ``<dest>.part``, an
interrupted transfer resumes from there (HTTP ``Range``), failures are retried with exponential
backoff, and the file is renamed into place only after its size and checksum (when given) match.
:func:`safe_extract_tar` / :func:`safe_extract_zip` refuse members with absolute paths, ``..``
components, or links that point outside the target directory, before writing anything.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tarfile
import time
import zipfile
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

from tqdm import tqdm

log = logging.getLogger(__name__)

__all__ = [
    "DownloadError",
    "UnsafeArchiveError",
    "fetch",
    "read_zip_member",
    "resolve_source",
    "safe_extract_tar",
    "safe_extract_zip",
    "sha256sum",
]

_CHUNK = 1 << 20
# Status codes worth another try; any other 4xx is final (a wrong URL does not heal by waiting).
_TRANSIENT_STATUS = {408, 425, 429, 500, 502, 503, 504}


class DownloadError(RuntimeError):
    """A download failed for good; the message names the source and the destination."""


class UnsafeArchiveError(ValueError):
    """An archive member would be written outside the target directory."""


class _Transient(Exception):
    """An error after which the transfer is retried (resuming from the partial file)."""


def resolve_source(source: str) -> str | Path:
    """Classify ``source``: an http(s) URL is returned as is, anything else as a local :class:`Path`.

    ``file:///abs/path`` and ``file:relative/path`` URLs and plain paths are local; relative paths
    resolve against the current directory (Snakemake runs jobs from the repository root).
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


def sha256sum(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _verify(path: Path, source: str, sha256: str | None, size: int | None) -> None:
    actual = path.stat().st_size
    if size is not None and actual != size:
        raise DownloadError(f"{source}: downloaded {actual} bytes into {path}, expected {size} (size_bytes)")
    if sha256 is not None:
        digest = sha256sum(path)
        if digest != sha256.lower():
            raise DownloadError(f"{source}: sha256 of {path} is {digest}, expected {sha256.lower()}")


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
) -> Path:
    """Download or copy ``source`` to ``dest`` atomically, resuming and retrying as needed.

    Args:
        source: http(s) URL, ``file:`` URL (``file:///abs/path`` or ``file:relative/path``) or path.
        dest: final path; the transfer writes ``<dest>.part`` and renames it when complete.
        sha256: expected hex digest, checked before the rename (mismatch: the part file is
            deleted and :class:`DownloadError` raised).
        size: expected size in bytes, checked the same way.
        retries: further attempts after a transient failure (connection error, timeout, 5xx,
            429, truncated body); each resumes from the bytes already on disk.
        backoff: the n-th retry waits ``backoff * 2 ** (n - 1)`` seconds.
        timeout: seconds without progress (connect or read) before an attempt fails.
        desc: progress-bar label (default: the file name).

    Returns:
        ``dest`` as a :class:`Path`.
    """
    dest = Path(dest)
    if dest.exists():
        try:
            _verify(dest, source, sha256, size)
            log.info("%s already present (%d bytes); not downloading again", dest, dest.stat().st_size)
            return dest
        except DownloadError as exc:
            log.warning("existing %s does not verify (%s); downloading again", dest, exc)
            dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    origin = resolve_source(source)
    label = desc or dest.name
    attempt = 0
    while True:
        try:
            if isinstance(origin, Path):
                _copy_local(origin, part, label)
            else:
                _http_get(origin, part, label, timeout)
            break
        except _Transient as exc:
            if attempt >= retries:
                raise DownloadError(
                    f"{source}: giving up after {attempt + 1} attempts ({exc}); "
                    f"{part.stat().st_size if part.exists() else 0} bytes kept in {part} for a later resume"
                ) from exc
            wait = backoff * 2**attempt
            attempt += 1
            log.warning("%s: %s; retry %d/%d in %.1f s (resuming)", source, exc, attempt, retries, wait)
            time.sleep(wait)
    try:
        _verify(part, source, sha256, size)
    except DownloadError:
        part.unlink()
        raise
    os.replace(part, dest)
    log.info("%s -> %s (%d bytes)", source, dest, dest.stat().st_size)
    return dest


def _copy_local(origin: Path, part: Path, label: str) -> None:
    if not origin.is_file():
        raise DownloadError(
            f"source file {origin} does not exist (resolved from the current directory {Path.cwd()})"
        )
    total = origin.stat().st_size
    offset = part.stat().st_size if part.exists() else 0
    if offset > total:
        part.unlink()
        offset = 0
    try:
        with open(origin, "rb") as src, open(part, "ab") as out, _bar(label, total, offset) as bar:
            src.seek(offset)
            for block in iter(lambda: src.read(_CHUNK), b""):
                out.write(block)
                bar.update(len(block))
    except OSError as exc:
        raise _Transient(f"copy of {origin} interrupted: {exc}") from exc


def _http_get(url: str, part: Path, label: str, timeout: float) -> None:
    import httpx

    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        with httpx.stream("GET", url, headers=headers, timeout=timeout, follow_redirects=True) as resp:
            if resp.status_code == 416 and offset:
                # Nothing left past our offset: the part file is complete if the server agrees on the size.
                total = _content_range_total(resp.headers.get("content-range"))
                if total == offset:
                    return
                part.unlink()
                raise _Transient(f"server rejected resume at byte {offset} (size {total}); restarting")
            if resp.status_code in _TRANSIENT_STATUS:
                raise _Transient(f"HTTP {resp.status_code}")
            if resp.status_code >= 400:
                raise DownloadError(f"{url}: HTTP {resp.status_code} {resp.reason_phrase}")
            if resp.status_code == 206:
                start = _content_range_start(resp.headers.get("content-range"))
                if start != offset:
                    part.unlink()
                    raise _Transient(f"server resumed at byte {start}, not {offset}; restarting")
                mode = "ab"
            else:  # 200: the server ignored the Range header, so start over
                offset, mode = 0, "wb"
            length = resp.headers.get("content-length")
            total = offset + int(length) if length is not None else None
            with open(part, mode) as out, _bar(label, total, offset) as bar:
                for block in resp.iter_bytes():  # unbuffered: whatever arrived is on disk if the line drops
                    out.write(block)
                    bar.update(len(block))
            if total is not None and part.stat().st_size < total:
                raise _Transient(f"connection closed at byte {part.stat().st_size} of {total}")
    except (httpx.TransportError, httpx.StreamError) as exc:
        raise _Transient(f"{type(exc).__name__}: {exc}") from exc


def _content_range_start(value: str | None) -> int | None:
    # "bytes 100-199/200"
    if not value or not value.startswith("bytes ") or "-" not in value:
        return None
    return int(value[6:].split("-", 1)[0])


def _content_range_total(value: str | None) -> int | None:
    # "bytes */200" or "bytes 0-99/200"
    if not value or "/" not in value:
        return None
    tail = value.rsplit("/", 1)[1]
    return int(tail) if tail.isdigit() else None


def _bar(label: str, total: int | None, initial: int) -> tqdm:
    return tqdm(
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=label,
        mininterval=2.0,
    )


# ---------------------------------------------------------------------------------------------
# Archives
# ---------------------------------------------------------------------------------------------
def _check_name(name: str, archive: Path) -> PurePosixPath:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or (path.parts and ":" in path.parts[0]):
        raise UnsafeArchiveError(f"{archive}: member {name!r} has an absolute path; refusing to extract")
    if ".." in path.parts:
        raise UnsafeArchiveError(f"{archive}: member {name!r} contains '..'; refusing to extract")
    return path


def _inside(target: Path, candidate: Path) -> bool:
    return os.path.commonpath([target, candidate]) == str(target)


def safe_extract_tar(archive: str | os.PathLike, target_dir: str | os.PathLike) -> list[Path]:
    """Extract a (compressed) tar archive after checking every member.

    Refused (:class:`UnsafeArchiveError`, nothing written): absolute member paths, ``..``
    components, symbolic or hard links whose target leaves ``target_dir``, device files and FIFOs.

    Returns:
        The extracted regular files, in archive order.
    """
    archive = Path(archive)
    target = Path(target_dir).resolve()
    with tarfile.open(archive) as tf:
        members = tf.getmembers()
        for m in members:
            rel = _check_name(m.name, archive)
            if m.ischr() or m.isblk() or m.isfifo():
                raise UnsafeArchiveError(
                    f"{archive}: member {m.name!r} is a device or FIFO; refusing to extract"
                )
            if m.issym() or m.islnk():
                link = PurePosixPath(m.linkname)
                if link.is_absolute():
                    raise UnsafeArchiveError(
                        f"{archive}: link {m.name!r} -> {m.linkname!r} is absolute; refusing"
                    )
                base = (target / rel).parent if m.issym() else target
                dest = Path(os.path.normpath(base / link))
                if not _inside(target, dest):
                    raise UnsafeArchiveError(
                        f"{archive}: link {m.name!r} -> {m.linkname!r} points outside {target}; "
                        "refusing to extract"
                    )
        target.mkdir(parents=True, exist_ok=True)
        # The stdlib "data" filter repeats these checks (and drops permissions bits we never need).
        tf.extractall(target, members=members, filter="data")
    return [target / m.name for m in members if m.isfile()]


def safe_extract_zip(archive: str | os.PathLike, target_dir: str | os.PathLike) -> list[Path]:
    """Extract a zip archive after checking every member (absolute paths, ``..``, symlinks refused).

    Returns:
        The extracted regular files, in archive order.
    """
    archive = Path(archive)
    target = Path(target_dir).resolve()
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:
            _check_name(info.filename, archive)
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                raise UnsafeArchiveError(
                    f"{archive}: member {info.filename!r} is a symbolic link; refusing to extract"
                )
        target.mkdir(parents=True, exist_ok=True)
        out = []
        for info in infos:
            path = target / info.filename
            if info.is_dir():
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
            out.append(path)
    return out


def read_zip_member(archive: str | os.PathLike, member: str) -> bytes:
    """The bytes of one zip member; a missing member raises ``KeyError`` listing what is there."""
    with zipfile.ZipFile(archive) as zf:
        try:
            return zf.read(member)
        except KeyError:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
            raise KeyError(f"{archive} has no member {member!r}; members: {shown}") from None
