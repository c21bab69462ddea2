"""Which jobs every config key reruns, as Snakemake plans it against a finished run.

A *finished state* is a working directory where every job of a config's DAG has its outputs and
Snakemake's own metadata record (``.snakemake/metadata``, written by Snakemake's persistence as
after a real run, input checksums and params included), which stands in for a run that cannot
happen here (training needs GPUs). :func:`plan` asks Snakemake, through its API, which jobs it
would run for a changed config in that directory, with the project's rerun triggers
(``profiles/default/config.yaml``): the same planning a ``snakemake --dry-run`` does, without a
process start per question.

:func:`walk` changes one key of the typed model (:mod:`spader.config.model`) at a time to another
valid value (:func:`changes`) and records the rules of the planned jobs. Keys that
:mod:`spader.infra.rerun_keys` says rerun nothing are changed together in one plan (when that plan is
empty, so is each of theirs; when it is not, they are planned one by one to name the culprit).

Run as a script (``python rerun_walk.py OUT.json WORKDIR``) it walks the paper's config
(:func:`paper_keys`) and the demo's (:func:`demo_keys`) and writes what each key planned.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import sys
import time
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from snakemake.api import SnakemakeApi
from snakemake.settings.enums import Quietness, RerunTrigger
from snakemake.settings.types import (
    ConfigSettings,
    DAGSettings,
    ExecutionSettings,
    OutputSettings,
    ResourceSettings,
)

REPO = Path(__file__).resolve().parents[2]
#: a job as ``(rule, sorted wildcards)``
Job = tuple[str, tuple[tuple[str, str], ...]]


def profile_triggers(repo: Path = REPO) -> frozenset[RerunTrigger]:
    """The rerun triggers of the workflow's default profile (what every ``snakemake`` run uses)."""
    profile = yaml.safe_load((repo / "profiles" / "default" / "config.yaml").read_text())
    return frozenset(RerunTrigger.parse_choices_set(profile["rerun-triggers"]))


def _config_settings(config: dict, workdir: Path) -> ConfigSettings:
    """``config`` as the workflow's whole config; a named run (``run`` set) as a file naming the
    run over a file of the rest, as `--configfile` gives it: the default run it shares stages with
    is made of the files before the one naming it (spader.infra.named_runs)."""
    if not config.get("run"):
        return ConfigSettings(config=config, replace_workflow_config=True)
    workdir.mkdir(parents=True, exist_ok=True)
    default, named = workdir / "walk-default.yaml", workdir / "walk-run.yaml"
    default.write_text(yaml.safe_dump({**config, "run": None}))
    named.write_text(yaml.safe_dump({"run": config["run"]}))
    return ConfigSettings(configfiles=[default, named], replace_workflow_config=True)


def _with_workflow(
    config: dict, workdir: Path, visit: Callable, *, forceall: bool, repo: Path = REPO, target: str = "all"
):
    """Parse the workflow for ``config`` in ``workdir``, build its DAG and return ``visit(workflow)``."""
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf_api = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=_config_settings(config, workdir),
            snakefile=repo / "workflow" / "Snakefile",
            workdir=workdir,
        )
        dag_api = wf_api.dag(
            DAGSettings(targets={target}, forceall=forceall, rerun_triggers=profile_triggers(repo))
        )
        # internal, pinned snakemake 9.27.1 (as tests/support/dag_jobs.py)
        wf = dag_api.workflow_api._workflow
        wf._prepare_dag(forceall=forceall, ignore_incomplete=True, lock_warn_only=True, nolock=True)
        wf._build_dag()
        return visit(wf)


def _job_key(job) -> Job:
    return job.rule.name, tuple(sorted((k, str(v)) for k, v in job.wildcards_dict.items()))


def finish(config: dict, workdir: Path, *, repo: Path = REPO) -> int:
    """Make ``workdir`` the finished state of ``config``: every job's outputs exist, newer than its
    inputs, and Snakemake records the job as finished (its params, input set and input checksums).
    Returns the number of jobs."""
    workdir.mkdir(parents=True, exist_ok=True)

    def visit(wf) -> int:
        wf.execution_settings = ExecutionSettings()  # what `finished` reads (keep_metadata)
        start = time.time() - 3600
        n = 0
        for depth, level in enumerate(wf.dag.toposorted()):
            for job in level:
                if job.rule.norun:
                    continue
                for f in job.output:
                    path = Path(f)
                    if f.is_directory:
                        path.mkdir(parents=True, exist_ok=True)
                        (path / "stand-in").write_text("stand-in output\n")
                    else:
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_text("stand-in output\n")
                    os.utime(path, (start + depth, start + depth))
                asyncio.run(wf.persistence.finished(job))
                n += 1
        return n

    return _with_workflow(config, workdir, visit, forceall=True, repo=repo)


