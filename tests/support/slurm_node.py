"""Whether a SLURM cluster answers on this machine (.ci/slurm-up.sh starts a single-node one)."""

from __future__ import annotations

import shutil
import subprocess


def slurm_problem() -> str:
    """Why no SLURM job can run here, or ``""`` when a node is idle, mixed or allocated."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no SLURM client installed"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed: {exc}"
    states = out.stdout.split()
    if out.returncode != 0 or not {"idle", "mixed", "allocated"} & set(states):
        return f"no usable node (sinfo: {out.stdout.strip() or out.stderr.strip()})"
    return ""
