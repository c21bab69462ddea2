"""Writing a file atomically, and leaving nothing behind when the write fails.

Every output the pipeline writes in one go goes through :func:`atomic_path` (or :func:`atomic_write`
for bytes and text already in memory): the content is written to a temporary file beside the
target, renamed over it once complete, and the temporary file is removed whatever stops the write
half way (a full disk, a size limit, an exception, a stop signal). A reader therefore sees the
old file or the new one, never a part of one, and no ``.tmp`` file is left among the outputs or
the integrity records. The temporary name is unique per writer (process id and a random part), so
writers on several nodes may write one directory at once.

An output that cannot be written is named in the error, never the temporary file: a directory
that is not writable, a parent that is a file, a target that is a directory, a read-only or full
file system (:func:`atomic_path` tries the temporary file before the block runs, and renames the
error of a write to it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write"]


def _temporary(target: Path) -> Path:
    return target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


#: Errors of a write that carry no file name (the file written is the temporary one).
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}


def _write_error(exc: OSError, target: Path, tmp: Path) -> OSError:
    """``exc`` (of its type and errno) as the failure to write ``target``: the temporary file is
    an implementation detail, and a message naming it sends the reader to a file that is gone."""
    names = {str(n) for n in (exc.filename, exc.filename2) if n is not None} - {str(tmp), str(target)}
    detail = f" ({', '.join(sorted(names))})" if names else ""
    error = type(exc)(f"cannot write {target}: {exc.strerror or exc}{detail}")
    error.errno = exc.errno
    return error


def _about_the_write(exc: OSError, tmp: Path) -> bool:
    """Whether ``exc`` is a failure to write the temporary file (not, say, an input the block read)."""
    if tmp.name in {os.path.basename(str(n)) for n in (exc.filename, exc.filename2) if n is not None}:
        return True
    return exc.filename is None and exc.errno in _WRITE_ERRNOS


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to; renamed over ``path`` when the block
    ends normally, removed when it raises (anything, ``KeyboardInterrupt`` and stop signals
    included). The parent directory is created, and the temporary file tried, first.

    Yields:
        The temporary path (beside ``path``: same file system, so the rename is atomic).
    Raises:
        OSError (of the failure's type): ``path`` cannot be written, naming it.
    """
    target = Path(path)
    tmp = _temporary(target)
    try:
        blocked = next((d for d in target.parents if d.exists() and not d.is_dir()), None)
        if blocked is not None:
            raise NotADirectoryError(errno.ENOTDIR, f"{blocked} is a file, not a directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, "it is a directory", str(target))
        tmp.touch(exist_ok=False)
    except OSError as exc:
        raise _write_error(exc, target, tmp) from None
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and _about_the_write(exc, tmp):
            raise _write_error(exc, target, tmp) from exc
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str, *, encoding: str = "utf-8") -> Path:
    """Write ``data`` (text is encoded with ``encoding``) to ``path`` atomically (:func:`atomic_path`).

    Returns:
        ``path``.
    """
    payload = data.encode(encoding) if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(payload)
    return Path(path)