PLANS = [0]  # how many plans this process made


def plan(config: dict, workdir: Path, *, repo: Path = REPO) -> set[Job]:
    """The jobs Snakemake would run for ``config`` in the finished state ``workdir``."""
    PLANS[0] += 1

    def visit(wf) -> set[Job]:
        return {_job_key(j) for j in wf.dag.needrun_jobs() if not j.rule.norun}

    return _with_workflow(config, workdir, visit, forceall=False, repo=repo)


# --- the keys of the typed model ---------------------------------------------------------------


def _sections(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return []


def model_keys(model: type[BaseModel] | None = None, prefix: str = "") -> Iterator[str]:
    """Every leaf of the typed model, dotted, ``*`` standing for a name the user chooses
    (``variants.*.beta``). An optional section (``warmstart``, ``cost_warmup``, ``hub``) is a key
    of its own (set or null) besides its leaves."""
    if model is None:
        from spader.config.model import Config

        model = Config
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:
            value = typing.get_args(annotation)[1]
            if _sections(value):
                yield from model_keys(_sections(value)[0], f"{key}.*.")
                continue
        sections = _sections(annotation)
        if sections:
            if type(None) in typing.get_args(annotation):
                yield key
            yield from model_keys(sections[0], f"{key}.")
        else:
            yield key


def _holds_list(annotation: Any) -> bool:
    """Whether a value of ``annotation`` can be a list (or tuple or set), alone or inside a union
    or a map."""
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple, set, frozenset):
        return True
    return any(_holds_list(a) for a in typing.get_args(annotation) if not isinstance(a, str | int))


def list_keys(model: type[BaseModel] | None = None) -> list[str]:
    """The keys of the typed model (as :func:`model_keys` names them) whose value can be a list."""
    return [key for key in model_keys(model) if _holds_list(_field(key, model).annotation)]


Key = tuple[str, ...]  # a concrete key by its parts (release file names hold dots)


def _parts(key: str | Key) -> Key:
    return tuple(key.split(".")) if isinstance(key, str) else tuple(key)


def get(config: dict, key: str | Key) -> Any:
    node = config
    for part in _parts(key):
        node = node[part]
    return node


def put(config: dict, key: str | Key, value: Any) -> None:
    *parents, last = _parts(key)
    node = config
    for part in parents:  # a choices-only config file leaves out sections it keeps at their defaults
        node = node.setdefault(part, {})
    node[last] = value


def typed(config: dict) -> dict:
    """The config with every default filled in (the typed model's values)."""
    from spader.config import check_config, verl_config_dir

    return check_config(config, verl_config_dir=verl_config_dir(REPO)).model_dump(mode="json")


def read_config(*names: str) -> dict:
    """``config/config.yaml`` overlaid with ``config/<name>`` files, as ``--configfile`` does."""
    from spader.infra.glue import overlay

    config: dict = {}
    for name in ("config.yaml", *names):
        config = overlay(config, yaml.safe_load((REPO / "config" / name).read_text()) or {})
    return config


def _other_number(value: float | int, field) -> float | int:
    """The first of a few nearby numbers that differs from ``value`` and lies within the field's
    bounds (zero avoided: it often means "off")."""
    bounds = {type(m).__name__: m for m in field.metadata}
    if isinstance(value, bool):
        raise TypeError(value)

    def allowed(new: float) -> bool:
        return (
            new != value
            and new != 0
            and ("Ge" not in bounds or new >= bounds["Ge"].ge)
            and ("Gt" not in bounds or new > bounds["Gt"].gt)
            and ("Le" not in bounds or new <= bounds["Le"].le)
            and ("Lt" not in bounds or new < bounds["Lt"].lt)
        )

    if isinstance(value, int):
        candidates: list[float] = [value + 1, value - 1, value + 2]
    else:
        candidates = [value * 1.5, value / 2, value + 0.5, value - 0.5, 0.5, 0.25]
    return next(new for new in candidates if allowed(new))


