"""What every config key reruns, asked of Snakemake against a finished run.

``spader.infra.rerun_keys.TABLE`` states, for every key of the typed config model, the rules a change
reruns (rendered into docs/running.md). The walk (tests/support/rerun_walk.py) makes a finished
state of the paper's DAG and of the demo's (every job's outputs and Snakemake's metadata record),
checks that restating every value in effect plans nothing, then changes each key to another
valid value and asks Snakemake, with the rerun triggers of the workflow's default profile, which
jobs it would run. One process walks both configs (about a minute of CPU on 2 cores).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dag_jobs import affected, dag_jobs
from pydantic import BaseModel
from rerun_walk import list_keys, model_keys

from spader.infra import rerun_keys

REPO = Path(__file__).resolve().parents[2]


def test_every_key_of_the_model_has_a_row_and_is_walked():
    keys = list(model_keys())
    assert len(keys) > 150  # the walk reads the model itself, not a list of its own
    for key in keys:
        row = rerun_keys.entry(key)  # raises for a key in no row
        assert row.paper is not None or row.demo is not None, f"{key} is walked on no DAG"
    used = {pattern for row in rerun_keys.TABLE for pattern in row.keys}
    unmatched = {p for p in used if not any(rerun_keys._match(p, k.split(".")) for k in keys)}
    assert not unmatched, f"rows name keys the model does not have: {sorted(unmatched)}"


def test_every_list_key_is_compared_in_order_or_as_a_set():
    """Each list-typed key of the model is classified in ``rerun_keys.LISTS``; a new one fails here
    until it is (the finder is shown to see a list key the model does not have yet)."""
    keys = list_keys()
    assert {"agent.stop", "targets", "backbones.*.variants"} <= set(keys)
    unclassified = [k for k in keys if rerun_keys.list_kind(k) is None]
    assert not unclassified, f"classify these list keys in spader.infra.rerun_keys.LISTS: {unclassified}"
    assert set(rerun_keys.LISTS) == set(keys), "LISTS names keys that are not lists of the model"

    class Inner(BaseModel):
        tags: list[str] | None = None
        size: int = 1

    class Outer(BaseModel):
        names: dict[str, Inner] = {}
        paths: tuple[str, ...] = ()

    assert list_keys(Outer) == ["names.*.tags", "paths"]


def test_set_lists_compare_as_sets_and_ordered_lists_in_order():
    stop = ["</tool_call>", "</answer>"]
    assert rerun_keys.canonical({"stop": stop}, ("agent",)) == rerun_keys.canonical(
        {"stop": [*reversed(stop), stop[0]]}, ("agent",)
    )
    assert rerun_keys.canonical({"b": {"variants": ["x", "y"]}}, ("backbones",)) != rerun_keys.canonical(
        {"b": {"variants": ["y", "x"]}}, ("backbones",)
    )
    assert rerun_keys.canonical([1, 1]) == [1, 1]  # a list without its key is left as it is


def test_the_model_keeps_a_set_lists_items_once_and_refuses_repeats_in_ordered_lists():
    from spader.config import ConfigError, check_config, resolved_config

    config = resolved_config(REPO / "config" / "config.yaml")
    config["agent"]["stop"] = ["</answer>", "</tool_call>", "</answer>"]
    config["targets"] = [*config["targets"], *config["targets"]]
    checked = check_config(config)
    assert checked.agent.stop == ["</answer>", "</tool_call>"]
    assert len(checked.targets) == len(set(checked.targets))
    config["backbones"]["qwen3_8b"]["prompting"] = ["rag", "rag"]
    with pytest.raises(ConfigError, match="backbones.qwen3_8b.prompting"):
        check_config(config)


def test_reordered_sets_and_failure_thresholds_plan_nothing():
    """Reordering or repeating a set list (``agent.stop``, ``targets``) and changing a failure
    threshold reran every trained job or every evaluation; each is the same run. Reordering a list
    whose order counts still reruns what reads it."""
    with open(REPO / "config" / "config.yaml") as f:
        base = yaml.safe_load(f)
    target = "results/qwen3_8b/f1.tsv"
    before = dag_jobs(base, target, REPO)
    same = copy.deepcopy(base)
    same.setdefault("agent", {})["stop"] = ["</answer>", "</tool_call>", "</answer>"]
    same["targets"] = [*reversed(base["targets"]), base["targets"][0]]
    same.setdefault("evaluation", {})["max_error_share"] = 0.5
    same.setdefault("training", {})["max_search_error_rate"] = 0.5
    assert affected(before, dag_jobs(same, target, REPO)) == set()
    ordered = copy.deepcopy(base)
    ordered["backbones"]["qwen3_8b"]["prompting"] = ["react", "rag"]  # the default: rag, react
    assert {rule for rule, _ in affected(before, dag_jobs(ordered, target, REPO))} == {"aggregate_results"}


def test_rerun_table_in_the_docs_is_current():
    assert rerun_keys.main(["check", "--root", str(REPO)]) == 0, "run: spader rerun-keys write"


def test_spader_rerun_keys_checks_and_writes_the_table(tmp_path, capsys):
    from spader.cli import main

    (tmp_path / "docs").mkdir()
    stale = (REPO / "docs" / "running.md").read_text().replace("| `hardware.*` |", "| `hardware.old` |")
    (tmp_path / "docs" / "running.md").write_text(stale)
    assert main(["rerun-keys", "check", "--root", str(tmp_path)]) == 1
    assert "docs/running.md is out of date; run spader rerun-keys write" in capsys.readouterr().err
    assert main(["rerun-keys", "write", "--root", str(tmp_path)]) == 0
    assert main(["rerun-keys", "check", "--root", str(tmp_path)]) == 0
    assert (tmp_path / "docs" / "running.md").read_text() == (REPO / "docs" / "running.md").read_text()


def test_a_rule_takes_only_the_keys_that_rerun_it():
    evaluation = {"temperature": 1.0, "bootstrap_samples": 10000, "cpu_threads": 2, "gpus": 1}
    assert rerun_keys.for_rule("evaluate_policy", ["evaluation"], evaluation) == {
        "temperature": 1.0,
        "gpus": 1,
    }
    service = {"host": "127.0.0.1", "cache_entries": 5, "slice_queries": 64, "max_query_chars": 1000}
    assert rerun_keys.for_rule("train_policy", ["retrieval", "service"], service) == {
        "slice_queries": 64,
        "max_query_chars": 1000,
    }
    training = {"lr": 1e-5, "time_limit": {"hours": {"default": 40.0}, "retries": 5}}
    assert rerun_keys.for_rule("train_policy", ["training"], training) == {"lr": 1e-5}


def test_jobs_read_what_is_no_param_from_their_config():
    """A job's settings are its config overlaid with its params: the operational keys left out of
    the params still reach it, with the configured values."""
    from spader.infra.glue import retrieval_settings

    service = {"host": "127.0.0.9", "retries": 7, "cache_entries": 5, "slice_queries": 64}
    config = {"retrieval": {"topk": 5, "service": service}}
    params = {"topk": 5, "service": {"slice_queries": 64}, "reranker": {"path": "resources/models/x"}}
    assert retrieval_settings(params, config) == {
        "topk": 5,
        "service": service,
        "reranker": {"path": "resources/models/x"},
    }


def test_params_are_compared_as_canonical_values():
    """``beta: 4`` and ``beta: 4.0``, keys in another order and a default restated are the value in
    effect: no job's params change (the issue was a retrained SPADER)."""
    with open(REPO / "config" / "config.yaml") as f:
        base = yaml.safe_load(f)
    restated = copy.deepcopy(base)
    restated["variants"]["spader"] = dict(reversed(list(restated["variants"]["spader"].items())))
    restated["variants"]["spader"]["beta"] = 4  # an int for the default 4.0
    restated["retrieval"] = {**{"topk": 5}, **restated["retrieval"]}  # another order
    restated.setdefault("evaluation", {})["bootstrap_samples"] = 10000  # a default restated
    target = "results/qwen3_8b/f1.tsv"
    before, after = dag_jobs(base, target, REPO), dag_jobs(restated, target, REPO)
    assert affected(before, after) == set()
    changed = copy.deepcopy(base)
    changed["variants"]["spader"]["beta"] = 4.5  # while a real change still reruns
    assert ("train_policy", "spader") in affected(before, dag_jobs(changed, target, REPO))


