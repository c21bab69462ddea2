"""SLURM_CONF for the srun that runs each job inside its allocation, without SLURM: the environment
the workflow sets up inside a SLURM job and the profile's srun shim. The real plugin and srun:
tests/slurm/test_slurm_real.py::test_demo_dag_runs_through_the_slurm_profile."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from spader.infra.slurm_env import CONF_ENV, SRUN_ENV, keep_slurm_conf_for_srun

SHIM_DIR = Path(__file__).resolve().parents[2] / "profiles" / "slurm" / "bin"


def test_inside_a_slurm_job_the_shim_gives_srun_the_allocations_slurm_conf(tmp_path):
    real = tmp_path / "real" / "srun"  # stands in for SLURM's srun: prints what it was given
    real.parent.mkdir()
    real.write_text('#!/bin/sh\necho "SLURM_CONF=${SLURM_CONF:-unset} args=$*"\n')
    real.chmod(0o755)
    env = {"PATH": f"{real.parent}{os.pathsep}/usr/bin{os.pathsep}/bin", "SLURM_JOB_ID": "7",
           "SLURM_CONF": "/opt/slurm/etc/slurm.conf"}  # fmt: skip
    assert keep_slurm_conf_for_srun(SHIM_DIR, env)
    assert env["PATH"].split(os.pathsep)[0] == str(SHIM_DIR) and env[SRUN_ENV] == str(real)
    assert env[CONF_ENV] == "/opt/slurm/etc/slurm.conf"
    assert keep_slurm_conf_for_srun(SHIM_DIR, env) and env["PATH"].count(str(SHIM_DIR)) == 1  # once
    # what the jobstep plugin hands its srun: every SLURM_* variable removed
    stripped = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    out = subprocess.run(["srun", "-n1", "true"], env=stripped, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "SLURM_CONF=/opt/slurm/etc/slurm.conf args=-n1 true"
    out = subprocess.run(["srun"], env={**stripped, "SLURM_CONF": "/x"}, capture_output=True, text=True)
    assert out.stdout.strip() == "SLURM_CONF=/x args="  # one that has it keeps its own
    # outside a SLURM job, or without SLURM_CONF, nothing changes
    for outside in ({"PATH": "/bin"}, {"PATH": "/bin", "SLURM_JOB_ID": "7"}):
        before = dict(outside)
        assert not keep_slurm_conf_for_srun(SHIM_DIR, outside) and outside == before