def _field(key: str, root: type[BaseModel] | None = None):
    """The pydantic field of a dotted key (``*`` parts are the values of a map) of ``root``
    (default: the config model)."""
    from spader.config.model import Config

    model: Any = root or Config
    field = None
    for part in key.split("."):
        if part == "*":
            continue
        field = model.model_fields[part]
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:
            value = typing.get_args(annotation)[1]
            model = _sections(value)[0] if _sections(value) else None
        else:
            model = _sections(annotation)[0] if _sections(annotation) else None
    return field


def generic_value(key: str, value: Any) -> Any:
    """Another valid value of ``key`` by its type: a flipped bool, the next number within its
    bounds, another literal; None for what needs a chosen value (:data:`VALUES`)."""
    field = _field(key)
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float) and value is not None:
        return _other_number(value, field)
    literal = next((a for a in [annotation, *args] if typing.get_origin(a) is typing.Literal), None)
    if literal is not None and not isinstance(value, list):
        return next(c for c in typing.get_args(literal) if c != value)
    return None


#: The variant whose key is changed for ``variants.*.<field>``: one whose training reads the field
#: and that shares its training run with no other variant.
VARIANT_FOR = {"lambda_s": "stepsearch", "judge": "r3rag", "advantage": "grpo", "reward": "ppo"}

