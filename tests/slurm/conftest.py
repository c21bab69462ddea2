"""Fixtures of the SLURM tests: the sbatch line the pinned plugin builds, and a running cluster."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))

from slurm_node import slurm_problem  # noqa: E402


class _Resources(dict):
    """Job resources as the plugin reads them (``.get`` and attribute access)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


@pytest.fixture(scope="session")
def sbatch_line():
    """``f(resources, threads=1) -> str``: the sbatch command plugin 2.6.1 submits for a job."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    def build(resources: dict, threads: int = 1) -> str:
        job = SimpleNamespace(resources=_Resources(resources), threads=threads)
        params = {
            "run_uuid": "uuid",
            "slurm_logfile": "/tmp/%j.log",
            "comment_str": "rule",
            "account": "",
            "partition": "",
            "workdir": "/tmp",
        }
        return get_submit_command(job, params) + set_gres_string(job)

    return build


@pytest.fixture(scope="session")
def slurm_cluster():
    """Skip unless a SLURM cluster answers here (.ci/slurm-up.sh starts a single-node one)."""
    problem = slurm_problem()
    if problem:
        pytest.skip(f"SLURM is not available ({problem}); start it with .ci/slurm-up.sh")
