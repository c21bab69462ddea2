"""One attempt at moving a file's bytes into ``<dest>.part``: an HTTP GET or a local copy, resuming
where an earlier attempt stopped, and only when the source is provably the same.

The first response of a partial download leaves its validator in ``<dest>.part.meta``: the
strong ETag, else Last-Modified, and the size the server announced (for a local source: its size
and modification time). A resume sends that validator as ``If-Range``: a server whose file has
changed answers with the whole new file (200) and the transfer starts from zero instead of
splicing two files; a 206 whose range or size disagrees with the partial's also restarts. A part
without a validator is resumed only when a checksum will verify the result (``checked``).

A body shorter than what the server declared (Content-Length, Content-Range) or than the size
the caller expects raises :class:`Transient`, after which the caller may resume; one longer than
that restarts. Bodies are read raw (``Accept-Encoding: identity``), so ranges count stored bytes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from spader.infra.atomic import atomic_write

log = logging.getLogger(__name__)

__all__ = [
    "META_SUFFIX",
    "Fatal",
    "PartMeta",
    "Transient",
    "copy_local",
    "http_get",
    "meta_path",
    "read_meta",
    "remove_part",
]

META_SUFFIX = ".meta"
_CHUNK = 1 << 20
# Status codes worth another try; any other 4xx is final (a wrong URL does not heal by waiting).
_TRANSIENT_STATUS = {408, 425, 429, 500, 502, 503, 504}


class Transient(Exception):
    """An attempt failed in a way another attempt may fix (resuming from the part file)."""


class Fatal(Exception):
    """The source cannot be transferred (HTTP 404, a missing local file)."""


@dataclass
class PartMeta:
    """What the bytes in a part file were transferred from."""

    source: str
    etag: str | None = None
    last_modified: str | None = None
    total: int | None = None
    mtime_ns: int | None = None  # local sources

    @classmethod
    def of_response(cls, url: str, headers, total: int | None) -> PartMeta:
        """The meta of a transfer from ``url`` whose response carried ``headers``."""
        return cls(
            source=url, etag=headers.get("etag"), last_modified=headers.get("last-modified"), total=total
        )

    def validator(self) -> str | None:
        """The If-Range value: a strong ETag, else Last-Modified (weak ETags may not be used)."""
        if self.etag and not self.etag.startswith("W/"):
            return self.etag
        return self.last_modified


def meta_path(part: Path) -> Path:
    return part.with_name(part.name + META_SUFFIX)


def read_meta(part: Path) -> PartMeta | None:
    """The meta of ``part`` (None when missing or unreadable: the part cannot be trusted then)."""
    try:
        return PartMeta(**json.loads(meta_path(part).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write_meta(part: Path, meta: PartMeta) -> None:
    atomic_write(meta_path(part), json.dumps(asdict(meta)))


def _restart(part: Path) -> None:
    part.unlink(missing_ok=True)
    meta_path(part).unlink(missing_ok=True)


def _offset(part: Path, meta: PartMeta | None, source: str, checked: bool) -> int:
    """Bytes of ``part`` that may be resumed: those of a part whose source has a validator, or any
    part of this source when a checksum will verify the result; else 0 (the part is discarded)."""
    offset = part.stat().st_size if part.exists() else 0
    same = meta is None or meta.source == source
    if offset and not (same and ((meta is not None and meta.validator()) or checked)):
        log.warning("%s: discarding %d bytes that cannot be shown to come from %s", part, offset, source)
        _restart(part)
        return 0
    return offset


def copy_local(origin: Path, part: Path, label: str, *, checked: bool) -> PartMeta:
    """Copy ``origin`` into ``part``, resuming only if ``origin`` is unchanged since the part began.

    Returns:
        The meta of the complete part.
    """
    if not origin.is_file():
        raise Fatal(f"source file {origin} does not exist (resolved from the current directory {Path.cwd()})")
    st = origin.stat()
    now = PartMeta(
        source=str(origin), total=st.st_size, mtime_ns=st.st_mtime_ns, last_modified=str(st.st_mtime_ns)
    )
    old = read_meta(part)
    offset = _offset(part, old, str(origin), checked)
    if offset and old is not None and (old.total != now.total or old.mtime_ns != now.mtime_ns):
        log.warning("%s changed since the partial copy began; starting from zero", origin)
        _restart(part)
        offset = 0
    if offset > st.st_size:
        log.warning("%s changed since the partial copy began; starting from zero", origin)
        _restart(part)
        offset = 0
    _write_meta(part, now)
    try:
        with open(origin, "rb") as src, open(part, "ab") as out, _bar(label, st.st_size, offset) as bar:
            src.seek(offset)
            for block in iter(lambda: src.read(_CHUNK), b""):
                out.write(block)
                bar.update(len(block))
    except OSError as exc:
        raise Transient(f"copy of {origin} interrupted: {exc}") from exc
    return now


def http_get(
    url: str, part: Path, label: str, *, timeout: float, expected: int | None, checked: bool
) -> PartMeta:
    """GET ``url`` into ``part``, resuming with ``Range`` + ``If-Range`` when that is safe.

    Args:
        url: the source.
        part: the part file.
        label: progress-bar label.
        timeout: seconds without progress before the attempt fails.
        expected: size the caller expects (config or an earlier download), or None.
        checked: whether a checksum will verify the result (allows resuming without a validator).
    Returns:
        The meta of the complete part.
    Raises:
        Transient: retry (resuming); Fatal: a client error (4xx other than 408/425/429).
    """
    import httpx

    meta = read_meta(part)
    offset = _offset(part, meta, url, checked)
    try:
        with httpx.stream(
            "GET", url, headers=_request_headers(offset, meta), timeout=timeout, follow_redirects=True
        ) as resp:
            complete = _check_status(resp, url, part, offset, meta)
            if complete is not None:
                return complete
            meta, total, offset, mode = _accept_body(resp, url, part, offset, meta)
            total = total if total is not None else expected
            with open(part, mode) as out, _bar(label, total, offset) as bar:
                for block in resp.iter_raw():  # raw: no decoding, whatever arrived is on disk
                    out.write(block)
                    bar.update(len(block))
    except (httpx.TransportError, httpx.StreamError) as exc:
        raise Transient(f"{type(exc).__name__}: {exc}") from exc
    got = part.stat().st_size
    if total is not None and got < total:
        raise Transient(f"connection closed at byte {got} of {total}")
    if total is not None and got > total:
        _restart(part)
        raise Transient(f"received {got} bytes, more than the {total} announced or expected; restarting")
    return meta


def _request_headers(offset: int, meta: PartMeta | None) -> dict[str, str]:
    """The GET's headers: no content encoding, and ``Range`` (+ ``If-Range``) to resume at ``offset``."""
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if meta is not None and meta.validator():
            headers["If-Range"] = meta.validator()
    return headers