#: New values where the type alone does not give a valid one (names, paths, lists); a function of
#: the config and the walked key gives ``{key: value}`` of every key it changes, where a key can
#: only change together with another.
VALUES: dict[str, Any] = {
    "suite": "other",
    "run": "other",
    "targets": lambda c, k: {"targets": c["targets"][:1]},
    "mlflow.tracking_uri": "sqlite:///results/mlflow/other.db",
    "mlflow.experiment": "other",
    "mlflow.artifact_root": "results/mlflow/other",
    "mlflow.state_dir": "results/mlflow/other",
    "corpus.url": "https://example.org/chunked_wikipedia.tar.gz",
    "corpus.sha256": "0" * 64,
    "corpus.size_bytes": 1000,
    "corpus.archive": "elsewhere/chunked_wikipedia.tar.gz",
    "corpus.prebuilt_index": "elsewhere/bm25",
    "corpus.expected_documents": 1000,
    "retrieval.reranker.model": "BAAI/bge-reranker-base",
    "retrieval.reranker.revision": "1" * 40,
    "retrieval.reranker.max_batch_tokens": 4096,
    "retrieval.reranker.devices": ["cpu"],
    "retrieval.service.host": "127.0.0.2",
    "datasets.*.files.*.url": "https://example.org/other-release",
    "datasets.*.files.*.hub": {"repo_id": "example/other", "filename": "release.json"},
    "datasets.*.files.*.hub.repo_id": "example/other",
    "datasets.*.files.*.hub.filename": "other.jsonl",
    "datasets.*.files.*.hub.revision": "v2",
    "datasets.*.files.*.hub.split": "train",
    "datasets.*.files.*.hub.local_dir": "elsewhere/hub",
    "datasets.*.splits.*.member": "other/member.json",
    "datasets.*.splits.*.file": lambda c, k: _other_release(c, k),
    "mix.max_answers": 10,
    "mix.eval_limit": 7,
    "backbones.*.model": "Qwen/Qwen3-8B-Base",
    "backbones.*.revision": "2" * 40,
    # twice the GPUs: verl splits a mini-batch's 32 x 16 trajectories over 16; R3-RAG's judge of 4
    # would leave it 12, which do not divide them, so that backbone no longer trains R3-RAG
    "backbones.*.gpus": lambda c, k: {
        k: 16,
        (*k[:-1], "variants"): [v for v in get(c, (*k[:-1], "variants")) if v != "r3rag"],
    },
    "backbones.*.variants": lambda c, k: {k: get(c, k)[:-1]},
    "backbones.*.prompting": ["rag"],
    "backbones.*.max_context_tokens": 4096,
    "variants.*.verl_config": "grpo",  # another method's YAML (the variant's own is its method's)
    "variants.*.table": "beta_sweep",
    "variants.*.label": "SPADER (ours)",
    "variants.*.nodes": 2,
    "training.kl_loss_type": "kl",
    "training.max_steps": 7,
    "training.ppo_mini_batch_size": 16,  # the next number would exceed the batch (32)
    "training.train_batch_size": 64,  # whole mini-batches of 32
    "training.ppo_micro_batch_size_per_gpu": 8,  # divides a mini-batch's 64 trajectories per GPU
    "training.max_actor_ckpt_to_keep": 3,
    "training.max_critic_ckpt_to_keep": 3,
    "training.device": lambda c, k: {
        "training.device": "cpu" if c["training"]["device"] == "cuda" else "cuda",
        "training.rollout_backend": "transformers" if c["training"]["device"] == "cuda" else "sglang",
    },
    "training.rollout_backend": lambda c, k: {
        "training.rollout_backend": "transformers" if c["training"]["device"] == "cuda" else "sglang",
        "training.device": "cpu" if c["training"]["device"] == "cuda" else "cuda",
    },
    "training.max_token_len_per_gpu": lambda c, k: {
        "training.remove_padding": True,
        "training.max_token_len_per_gpu": 2
        * (c["training"]["max_prompt_length"] + c["training"]["max_response_length"]),
    },
    "training.divergences.cost_warmup": {"free_steps": 10, "ramp_steps": 10},
    "training.time_limit.hours": lambda c, k: {
        "training.time_limit.hours": {**c["training"]["time_limit"]["hours"], "default": 41.0}
    },
    "agent.max_turn_tokens": 64,
    "agent.stop": ["</answer>"],
    "agent.prompt_template": "elsewhere/prompt.txt",
    "evaluation.max_context_tokens": 4096,
    "evaluation.max_response_tokens": 4096,
    "evaluation.max_turn_tokens": 512,
    "evaluation.topics": "resources/demo/topics.tsv",
    "evaluation.seeds": lambda c, k: {
        "evaluation.seeds": [0, 1],
        **({"evaluation.temperature": 1.0} if c["evaluation"]["temperature"] == 0 else {}),
    },
    "judge.model": "Qwen/Qwen2.5-7B-Instruct",
    "judge.revision": "3" * 40,
    "judge.url": "http://127.0.0.1:30000/v1",
    "hardware.calibration": "elsewhere/calibration.yaml",
    "judge.gpus": 6,  # 2 GPUs left to verl on an 8-GPU node, which divide 32 x 16
    # grpo: PPO's advantage on the terminal reward, keeping GRPO's YAML (no critic): with its
    # method's YAML it would be `ppo` itself, whose training run it would then share
    "variants.*.advantage": lambda c, k: {k: "gae", (*k[:-1], "verl_config"): "grpo"},
    # ppo: GAE on StepSearch's rewards, keeping PPO's YAML (with its method's it would be `stepsearch`)
    "variants.*.reward": lambda c, k: {k: "stepsearch", (*k[:-1], "verl_config"): "ppo"},
}


def _other_release(config: dict, key: Key) -> dict:
    """A split's file changed to a release file added to its dataset."""
    return {
        ("datasets", key[1], "files", "other.zip"): {"url": "https://example.org/other.zip", "hub": None},
        key: "other.zip",
    }


def concrete(pattern: str, config: dict) -> Key | None:
    """The key of ``config`` that stands for ``pattern`` (None: the config has none)."""
    parts = pattern.split(".")
    out = []
    node: Any = config
    for i, part in enumerate(parts):
        if part == "*":
            if not isinstance(node, dict) or not node:
                return None
            if parts[i - 1] == "backbones":
                part = config["targets"][0]
            elif parts[i - 1] == "variants":
                part = VARIANT_FOR.get(parts[i + 1], "no_ig")
            else:
                part = next(iter(node))
        if not isinstance(node, dict) or part not in node:
            return None
        out.append(part)
        node = node[part]
    return tuple(out)


def _spec_of(pattern: str) -> Any:
    if pattern in VALUES:
        return VALUES[pattern]
    for other, spec in VALUES.items():
        if "*" in other and len(other.split(".")) == len(pattern.split(".")):
            if all(
                a == b or a == "*" or b == "*"
                for a, b in zip(other.split("."), pattern.split("."), strict=True)
            ):
                return spec
    return None


