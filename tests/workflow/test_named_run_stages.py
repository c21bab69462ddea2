"""A named run shares a stage with the default run only when every setting the stage depends on is
the default run's: a key that the rerun table (spader.infra.rerun_keys.TABLE) says reruns a shared
stage gives the run its own copy of that stage, and of every shared stage that reads it, in
results/runs/<run>/ (spader.infra.named_runs).

The walk changes every key of the model that a shared stage depends on, in a named run overlaying
the paper's config and in one overlaying the demo's, and builds the dry run's DAG through
Snakemake's API. Keys are changed several at a time (one valid config, no two changes in one
branch of the config tree): one DAG per batch keeps the walk to seconds. The workflow names, for
each stage it builds itself, the keys that made it its own (OWN_STAGES, what its start-up line
says), so each key of a batch is checked by name; the DAG is checked whole: a job of an own stage
writes in the run's directory, every other shared job in the default run's, and no shared job
reads an own job's output. A key whose stage the batch's other changes took out of the DAG (a
prebuilt index, another backbone) is planned again alone.
"""

from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path

import yaml
from pydantic import ValidationError
from rerun_walk import _differing, changes, concrete, configs, get, model_keys, prepare_files, put, typed
from snakemake.api import SnakemakeApi
from snakemake.settings.enums import Quietness
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

from spader.config import verl_config_dir
from spader.config.model import Config
from spader.infra import rerun_keys
from spader.infra.named_runs import SHARED_STAGES

REPO = Path(__file__).resolve().parents[2]
SHARED = "../../../"
VERL = verl_config_dir(REPO)
BATCH = 24  # changes per DAG at most


def _stages_of(pattern: str) -> set[str]:
    row = rerun_keys.entry(pattern)
    return (set(row.paper or ()) | set(row.demo or ())) & SHARED_STAGES.keys()


#: every key of the model that a shared stage depends on, by the rerun table
KEYS = [k for k in model_keys() if _stages_of(k)]


@contextlib.contextmanager
def _kept_cwd():
    cwd = os.getcwd()
    try:
        yield
    finally:
        os.chdir(cwd)


def named_dag(base: list[Path], named: dict, workdir: Path) -> tuple[dict, list[tuple[str, list, set]]]:
    """The dry run of ``named`` (a whole config, its ``run`` set) over the default run's config
    files ``base``: ``(OWN_STAGES, [(rule, outputs, rules of the jobs it reads)])``."""
    workdir.mkdir(parents=True, exist_ok=True)
    prepare_files(workdir)  # the files the changed values name (elsewhere/...)
    overlay = workdir / f"named-{len(list(workdir.glob('named-*.yaml')))}.yaml"
    overlay.write_text(yaml.safe_dump(named))
    with _kept_cwd(), SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf_api = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(configfiles=[*base, overlay]),
            snakefile=REPO / "workflow" / "Snakefile",
            workdir=workdir,
        )
        dag_api = wf_api.dag(DAGSettings(targets={"all"}, forceall=True))
        wf = dag_api.workflow_api._workflow  # internal, pinned snakemake 9.27.1 (as dag_jobs.py)
        wf._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
        wf._build_dag()
        jobs = [
            (job.rule.name, [str(f) for f in job.output], {d.rule.name for d in wf.dag.dependencies[job]})
            for job in wf.dag.jobs
        ]
        return dict(wf.globals["OWN_STAGES"]), jobs


def check_dag(own: dict, jobs: list[tuple[str, list, set]]) -> dict[str, set[str]]:
    """Every shared stage's job writes where OWN_STAGES says, no other job writes in the default
    run's directory, and no shared job reads an own one. Returns the shared stages in the DAG,
    each with the shared stages it reads."""
    stages: dict[str, set[str]] = {}
    for rule, outputs, reads in jobs:
        is_own = rule not in SHARED_STAGES or rule in own
        assert all(o.startswith(SHARED) != is_own for o in outputs), (rule, outputs, own.get(rule))
        if not is_own:
            assert not reads & own.keys(), (
                f"the shared {rule} reads the run's own {sorted(reads & own.keys())}"
            )
        if rule in SHARED_STAGES:
            stages.setdefault(rule, set()).update(reads & SHARED_STAGES.keys())
    return stages


def downstream(stages: set[str], dag: dict[str, set[str]]) -> set[str]:
    """``stages`` and every shared stage of ``dag`` that reads one of them, directly or not."""
    out = set(stages)
    while grown := {s for s, reads in dag.items() if reads & out} - out:
        out |= grown
    return out


def _valid(config: dict) -> bool:
    """Whether the typed model takes ``config`` (the workflow's check without its schema pass,
    which the model generates: a third of the time)."""
    try:
        Config.model_validate(copy.deepcopy(config), context={"verl_config_dir": VERL, "check_paths": True})
    except ValidationError:
        return False
    return True