def _check_status(resp, url: str, part: Path, offset: int, meta: PartMeta | None) -> PartMeta | None:
    """The part's meta when a 416 shows the part complete, None for a body to read; raises
    Transient (retry) or Fatal (a client error) otherwise."""
    status = resp.status_code
    if status == 416 and offset:
        total = _range_total(resp.headers.get("content-range"))
        if total == offset and (meta is None or meta.total in (None, total)):
            return meta or PartMeta(source=url, total=total)  # nothing past our bytes: complete
        _restart(part)
        raise Transient(f"server refused a resume at byte {offset} (size {total}); restarting")
    if status in _TRANSIENT_STATUS:
        raise Transient(f"HTTP {status}")
    if status >= 400:
        raise Fatal(f"{url}: HTTP {status} {resp.reason_phrase}")
    return None


def _accept_body(
    resp, url: str, part: Path, offset: int, meta: PartMeta | None
) -> tuple[PartMeta | None, int | None, int, str]:
    """``(meta, total, offset, file mode)`` for the body of a 206 (resumed: checked to continue the
    part) or a 200 (a whole file: the part starts again); the meta is written where new."""
    length = resp.headers.get("content-length")
    if resp.status_code == 206:
        start, total = (
            _range_start(resp.headers.get("content-range")),
            _range_total(resp.headers.get("content-range")),
        )
        known = meta.total if meta is not None else None
        if start != offset or (known is not None and total is not None and total != known):
            _restart(part)
            raise Transient(f"server resumed at byte {start} of {total}, not {offset} of {known}")
        if meta is None:  # a part without meta, resumed because a checksum will verify it
            meta = PartMeta.of_response(url, resp.headers, total)
            _write_meta(part, meta)
        return meta, total, offset, "ab"
    # 200: a new file (If-Range did not match) or a server that ignores Range
    if offset:
        log.warning("%s: the server sent the whole file again (changed, or no Range support)", url)
    total = int(length) if length is not None else None
    meta = PartMeta.of_response(url, resp.headers, total)
    _write_meta(part, meta)
    return meta, total, 0, "wb"


def _range_start(value: str | None) -> int | None:
    # "bytes 100-199/200"
    if not value or not value.startswith("bytes ") or "-" not in value:
        return None
    head = value[6:].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _range_total(value: str | None) -> int | None:
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


def remove_part(part: Path) -> None:
    """Delete a part file and its meta."""
    _restart(part)