def change(config: dict, pattern: str) -> tuple[Key, dict] | None:
    """``(the key changed, the changed config)`` for one key of the model, or None when
    ``config`` has no such key (an optional section that is null, a map without entries)."""
    key = concrete(pattern, config)
    if key is None:
        return None
    spec = _spec_of(pattern)
    changed = copy.deepcopy(config)
    if callable(spec):
        for dotted, value in spec(config, key).items():
            put(changed, dotted, value)
        return key, changed
    old = get(config, key)
    value = spec if spec is not None else generic_value(pattern, old)
    if value is None or value == old:
        raise ValueError(f"no other value for config key '{'.'.join(key)}' ({old!r}): add one to VALUES")
    put(changed, key, value)
    return key, changed


def sets_reordered(config: dict) -> dict:
    """``config`` with every list that ``spader.infra.rerun_keys.LISTS`` calls a set reversed and its
    first item repeated (the same run)."""
    from spader.infra import rerun_keys

    out = copy.deepcopy(config)
    for pattern in list_keys():
        if rerun_keys.list_kind(pattern) != rerun_keys.SET:
            continue
        for key in _instances(pattern, out):
            items = get(out, key)
            if items:
                put(out, key, [*reversed(items), items[0]])
    return out


def _instances(pattern: str, config: dict) -> list[Key]:
    """The concrete keys of ``config`` that ``pattern`` (with ``*`` for a map's names) names."""
    keys: list[Key] = [()]
    for part in pattern.split("."):
        nxt = []
        for key in keys:
            node = get(config, key) if key else config
            if not isinstance(node, dict):
                continue
            nxt += [(*key, name) for name in node] if part == "*" else [(*key, part)] if part in node else []
        keys = nxt
    return keys


def _optional_section(pattern: str) -> bool:
    field = _field(pattern)
    return bool(_sections(field.annotation)) and type(None) in typing.get_args(field.annotation)


def changes(config: dict, keys: list[str] | None = None) -> Iterator[tuple[str, Key, dict]]:
    """``(model key, concrete key, changed config)`` for every key of the model that ``config``
    has, each changed alone (with its partner where it cannot change alone)."""
    for pattern in keys if keys is not None else list(model_keys()):
        key = concrete(pattern, config)
        if key is None:
            continue
        if _optional_section(pattern) and get(config, key) is not None:
            changed = copy.deepcopy(config)
            put(changed, key, None)
            yield pattern, key, changed
            continue
        result = change(config, pattern)
        if result is not None:
            yield pattern, *result


def prepare_files(workdir: Path) -> None:
    """The files the changed values name (an archive, an index, a prompt template, a calibration
    record elsewhere)."""
    from spader.core.prompt import DEFAULT_TEMPLATE_PATH
    from spader.planning.calibration import KIND

    (workdir / "elsewhere" / "bm25").mkdir(parents=True, exist_ok=True)
    (workdir / "elsewhere" / "chunked_wikipedia.tar.gz").write_text("stand-in archive\n")
    (workdir / "elsewhere" / "prompt.txt").write_text(DEFAULT_TEMPLATE_PATH.read_text(encoding="utf-8"))
    (workdir / "elsewhere" / "calibration.yaml").write_text(yaml.safe_dump({"kind": KIND, "shapes": []}))


def _rules(jobs: set[Job]) -> list[str]:
    return sorted({rule for rule, _ in jobs})


