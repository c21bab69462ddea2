"""The layers of docs/ARCHITECTURE.md hold: the import contracts of pyproject.toml pass, and they
catch an upward import, a framework import in the core or outside its integration, a Snakemake
import in the package and an import of the demo; the workflow's scripts import only the package
and the standard library (a check over their syntax trees: lint-imports does not see scripts); the
rules import no framework and no framework glue of the package (their DAG comes from spader.dag)."""

from __future__ import annotations

import ast
import io
import os
import shutil
import subprocess
import sys
import textwrap
import tokenize
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
        ("datasets/__init__.py", "from spader.config import DATASETS", "Layers"),
        ("datasets/builtin.py", "import omegaconf", "The method core is pure"),
        (
            "datasets/builtin.py",
            "from spader.demo import releases",
            "Nothing in the package imports the demo",
        ),
        ("retrieval/cache.py", "from spader.training import launch", "Layers"),
        ("planning/costs.py", "from spader.training import launch", "Layers"),
        ("training/launch.py", "from spader.dag import Jobs", "Layers"),
        ("planning/plan.py", "import ray", "Only spader.integrations.verl imports"),
        ("core/rewards.py", "import omegaconf", "The method core is pure"),
        ("data/mix.py", "import ray", "Only spader.integrations.verl imports"),
        ("infra/retry.py", "import snakemake", "never imports Snakemake"),
        ("integrations/verl/reward.py", "import spader.demo", "Nothing in the package imports the demo"),
        ("planning/plan.py", "from spader.demo import tiny", "Nothing in the package imports the demo"),
        ("integrations/sglang.py", "import verl", "Only spader.integrations.verl imports"),
        ("integrations/sglang.py", "import ray", "Only spader.integrations.verl imports"),
        ("integrations/sglang.py", "import transfer_queue", "Only spader.integrations.verl imports"),
        ("cli/plan.py", "import transfer_queue", "Only spader.integrations.verl imports"),
        ("integrations/verl/reward.py", "import sglang", "Only spader.integrations.sglang imports"),
        ("evaluation/evaluate.py", "import sglang", "Only spader.integrations.sglang imports"),
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


def script_imports(path: Path) -> list[str]:
    """The top-level names of the modules a script imports (``import a.b`` and ``from a.b import c``
    give ``a``), anywhere in it."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." if node.level else (node.module or "").split(".")[0])
    return names


def foreign_imports(scripts: Path) -> list[str]:
    """``script: module`` for every import of a workflow script that is neither the package nor
    the standard library."""
    allowed = {"spader", "__future__", *sys.stdlib_module_names}
    return [
        f"{path.name}: {name}"
        for path in sorted(scripts.glob("*.py"))
        for name in script_imports(path)
        if name not in allowed
    ]


def test_workflow_scripts_import_only_the_package(tmp_path):
    scripts = REPO / "workflow" / "scripts"
    assert list(scripts.glob("*.py")) and not foreign_imports(scripts)
    # the check catches a framework, a tracking library and a relative import, at any depth
    for name, line in [
        ("evaluate_policy.py", "import mlflow"),
        ("train_policy.py", "from verl.trainer import main_ppo"),
        ("build_evidence.py", "def f():\n    import numpy as np"),
        ("aggregate_results.py", "from . import helpers"),
    ]:
        copy = tmp_path / name.removesuffix(".py")
        copy.mkdir()
        (copy / name).write_text((scripts / name).read_text() + f"\n{line}\n")
        assert len(foreign_imports(copy)) == 1, line


#: What the rules must not import: the frameworks, and the package's glue to them (training jobs,
#: the GPU plan, the framework integrations), which reach the rules only through spader.dag.
RULE_FORBIDDEN = (
    "verl", "ray", "hydra", "omegaconf", "transfer_queue", "transferqueue", "sglang", "torch",
    "transformers", "mlflow", "pyserini", "spader.integrations", "spader.training", "spader.planning",
)  # fmt: skip


def rule_imports(path: Path) -> list[str]:
    """The modules a Snakefile or rule file imports, anywhere in it: each logical line of its
    tokens that starts with ``import`` or ``from`` is parsed as the Python statement it is."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    modules, statement = [], []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            continue
        if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if statement and statement[0].string in ("import", "from"):
                source = "".join(lines[statement[0].start[0] - 1 : statement[-1].end[0]])
                for node in ast.walk(ast.parse(textwrap.dedent(source))):
                    if isinstance(node, ast.Import):
                        modules += [alias.name for alias in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        modules.append(node.module or "")
            statement = []
        else:
            statement.append(token)
    return modules


def forbidden_rule_imports(workflow: Path) -> list[str]:
    """``file: module`` for every import of the Snakefile or a rule file that :data:`RULE_FORBIDDEN`
    names (the module or a package above it)."""
    files = [workflow / "Snakefile", *sorted((workflow / "rules").glob("*.smk"))]
    return [
        f"{path.name}: {module}"
        for path in files
        for module in rule_imports(path)
        if any(module == f or module.startswith(f + ".") for f in RULE_FORBIDDEN)
    ]


def test_the_rules_import_no_framework_and_no_framework_glue(tmp_path):
    workflow = REPO / "workflow"
    assert "spader.dag" in rule_imports(workflow / "rules" / "common.smk")
    assert not forbidden_rule_imports(workflow)
    # the check catches a framework, the package's glue and an import inside a rule's code
    for i, (name, line) in enumerate(
        [
            ("rules/common.smk", "import omegaconf"),
            ("rules/common.smk", "from spader.integrations.verl.overrides import shared_training_runs"),
            (
                "rules/train.smk",
                "if True:\n    from spader.training.scorer_launch import (\n        judge_params,\n    )",
            ),
            ("Snakefile", "import torch, os"),
            ("rules/evaluate.smk", "from spader.planning.plan import plan_config"),
        ]
    ):
        copy = tmp_path / str(i)
        shutil.copytree(workflow, copy)
        (copy / name).write_text((workflow / name).read_text() + f"\n{line}\n")
        assert len(forbidden_rule_imports(copy)) == 1, line
