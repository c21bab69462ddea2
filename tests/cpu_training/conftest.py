"""The CPU training world (tests/support/cpu_world.py), built once per session for the modules
that train in it without changing it (each run writes into its own directory). Set
``SPADER_CPU_WORLD`` to a directory to build it there once and reuse it across sessions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    import os

    from cpu_world import build_world

    root = os.environ.get("SPADER_CPU_WORLD")
    # one directory per session, shared with tests/slurm's `cpu_world` (a second build reuses the
    # index and the warm-started model)
    return build_world(Path(root) if root else tmp_path_factory.getbasetemp() / "cpu_world")
