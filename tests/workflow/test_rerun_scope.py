"""Which jobs a config, YAML or code change reruns, including the stages that cannot run here
(training).

Snakemake reruns a job when its params or inputs change and then everything downstream. These
tests build the paper DAG through Snakemake's API twice, before and after a change, and check
that the changed jobs plus their descendants are exactly the expected set (the demo rerun tests in
test_demo.py check the same behaviour for real on the CPU stages). Code changes are edits of a
copy of the package: every computing rule has a fingerprint of the modules its script runs.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dag_jobs import affected, dag_jobs

from spader.config import resolved_config

REPO = Path(__file__).resolve().parents[2]


def _jobs(config: dict, target: str) -> dict:
    return dag_jobs(config, target, REPO)


_affected = affected


def _paper() -> dict:
    return resolved_config(REPO / "config" / "config.yaml")


TARGET = "results/qwen3_8b/f1.tsv"
DATASETS = ("qampari", "mintaka", "webqsp", "quest")


def test_variant_hyperparameter_reruns_only_that_variant():
    base = _paper()
    changed = copy.deepcopy(base)
    # no_ig shares its training run with no other variant (no_np and beta_0 do: same settings)
    changed["variants"]["no_ig"]["cost"] = 0.02
    affected = _affected(_jobs(base, TARGET), _jobs(changed, TARGET))
    expected = {("train_policy", "no_ig"), ("export_checkpoint", "no_ig"), ("aggregate_results", None)}
    expected |= {("evaluate_policy", "no_ig")}
    assert affected == expected


def test_variant_yaml_edit_reruns_only_variants_built_on_it():
    jobs = _jobs(_paper(), TARGET)
    affected = _affected(jobs, jobs, changed_input="config/verl/ppo.yaml")
    assert {a for a in affected if a[0] == "train_policy"} == {("train_policy", "ppo")}
    # SPADER's variants compose its one YAML (config/verl/spader.yaml)
    spader_children = {
        a[1] for a in _affected(jobs, jobs, changed_input="config/verl/spader.yaml") if a[0] == "train_policy"
    }
    # beta_0 and beta_4 train no run of their own in the paper setup (the same as no_np and spader)
    assert {"spader", "no_spa", "no_np", "no_ig", "beta_1", "beta_8"} <= spader_children
    assert not {"grpo", "ppo"} & spader_children


def test_training_hyperparameter_reruns_all_training_not_data():
    base = _paper()
    changed = copy.deepcopy(base)
    changed["training"]["lr"] = 2e-5
    affected = _affected(_jobs(base, TARGET), _jobs(changed, TARGET))
    rules = {rule for rule, _ in affected}
    assert rules == {"train_policy", "export_checkpoint", "evaluate_policy", "aggregate_results"}
    assert ("evaluate_policy", "rag") not in {(r, m) for r, m in affected}  # baselines do not train


def test_mix_change_reruns_data_and_training_not_index():
    base = _paper()
    changed = copy.deepcopy(base)
    changed["mix"]["counts"]["quest"] = 1999
    affected = _affected(_jobs(base, TARGET), _jobs(changed, TARGET))
    rules = {rule for rule, _ in affected}
    assert {"mix_training_set", "export_rl_dataset", "train_policy"} <= rules
    assert not {"build_bm25_index", "normalize_dataset", "download_dump", "export_eval_set"} & rules


def _demo() -> dict:
    """The demo config (overlaid on the paper config, as `--configfile config/demo.yaml` does),
    training `spader` and `grpo` on the tiny backbone."""
    config = resolved_config(REPO / "config" / "config.yaml", REPO / "config" / "demo.yaml")
    variants = config["backbones"]["demo"]["variants"]
    config["backbones"]["demo"]["variants"] = list(dict.fromkeys([*variants, "spader", "grpo"]))
    return config


def test_reward_hyperparameter_reruns_only_that_variants_training_and_dependants():
    """beta of `spader` is read by its training only: that training, its export, its evaluations
    and the tables rerun; grpo's training, the baselines and all data stages do not."""
    base = _demo()
    changed = copy.deepcopy(base)
    changed["variants"]["spader"]["beta"] = 2.0
    before, after = _jobs(base, "results/demo/f1.tsv"), _jobs(changed, "results/demo/f1.tsv")
    assert ("train_policy", (("backbone", "demo"), ("variant", "grpo"))) in after
    assert _affected(before, after) == {
        ("train_policy", "spader"),
        ("export_checkpoint", "spader"),
        ("evaluate_policy", "spader"),
        ("aggregate_results", None),
    }


# --- code changes --------------------------------------------------------------------------------

PAPER = resolved_config(REPO / "config" / "config.yaml")
QWEN = PAPER["backbones"]["qwen3_8b"]
VARIANTS = set(QWEN["variants"])
METHODS = VARIANTS | set(QWEN["prompting"])
TRAINING = ("train_policy", "export_checkpoint")

