"""The SLURM configuration for the ``srun`` that runs each job inside its allocation.

Snakemake's SLURM executor submits ``snakemake`` itself as the batch job; that process (the
``slurm-jobstep`` executor, plugin 0.6.1) runs the job with ``srun``, after removing from that
``srun``'s environment every ``SLURM_*`` variable but the job's identity, ``SLURM_CONF`` among them.
``srun`` then reads SLURM's built-in path (``/etc/slurm/slurm.conf`` on Debian's packages): on a
cluster whose configuration lies elsewhere, named by ``SLURM_CONF`` (which ``slurmd`` sets in every
job's environment to the file it was started with), the job fails before it starts.

:func:`keep_slurm_conf_for_srun`, called by the workflow in every process that runs inside a SLURM
job, keeps the value where the plugin leaves it (``SPADER_SLURM_CONF``) and puts the profile's
``bin/`` first on ``PATH``: its ``srun`` (a three-line shell script) sets ``SLURM_CONF`` back when it
is missing and runs the real ``srun`` (``SPADER_SRUN``). Nothing of the plugin is changed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["CONF_ENV", "SRUN_ENV", "keep_slurm_conf_for_srun"]

#: Where the allocation's ``SLURM_CONF`` is kept for the shim (the plugin removes ``SLURM_*`` only).
CONF_ENV = "SPADER_SLURM_CONF"
#: The real ``srun`` the shim runs.
SRUN_ENV = "SPADER_SRUN"


def keep_slurm_conf_for_srun(
    shim_dir: str | os.PathLike, environ: MutableMapping[str, str] | None = None
) -> bool:
    """Inside a SLURM job with ``SLURM_CONF`` set: keep it as :data:`CONF_ENV`, the real ``srun`` as
    :data:`SRUN_ENV`, and put ``shim_dir`` (holding the ``srun`` shim) first on ``PATH``.

    Args:
        shim_dir: the directory of the shim (``profiles/slurm/bin``).
        environ: the environment to change (default ``os.environ``).
    Returns:
        Whether the environment is set up (False outside a SLURM job, without ``SLURM_CONF`` or
        without an ``srun`` on ``PATH``).
    """
    environ = os.environ if environ is None else environ
    conf = environ.get("SLURM_CONF")
    if not environ.get("SLURM_JOB_ID") or not conf:
        return False
    shim_dir = str(Path(shim_dir).resolve())
    path = [p for p in environ.get("PATH", "").split(os.pathsep) if p and p != shim_dir]
    real = environ.get(SRUN_ENV) or shutil.which("srun", path=os.pathsep.join(path))
    if real is None:
        return False
    environ[CONF_ENV] = conf
    environ[SRUN_ENV] = real
    environ["PATH"] = os.pathsep.join([shim_dir, *path])
    return True