def walk(
    config: dict, workdir: Path, *, neutral: Callable[[str], bool] = lambda key: False, keys=None
) -> tuple[dict[str, list[str]], dict[str, list[Job]], dict[str, str]]:
    """Plan every key change of ``config`` against its finished state in ``workdir``.

    Args:
        config: the finished run's config, as its files state it (:func:`read_config`).
        workdir: where the finished state is made (empty or missing).
        neutral: keys expected to rerun nothing; they are planned together first.
        keys: model keys to walk (default: all).
    Returns:
        ``({model key: rules of the planned jobs}, {model key: the planned jobs}, {model key: the
        key of ``config`` changed for it})``.
    Raises:
        AssertionError: the finished state plans jobs as it is, or with every default restated.
    """
    finish(config, workdir)
    prepare_files(workdir)
    if plan(config, workdir):
        raise AssertionError("the finished state plans jobs before any change")
    restated = typed(config)  # every key stated, each value in its type (4 -> 4.0)
    if plan(restated, workdir):
        raise AssertionError(f"restating every value in effect plans {sorted(plan(restated, workdir))}")
    reordered = sets_reordered(restated)  # every list that is a set, reversed and with a repeat
    if plan(reordered, workdir):
        raise AssertionError(f"reordering the set lists plans {sorted(plan(reordered, workdir))}")
    todo = list(changes(restated, keys))
    walked = {pattern: ".".join(key) for pattern, key, _ in todo}
    rules: dict[str, list[str]] = {}
    jobs: dict[str, list[Job]] = {}
    together = [(p, c) for p, _, c in todo if neutral(p)]
    if together:
        merged = copy.deepcopy(restated)
        for _, changed in together:
            for key in _differing(restated, changed):
                put(merged, key, get(changed, key))
        typed(merged)  # every change at once is still a valid config
        if not plan(merged, workdir):
            rules.update({p: [] for p, _ in together})
            jobs.update({p: [] for p, _ in together})
            todo = [t for t in todo if not neutral(t[0])]
    for pattern, _key, changed in todo:  # the workflow checks each config as it parses it
        planned = plan(changed, workdir)
        rules[pattern], jobs[pattern] = _rules(planned), sorted(planned)
    return rules, jobs, walked


#: Optional sections that both the paper and the demo leave null, set in the demo's walk so that
#: their keys are walked too: the authors' tool-cost warm-up, a release file from the hub.
DEMO_EXTRAS: dict[Key, Any] = {
    ("training", "divergences", "cost_warmup"): {"free_steps": 100, "ramp_steps": 100},
    ("datasets", "quest", "files", "train_aug.jsonl"): {
        "url": None,
        "hub": {
            "repo_id": "cmalaviya/quest",
            "filename": "train_aug.jsonl",
            "local_dir": "resources/demo/quest",
        },
    },
}


def configs() -> dict[str, dict]:
    """The walked configs: the paper's, and the demo's with :data:`DEMO_EXTRAS`."""
    demo = read_config("demo.yaml")
    for key, value in DEMO_EXTRAS.items():
        put(demo, key, value)
    return {"paper": read_config(), "demo": demo}


def _differing(a: Any, b: Any, prefix: Key = ()) -> Iterator[Key]:
    """Keys whose values differ between two configs (a map with other keys counts whole)."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for k in a:
            yield from _differing(a[k], b[k], (*prefix, k))
    elif a != b:
        yield prefix


@contextlib.contextmanager
def _kept_cwd():
    cwd = os.getcwd()
    try:
        yield
    finally:
        os.chdir(cwd)


def paper_keys() -> list[str]:
    """The keys walked on the paper's config: every one it has."""
    from spader.infra import rerun_keys

    return [k for k in model_keys() if rerun_keys.walked_on_paper(k)]


def demo_keys() -> list[str]:
    """The keys walked on the demo's config: those of the rows the paper has not (the warm start,
    the optional sections), and one key of every other row with a demo column (its rule takes
    the row's keys alike, and the paper's walk changes each of them)."""
    from spader.infra import rerun_keys

    keys, rows = [], set()
    for key in model_keys():
        row = rerun_keys.entry(key)
        if not rerun_keys.walked_on_demo(key) or (row.paper is not None and id(row) in rows):
            continue
        rows.add(id(row))
        keys.append(key)
    return keys


def main(out: str, workroot: str, *names: str) -> None:
    """Walk the configs (``names``, default both); write ``{"paper": {key: rules}, "paper_jobs":
    {key: jobs}, "paper_keys": {key: the key changed}, "demo": ..., "seconds": ..., ...}``."""
    from spader.infra import rerun_keys

    started, cpu = time.monotonic(), time.process_time()
    result: dict[str, Any] = {}
    with _kept_cwd():
        for name, config in configs().items():
            if names and name not in names:
                continue
            keys = paper_keys() if name == "paper" else demo_keys()
            rules, jobs, walked = walk(
                config, Path(workroot) / name, neutral=rerun_keys.reruns_nothing, keys=keys
            )
            result[name], result[f"{name}_jobs"], result[f"{name}_keys"] = rules, jobs, walked
    result["seconds"] = time.monotonic() - started
    result["cpu_seconds"] = time.process_time() - cpu
    result["plans"] = PLANS[0]
    Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
