"""Byte-for-byte reproducible archives: fixed timestamps, owners and modes, sorted members,
gzip header without name or time. Regenerating the demo files gives identical bytes (with the
same zlib), so the committed copies can be checked against a fresh run."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["write_tar_gz", "write_zip"]

# 2021-01-01, the snapshot year of QAMPARI's Wikipedia dump.
_EPOCH = 1609459200
_ZIP_TIME = (2021, 1, 1, 0, 0, 0)


def write_zip(path: str | os.PathLike, members: Mapping[str, bytes]) -> Path:
    """A deflated zip of ``members`` (name -> bytes), in sorted order."""
    path = Path(path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, whatever the machine
            info.external_attr = 0o100644 << 16
            zf.writestr(info, members[name], compresslevel=9)
    path.write_bytes(buf.getvalue())
    return path


def write_tar_gz(path: str | os.PathLike, members: Mapping[str, bytes]) -> Path:
    """A gzipped ustar archive of ``members`` (name -> bytes) with their parent directories."""
    path = Path(path)
    dirs = sorted({str(Path(n).parents[i]) for n in members for i in range(len(Path(n).parents) - 1)})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted([d + "/" for d in dirs] + list(members)):
            info = tarfile.TarInfo(name.rstrip("/"))
            info.mtime, info.uid, info.gid, info.uname, info.gname = _EPOCH, 0, 0, "", ""
            if name.endswith("/"):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.mode, info.size = 0o644, len(members[name])
                tar.addfile(info, io.BytesIO(members[name]))
    path.write_bytes(gzip.compress(buf.getvalue(), compresslevel=9, mtime=0))
    return path
