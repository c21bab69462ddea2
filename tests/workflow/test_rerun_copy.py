"""A finished demo in a fresh tree: reruns decided by what changed, not by when files were written.

The session's demo run (``demo_run``, tests/conftest.py) is copied as a user moves results: a
fresh copy of the repository's files, every one written now (as a clone or a ``git checkout``
writes them, so every script is newer than every output), with the demo's outputs and
Snakemake's records copied in keeping their times (``cp -a``). Snakemake then plans with the
workflow's default profile (profiles/default/config.yaml): params and input files decide, not
script modification times. One copy is shared by the tests below, which restore what they edit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

#: What a run leaves besides the repository's own files (all ignored by git).
OUTPUTS = (
    "results",
    "logs",
    ".snakemake",
    "resources/demo/corpus",
    "resources/demo/datasets",
    "resources/.integrity",
)


def _planned(smk, tree: Path, *extra: str) -> set[tuple[str, str]]:
    """(rule, wildcards) of the jobs a dry run of the demo plans in ``tree``."""
    proc = smk.run(*smk.demo_args(), "-n", *extra, cwd=tree)
    return {
        (j.rule, ",".join(f"{k}={v}" for k, v in sorted(j.wildcards.items())))
        for j in smk.parse_jobs(proc.stdout + proc.stderr)
        if j.rule != "all"
    }


@pytest.fixture(scope="module")
def fresh(demo_run, smk, tmp_path_factory) -> Path:
    tree = smk.copy_repo(tmp_path_factory.mktemp("fresh") / "repo")
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=smk.repo, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    now = time.time()
    for rel in tracked:  # written now, after every output of the demo
        path = tree / rel
        if path.is_file() and not path.is_symlink():
            os.utime(path, (now, now))
    for rel in OUTPUTS:
        source = demo_run["work"] / rel
        if source.is_dir():
            shutil.copytree(source, tree / rel, symlinks=True, ignore=shutil.ignore_patterns("locks"))
    return tree


def test_a_fresh_tree_with_copied_results_plans_nothing(fresh, smk):
    assert _planned(smk, fresh) == set()
    # not vacuous: Snakemake's own defaults (its code trigger on) rerun every job of a script newer
    # than its outputs, here every computing job of the demo
    without_profile = _planned(smk, fresh, "--workflow-profile", "none")
    assert {"evaluate_policy", "train_policy", "build_bm25_index"} <= {rule for rule, _ in without_profile}


def test_a_comment_in_a_workflow_script_plans_nothing(fresh, smk):
    script = fresh / "workflow" / "scripts" / "evaluate_policy.py"
    original = script.read_text(encoding="utf-8")
    script.write_text(original + "\n# a comment changes no code\n", encoding="utf-8")
    try:
        assert _planned(smk, fresh) == set()
    finally:
        script.write_text(original, encoding="utf-8")


def test_a_semantic_edit_reruns_the_stages_that_run_it(fresh, smk, tmp_path):
    """An edit of the tables' statistics reruns the tables, nothing else; with
    `code_reruns.evaluation` off it reruns nothing."""
    from spader.infra.stage_code import affected_rules

    module = fresh / "src" / "spader" / "evaluation" / "stats.py"
    # the tables, and the comparison of a named run with the default one (its paired intervals);
    # the default target builds only the former
    assert list(affected_rules([str(module)], fresh / "workflow" / "scripts", fresh / "src" / "spader")) == [
        "aggregate_results",
        "compare_runs",
    ]
    original = module.read_text(encoding="utf-8")
    module.write_text(original + "\n_FINGERPRINT_PROBE = 1\n", encoding="utf-8")
    switched_off = tmp_path / "off.yaml"
    switched_off.write_text("code_reruns: {evaluation: false}\n")
    try:
        planned = _planned(smk, fresh)
        kept = _planned(smk, fresh, "--configfile", "config/demo.yaml", str(switched_off))
    finally:
        module.write_text(original, encoding="utf-8")
    assert planned == {("aggregate_results", "backbone=demo")}
    assert kept == set()
