"""Writing a file atomically, and leaving nothing behind when the write fails.

Every output the pipeline writes in one go goes through :func:`atomic_path` (or :func:`atomic_write`
for bytes and text already in memory): the content is written to a temporary file beside the
target, renamed over it once complete, and the temporary file is removed whatever stops the write
half way (a full disk, a size limit, an exception, a stop signal). A reader therefore sees the
old file or the new one, never a part of one, and no ``.tmp`` file is left among the outputs or
the integrity records. The temporary name is unique per writer (process id and a random part), so
writers on several nodes may write one directory at once.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write"]


def _temporary(target: Path) -> Path:
    return target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to; renamed over ``path`` when the block
    ends normally, removed when it raises (anything, ``KeyboardInterrupt`` and stop signals
    included). The parent directory is created.

    Yields:
        The temporary path (beside ``path``: same file system, so the rename is atomic).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(target)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
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