# name: (file of the repository, [appended text] or [old, new], the rules it reruns).
# A rule given as (rule, methods) reruns only the jobs of those methods; "training" is every
# training and export job of the DAG plus what follows it (evaluations of the trained variants and
# the tables).
_SEMANTIC = ["\n_FINGERPRINT_PROBE = 1\n"]
_AFTER_TRAINING = ("training", ("evaluate_policy", VARIANTS), "aggregate_results")
CODE_EDITS = {
    # method core
    "core rewards": ("src/spader/core/rewards.py", _SEMANTIC, _AFTER_TRAINING),
    "core advantage": ("src/spader/core/advantage.py", _SEMANTIC, _AFTER_TRAINING),
    "core matcher": (
        "src/spader/core/matching.py",
        _SEMANTIC,
        ("build_evidence", "training", "evaluate_policy", "aggregate_results"),
    ),
    "core comment": ("src/spader/core/rewards.py", ["\n# a comment changes no code\n"], ()),
    "core docstring": (
        "src/spader/core/rewards.py",
        ['"""Diversity-aware exploration rewards', '"""Diversity-aware exploration rewards, reworded'],
        (),
    ),
    # capabilities
    "evaluation tables": ("src/spader/evaluation/tables.py", _SEMANTIC, ("aggregate_results",)),
    "evaluation run": (
        "src/spader/evaluation/evaluate.py",
        _SEMANTIC,
        ("evaluate_policy", "aggregate_results"),
    ),
    "data mix": (
        "src/spader/data/mix.py",
        _SEMANTIC,
        ("mix_training_set", "export_rl_dataset", "build_evidence", *_AFTER_TRAINING),
    ),
    "retrieval index": (
        "src/spader/retrieval/index.py",
        _SEMANTIC,
        ("build_bm25_index", "build_evidence", "training", "evaluate_policy", "aggregate_results"),
    ),
    # the verl integration
    "verl estimators": ("src/spader/integrations/verl/estimators.py", _SEMANTIC, _AFTER_TRAINING),
    # infrastructure and downloads: nothing
    "infra tracking": ("src/spader/infra/tracking.py", _SEMANTIC, ()),
    "infra glue": ("src/spader/infra/glue.py", _SEMANTIC, ()),
    "infra downloader": ("src/spader/infra/download.py", _SEMANTIC, ()),
    "dataset download": ("src/spader/data/release_files.py", _SEMANTIC, ()),
    "model download": ("src/spader/models/hub.py", _SEMANTIC, ()),
    # a stage's own script
    "aggregate script": ("workflow/scripts/aggregate_results.py", _SEMANTIC, ("aggregate_results",)),
}


def _expected(spec: tuple, every_job: set) -> set:
    out = set()
    for item in spec:
        rules, names = (item, None) if isinstance(item, str) else item
        rules = TRAINING if rules == "training" else (rules,)
        out |= {(r, n) for r, n in every_job if r in rules and (names is None or n in names)}
    return out


@functools.cache
def _code_edit_reruns(tmp: str) -> tuple[set, dict[str, set]]:
    """Every job, and the affected jobs per edit, from one subprocess that imports the copy's package."""
    copy_root = Path(tmp) / "repo"
    for part in ("src", "workflow", "config"):
        shutil.copytree(REPO / part, copy_root / part, ignore=shutil.ignore_patterns("__pycache__"))
    spec = {
        "repo": str(copy_root),
        "target": TARGET,
        "config": PAPER,
        "edits": {name: [path, *change] for name, (path, change, _) in CODE_EDITS.items()},
    }
    spec_file = Path(tmp) / "spec.json"
    spec_file.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(copy_root / "src"), XDG_CACHE_HOME=str(Path(tmp) / "cache"))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "dag_jobs.py"), str(spec_file)],
        cwd=copy_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    every_job = {(r, n or None) for r, n in result["all"]}
    return every_job, {name: {(r, n or None) for r, n in keys} for name, keys in result["edits"].items()}


@pytest.fixture(scope="module")
def code_edit_reruns(tmp_path_factory):
    return _code_edit_reruns(str(tmp_path_factory.mktemp("code_edits")))


@pytest.mark.slow
@pytest.mark.parametrize("edit", list(CODE_EDITS))
def test_code_edit_reruns_exactly_the_stages_that_run_it(code_edit_reruns, edit):
    every_job, reruns = code_edit_reruns
    assert reruns[edit] == _expected(CODE_EDITS[edit][2], every_job)


def test_expected_sets_are_not_vacuous(tmp_path):
    every_job = {("train_policy", "spader"), ("evaluate_policy", "rag"), ("evaluate_policy", "spader")}
    assert _expected(_AFTER_TRAINING, every_job) == {
        ("train_policy", "spader"),
        ("evaluate_policy", "spader"),
    }


def test_download_rules_have_no_code_fingerprint():
    jobs = _jobs(_paper(), TARGET)
    for (rule, _), (params, _, _) in jobs.items():
        if rule.startswith("download_"):
            assert "'code'" not in params, rule
        else:
            assert "'code'" in params, rule


