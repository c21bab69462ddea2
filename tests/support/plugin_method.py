"""A method from outside the repository, installed for a test: the package
``tests/fixtures/plugin_method/novelty_bonus`` copied into a directory of its own with the
distribution metadata that declares its entry point (group ``spader.methods``), as ``pip
install`` would leave it; a process with that directory on ``PYTHONPATH`` finds the method
(``importlib.metadata`` reads the ``.dist-info`` of every path entry)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "fixtures" / "plugin_method" / "novelty_bonus"

#: The config entry that trains it: one variant of its advantage and reward with its own key.
VARIANT = {"advantage": "bonus_return", "reward": "novelty_bonus", "bonus": 0.25}


def install(root: Path, *, entry_point: str = "novelty_bonus:METHOD") -> Path:
    """The directory to put on ``PYTHONPATH`` (the package and its ``.dist-info``)."""
    site = root / "site"
    shutil.copytree(SOURCE, site / "novelty_bonus", ignore=shutil.ignore_patterns("__pycache__"))
    dist = site / "novelty_bonus-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: novelty-bonus\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[spader.methods]\nnovelty_bonus = {entry_point}\n")
    return site


def environment(site: Path) -> dict[str, str]:
    """``os.environ`` with ``site`` and the repository's package first on ``PYTHONPATH``."""
    paths = [str(site), str(REPO / "src"), str(REPO / "tests" / "support")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