def test_every_run_takes_the_rerun_triggers_of_the_default_profile(tmp_path, monkeypatch):
    """A plain run, a run with the SLURM profile and a run of the workflow from another
    directory all plan with the default profile's triggers (Snakemake's `code` trigger off); the
    command line still wins."""
    from snakemake.cli import parse_args
    from snakemake.settings.enums import RerunTrigger

    wanted = {RerunTrigger.PARAMS, RerunTrigger.INPUT, RerunTrigger.SOFTWARE_ENV}
    monkeypatch.chdir(REPO)
    assert set(parse_args(["-n"])[1].rerun_triggers) == wanted
    _, slurm = parse_args(["--profile", "slurm", "-n"])
    assert slurm.executor == "slurm" and set(slurm.rerun_triggers) == wanted
    assert set(parse_args(["-n", "--rerun-triggers", "mtime"])[1].rerun_triggers) == {RerunTrigger.MTIME}
    monkeypatch.chdir(tmp_path)
    elsewhere = ["-n", "-s", str(REPO / "workflow" / "Snakefile"), "-d", str(tmp_path)]
    assert set(parse_args(elsewhere)[1].rerun_triggers) == wanted
    # without the profile, Snakemake's own defaults: its code trigger included
    assert RerunTrigger.CODE in set(parse_args([*elsewhere, "--workflow-profile", "none"])[1].rerun_triggers)