def test_operational_settings_rerun_nothing():
    base = _paper()
    changed = copy.deepcopy(base)
    changed["retrieval"]["service"].update(
        host="127.0.0.2", startup_timeout_s=99, request_timeout_s=7, retries=9
    )
    changed["mlflow"].update(experiment="elsewhere", enabled=False)
    assert _affected(_jobs(base, TARGET), _jobs(changed, TARGET)) == set()


def test_adding_a_prompting_baseline_retrains_nothing():
    base = _paper()
    changed = copy.deepcopy(base)
    changed["backbones"]["qwen3_8b"]["prompting"] = ["rag"]
    affected_jobs = _affected(_jobs(base, TARGET), _jobs(changed, TARGET))
    assert affected_jobs == {("aggregate_results", None)}


def test_model_revision_reruns_its_download_and_what_uses_the_model():
    base = _paper()
    changed = copy.deepcopy(base)
    changed["retrieval"]["reranker"]["revision"] = "0" * 40
    rules = {rule for rule, _ in _affected(_jobs(base, TARGET), _jobs(changed, TARGET))}
    assert "download_model" in rules and {"train_policy", "evaluate_policy"} <= rules
    assert not {"build_bm25_index", "normalize_dataset", "mix_training_set"} & rules


# A rename that changes no result: the code of core/text.py's normalize with another local name.
_RENAME = [
    'text = text.lower()\n    text = unicodedata.normalize("NFKD", text).translate(_DELETE)\n'
    '    text = _ARTICLES.sub(" ", text)\n    # str.split()',
    'lowered = text.lower()\n    text = unicodedata.normalize("NFKD", lowered).translate(_DELETE)\n'
    '    text = _ARTICLES.sub(" ", text)\n    # str.split()',
]


def _switched_off_reruns(tmp: Path, off: list[str]) -> tuple[set, set]:
    """Every job, and the jobs the rename reruns once every output was built with the switches
    of ``off`` turned off afterwards (the normal workflow: build, then decide a refactor must not
    rerun the expensive stages)."""
    copy_root = tmp / "repo"
    for part in ("src", "workflow", "config"):
        shutil.copytree(REPO / part, copy_root / part, ignore=shutil.ignore_patterns("__pycache__"))
    after = copy.deepcopy(PAPER)
    after["code_reruns"] = {group: False for group in off}
    spec = {
        "repo": str(copy_root),
        "target": TARGET,
        "config": PAPER,
        "after_config": after,
        "edits": {"rename": ["src/spader/core/text.py", *_RENAME]},
    }
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(copy_root / "src"), XDG_CACHE_HOME=str(tmp / "cache"))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "dag_jobs.py"), str(tmp / "spec.json")],
        cwd=copy_root, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    every_job = {(r, n or None) for r, n in result["all"]}
    return every_job, {(r, n or None) for r, n in result["edits"]["rename"]}


@pytest.mark.slow
def test_a_rename_with_the_switches_off_plans_no_training(tmp_path):
    """With code_reruns off for every stage up to training, a rename in a core module reruns only
    the evaluation stages that run it; with every switch on it would rerun the whole DAG below
    the data (test_code_edit_reruns_exactly_the_stages_that_run_it has the switched-on cases)."""
    every_job, reruns = _switched_off_reruns(tmp_path, ["data", "retrieval", "models", "scorers", "training"])
    assert not {r for r, _ in reruns} & {"train_policy", "export_checkpoint", "normalize_dataset"}
    assert reruns == {job for job in every_job if job[0] in ("evaluate_policy", "aggregate_results")}


def test_planned_code_keeps_what_the_output_was_built_with(tmp_path):
    from spader.infra import integrity
    from spader.infra.stage_code import planned_code

    out = tmp_path / "results" / "x" / "final.json"
    out.parent.mkdir(parents=True)
    out.write_text("{}")
    assert planned_code("new", out, reruns=False) == "new"  # no record yet: the fingerprint
    integrity.write_record(out, producer="train_policy")
    assert planned_code("new", out, reruns=False) == "new"  # a record from before codes were kept
    integrity.annotate([out], code="old")
    assert planned_code("new", out, reruns=False) == "old"
    assert planned_code("new", out, reruns=True) == "new"


def test_evaluation_threads_rerun_nothing_and_set_the_jobs_threads():
    """``evaluation.cpu_threads`` is how many cores a CPU evaluation job takes, not a result
    setting: the demo's evaluations take that many threads, and changing it reruns no job."""
    base = _demo()
    changed = copy.deepcopy(base)
    assert base["evaluation"]["cpu_threads"] == 1  # config/demo.yaml: two jobs at a time on 2 cores
    changed["evaluation"]["cpu_threads"] = 2
    before, after = _jobs(base, "results/demo/f1.tsv"), _jobs(changed, "results/demo/f1.tsv")
    assert _affected(before, after) == set()
    from dag_jobs import _with_dag

    def threads(dag):
        return [job.threads for job in dag.jobs if job.rule.name == "evaluate_policy"]

    assert set(_with_dag(base, "results/demo/f1.tsv", REPO, None, threads)) == {1}
    assert set(_with_dag(changed, "results/demo/f1.tsv", REPO, None, threads)) == {2}