def batches(config: dict) -> list[list[tuple[str, str, dict]]]:
    """The changes of :data:`KEYS` in ``config`` (typed), grouped first fit: ``[(model key, the
    key changed, dotted; the changed config)]`` per batch; a batch merges into one valid config,
    with no two changes in one branch of the config tree."""
    groups: list[tuple[list, list, dict]] = []  # (changes, keys touched, merged config)
    for pattern, key, changed in changes(config, KEYS):
        if not _valid(changed):  # a change this config cannot take alone (a hub model warm-started)
            continue
        diff = list(_differing(config, changed))
        item = (pattern, ".".join(key), changed)
        for items, touched, merged in groups:
            if len(items) >= BATCH or any(
                a[: len(b)] == b or b[: len(a)] == a for a in diff for b in touched
            ):
                continue
            candidate = _with(merged, changed, diff)
            if not _valid(candidate):
                continue
            items.append(item)
            touched += diff
            merged.clear()
            merged.update(candidate)
            break
        else:
            groups.append(([item], diff, _with(config, changed, diff)))
    return [items for items, _, _ in groups]


def _with(config: dict, changed: dict, keys: list) -> dict:
    """``config`` with ``changed``'s values of ``keys`` (what a clash would break: never used)."""
    out = copy.deepcopy(config)
    with contextlib.suppress(TypeError, KeyError):
        for k in keys:
            put(out, k, get(changed, k))
    return out


def merged_config(config: dict, batch: list) -> dict:
    merged = copy.deepcopy(config)
    for _, _, changed in batch:
        merged = _with(merged, changed, list(_differing(config, changed)))
    return {**merged, "run": "probe"}


def plan_batch(base: list[Path], config: dict, batch: list, workdir: Path, default_dag: dict) -> list:
    """Plan ``batch`` at once and check it: each key makes the stages its row names and every
    stage the DAG has reading them the run's own, naming the key. Returns its changes whose
    stages the other changes took out of the DAG (a prebuilt index drops the index build), to be
    planned again."""
    own, jobs = named_dag(base, merged_config(config, batch), workdir)
    dag = check_dag(own, jobs)
    hidden = []
    for pattern, dotted, changed in batch:
        stages = _stages_of(pattern)
        for stage in downstream(stages, default_dag) | downstream(stages, dag):
            assert dotted in own.get(stage, []), f"{dotted} changed: {stage} is not the run's own for it"
        if (stages & default_dag.keys()) - dag.keys():
            hidden.append((pattern, dotted, changed))
    return hidden


def walk(name: str, root: Path) -> tuple[set[str], int]:
    """Walk :data:`KEYS` on the named run over config ``name``; ``(the model keys walked, DAGs)``."""
    raw = configs()[name]
    base = [root / "default.yaml"]  # the default run's files: config/config.yaml and this overlay
    root.mkdir(parents=True, exist_ok=True)
    base[0].write_text(yaml.safe_dump(raw))
    config = typed(raw)
    own, jobs = named_dag(base, {**config, "run": "probe"}, root / "same")
    assert own == {}, f"a named run changing nothing shares every stage, not {own}"
    default_dag = check_dag(own, jobs)
    todo = batches(config)
    walked = {pattern for batch in todo for pattern, _, _ in batch}
    dags = 0
    while todo:
        batch = todo.pop()
        dags += 1
        hidden = plan_batch(base, config, batch, root / f"dag{dags}", default_dag)
        assert not hidden or len(batch) > 1, f"{hidden[0][1]} changed alone: its own stages are not planned"
        # what another change hid is planned again: together when they were not all hidden, else alone
        if hidden:
            todo += [hidden] if len(hidden) < len(batch) else [[item] for item in hidden]
    return walked, dags


def test_every_key_a_shared_stage_depends_on_gives_the_run_its_own_copy(tmp_path):
    paper, paper_dags = walk("paper", tmp_path / "paper")
    demo, demo_dags = walk("demo", tmp_path / "demo")
    print(
        f"walked {len(paper)} keys on the paper's config in {paper_dags} DAGs, {len(demo)} on the demo's in {demo_dags}"
    )
    assert len(KEYS) > 100  # read from the model and the table, not a list of the test's own
    held = {k for k in KEYS if any(concrete(k, typed(c)) for c in configs().values())}
    assert held == paper | demo, sorted(held - paper - demo)
    # a key neither config holds (the hub location's parts of a release other than the demo's
    # QUEST train file) is in a row with one that is walked
    assert {id(rerun_keys.entry(k)) for k in KEYS} == {id(rerun_keys.entry(k)) for k in held}
