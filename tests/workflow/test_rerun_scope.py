"""Which jobs a config or file change reruns, for the stages that cannot run here (training).

Snakemake reruns a job when its params or inputs change and then everything downstream. These
tests build the paper DAG through Snakemake's API twice, before and after a change, and check
that the changed jobs plus their descendants are exactly the expected set (the demo rerun tests in
test_demo.py check the same behaviour for real on the CPU stages).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from snakemake.api import SnakemakeApi
from snakemake.settings.enums import Quietness
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

REPO = Path(__file__).resolve().parents[2]


def _jobs(config: dict, target: str) -> dict:
    """{(rule, frozen wildcards): (params repr, input paths, job)} of the whole DAG for ``target``."""
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf_api = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(config=config, replace_workflow_config=True),
            snakefile=REPO / "workflow" / "Snakefile",
            workdir=REPO,
        )
        dag_api = wf_api.dag(DAGSettings(targets={target}, forceall=True))
        wf = dag_api.workflow_api._workflow  # internal, pinned snakemake 9.27.1 (as printdag does)
        wf._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
        wf._build_dag()
        dag = wf.dag
        out = {}
        for job in dag.jobs:
            key = (job.rule.name, tuple(sorted(job.wildcards_dict.items())))
            params = repr(sorted((k, repr(v)) for k, v in job.params.items()))
            deps = {(d.rule.name, tuple(sorted(d.wildcards_dict.items()))) for d in dag.dependencies[job]}
            out[key] = (params, tuple(sorted(map(str, job.input))), deps)
        return out


def _affected(before: dict, after: dict, changed_input: str | None = None) -> set:
    changed = {k for k in after if k not in before or before[k][0] != after[k][0]}
    if changed_input:
        changed |= {k for k, v in after.items() if changed_input in v[1]}
    grew = True
    while grew:
        grew = False
        for k, (_, _, deps) in after.items():
            if k not in changed and deps & changed:
                changed.add(k)
                grew = True
    return {
        (rule, dict(wc).get("variant") or dict(wc).get("method") or dict(wc).get("dataset"))
        for rule, wc in changed
    }


def _paper() -> dict:
    with open(REPO / "config" / "config.yaml") as f:
        return yaml.safe_load(f)


TARGET = "results/qwen3_8b/f1.tsv"
DATASETS = ("qampari", "mintaka", "webqsp", "quest")


def test_variant_hyperparameter_reruns_only_that_variant():
    base = _paper()
    changed = copy.deepcopy(base)
    changed["variants"]["no_np"]["cost"] = 0.02
    affected = _affected(_jobs(base, TARGET), _jobs(changed, TARGET))
    expected = {("train_policy", "no_np"), ("export_checkpoint", "no_np"), ("aggregate_results", None)}
    expected |= {("evaluate_policy", "no_np")}
    assert affected == expected


def test_variant_yaml_edit_reruns_only_variants_built_on_it():
    jobs = _jobs(_paper(), TARGET)
    affected = _affected(jobs, jobs, changed_input="config/verl/beta_8.yaml")
    assert {a for a in affected if a[0] == "train_policy"} == {("train_policy", "beta_8")}
    spader_children = {
        a[1]
        for a in _affected(jobs, jobs, changed_input="config/verl/spader_base.yaml")
        if a[0] == "train_policy"
    }
    assert {"spader", "no_spa", "no_np", "no_ig", "beta_0", "beta_1", "beta_4", "beta_8"} <= spader_children
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