@pytest.fixture(scope="module")
def walked(tmp_path_factory) -> dict:
    """The walk of both configs, in one process (tests/support/rerun_walk.py)."""
    root = tmp_path_factory.mktemp("rerun_walk")
    out = root / "walk.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "rerun_walk.py"), str(out), str(root)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = json.loads(out.read_text())
    print(
        f"rerun walk: {result['seconds']:.0f} s, CPU {result['cpu_seconds']:.0f} s, {result['plans']} plans"
    )
    return result


@pytest.mark.slow
def test_each_key_reruns_what_the_table_says(walked):
    wrong = []
    for name in ("paper", "demo"):
        for key, rules in walked[name].items():
            row = rerun_keys.entry(key)
            expected = row.paper if name == "paper" else row.demo
            if set(rules) != set(expected or ()):
                missing, extra = (
                    sorted(set(expected or ()) - set(rules)),
                    sorted(set(rules) - set(expected or ())),
                )
                wrong.append(
                    f"{name}: {walked[name + '_keys'][key]} reruns {rules}; missing {missing}, extra {extra}"
                )
    assert not wrong, "\n".join(wrong)
    walked_keys = set(walked["paper"]) | set(walked["demo"])
    for key in set(model_keys()) - walked_keys:  # only where one instance of a class stands for all
        row = rerun_keys.entry(key)
        assert row.walked_on and walked_keys & {k for k in model_keys() if rerun_keys.entry(k) is row}, key


# which wildcard a row's scope names, and the part of its walked key that holds the name
_SCOPES = {
    "that variant (and a run it shares)": ("variant", 1),
    "that backbone": ("backbone", 1),
    "that dataset": ("dataset", 1),
}


# the jobs of one dataset; its evaluations rerun for every dataset when the training mix changes
_DATASET_RULES = ("download_dataset", "normalize_dataset", "export_eval_set")


@pytest.mark.slow
def test_a_key_of_one_variant_backbone_or_dataset_reruns_only_its_jobs(walked):
    """Rows scoped to one variant, backbone or dataset rerun no job of another (the jobs that
    carry that wildcard; the tables and what depends on a rerun job run again as a consequence)."""
    checked = 0
    for name in ("paper", "demo"):
        for key, jobs in walked[f"{name}_jobs"].items():
            scope = rerun_keys.entry(key).scope.split(";")[0]
            if scope not in _SCOPES or not jobs:
                continue
            wildcard, part = _SCOPES[scope]
            own = walked[f"{name}_keys"][key].split(".")[part]
            for rule, wildcards in jobs:
                value = dict(wildcards).get(wildcard) or (
                    dict(wildcards).get("method") if wildcard == "variant" else None
                )
                if value is None or (wildcard == "dataset" and rule not in _DATASET_RULES):
                    continue
                assert value == own, f"{name}: {key} reruns {rule} {dict(wildcards)}"
                checked += 1
    assert checked > 50
