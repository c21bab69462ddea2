"""A method from outside the repository: one folder (settings, reward, advantage) declared by an
entry point, plus one config entry, is planned by the paper DAG (its training, its evaluations,
its row in the tables) without changing a single param of the project's own jobs; a broken
plug-in fails in one line naming its entry point. Its CPU training through verl's trainer is in
tests/verl/test_plugin_training.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from plugin_method import REPO, VARIANT, environment, install

DAG = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from dag_jobs import _with_dag
    from spader.config.files import merge_files

    repo, overlays = Path(sys.argv[1]), sys.argv[2:]
    config = merge_files([repo / "config" / "config.yaml", *overlays])

    def visit(dag):
        return {
            f"{job.rule.name} {sorted(job.wildcards_dict.items())}": {
                k: repr(v) for k, v in job.params.items() if k != "code"
            }
            for job in dag.jobs
        }

    print(json.dumps(_with_dag(config, "all", repo, None, visit)))
    """
)


def paper_dag(env: dict[str, str], *overlays: Path) -> dict[str, dict[str, str]]:
    """Every job of the paper DAG with its params (but the code fingerprint), built in a process
    of ``env``."""
    proc = subprocess.run(
        [sys.executable, "-c", DAG, str(REPO), *map(str, overlays)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dags(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    site = install(root)
    overlay = root / "overlay.yaml"
    paper = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    variants = [*paper["backbones"]["qwen3_8b"]["variants"], "bonus"]
    overlay.write_text(
        yaml.safe_dump({"variants": {"bonus": VARIANT}, "backbones": {"qwen3_8b": {"variants": variants}}})
    )
    without = environment(root / "nothing-installed")
    return paper_dag(without), paper_dag(environment(site)), paper_dag(environment(site), overlay)


@pytest.mark.slow
def test_installing_a_method_changes_no_param_of_the_project(dags):
    plain, installed, _ = dags
    assert installed == plain


@pytest.mark.slow
def test_one_config_entry_plans_its_training_evaluation_and_table_row(dags):
    plain, _, added = dags
    train = "train_policy [('backbone', 'qwen3_8b'), ('variant', 'bonus')]"
    assert train in added and train not in plain
    params = eval(added[train]["variant"])
    assert params["bonus"] == 0.25 and params["verl_config"] == "grpo"
    assert params["advantage"] == "bonus_return" and params["reward"] == "novelty_bonus"
    for dataset in ("qampari", "mintaka", "webqsp", "quest"):
        key = f"evaluate_policy [('backbone', 'qwen3_8b'), ('dataset', '{dataset}'), ('method', 'bonus')]"
        assert key in added and key not in plain
    tables = "aggregate_results [('backbone', 'qwen3_8b')]"
    assert "'bonus'" in added[tables]["methods"] and "'bonus'" not in plain[tables]["methods"]
    # the variant's own key is in its own variant only: no other job of the project changed but
    # the tables, which list every configured variant (the other backbone's too)
    changed = {k for k in plain if plain[k] != added[k]}
    assert changed == {tables, "aggregate_results [('backbone', 'llama3_1_8b')]"}, changed


def _check(env, *overlay_args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spader.cli", "config", "show", *overlay_args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_a_broken_plugin_fails_in_one_line_naming_its_entry_point(tmp_path):
    site = install(tmp_path, entry_point="novelty_bonus:NOT_THERE")
    proc = _check(environment(site))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "entry point 'novelty_bonus'" in lines[0] and "NOT_THERE" in lines[0], (
        proc.stderr
    )


@pytest.mark.slow
def test_a_plugin_variant_refuses_a_key_its_reward_does_not_read(tmp_path):
    site = install(tmp_path)
    overlay = tmp_path / "bad.yaml"
    overlay.write_text(yaml.safe_dump({"variants": {"bonus": {**VARIANT, "beta": 2.0}}}))
    proc = _check(environment(site), "--configfile", str(overlay))
    assert proc.returncode == 2 and "variants.bonus" in proc.stderr and "beta" in proc.stderr, proc.stderr
    overlay.write_text(yaml.safe_dump({"variants": {"bonus": {**VARIANT, "bonus": -1.0}}}))
    proc = _check(environment(site), "--configfile", str(overlay))
    assert proc.returncode == 2 and "bonus" in proc.stderr, proc.stderr
    overlay.write_text(yaml.safe_dump({"variants": {"bonus": VARIANT}}))
    shown = yaml.safe_load(_check(environment(site), "--configfile", str(overlay)).stdout)
    assert shown["variants"]["bonus"]["bonus"] == 0.25
    assert "bonus" not in shown["variants"]["spader"]  # a plug-in's key belongs to its variants
