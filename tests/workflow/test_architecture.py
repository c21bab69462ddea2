"""The layers of docs/ARCHITECTURE.md hold: the import contracts of pyproject.toml pass, and they
catch an upward import, a framework import in the core and a Snakemake import in the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(src: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}  # the copy shadows the installed package
    return subprocess.run(
        [str(LINT), "--no-cache", str(REPO / "pyproject.toml")], env=env, capture_output=True, text=True
    )


def test_the_contracts_are_kept():
    proc = _lint(REPO / "src")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("core/text.py", "import spader.evaluation.tables", "Layers"),
        ("retrieval/cache.py", "from spader.training import launch", "Layers"),
        ("core/rewards.py", "import omegaconf", "The method core is pure"),
        ("data/mix.py", "import ray", "Only spader.integrations imports"),
        ("infra/retry.py", "import snakemake", "never imports Snakemake"),
    ],
)
def test_the_contracts_catch_violations(tmp_path, module, line, contract):
    shutil.copytree(
        REPO / "src" / "spader", tmp_path / "spader", ignore=shutil.ignore_patterns("__pycache__")
    )
    path = tmp_path / "spader" / module
    path.write_text(path.read_text() + f"\n{line}  # injected by the test\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0
    assert f"{contract}" in proc.stdout and "BROKEN" in proc.stdout


def test_the_architecture_doc_lists_every_layer():
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    for layer in layers:
        for package in layer.split("|"):
            assert f"`{package.strip()}`" in doc, package
