"""One source of defaults: the shipped config files hold choices only, the settings objects have no
defaults of their own, and no code falls back to a literal for a config key."""

from __future__ import annotations

import ast
import dataclasses
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from spader.config import Config, merge_files, resolved_config

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "config" / "config.yaml"
DEMO = REPO / "config" / "demo.yaml"

#: Keys shown although they restate a default: choices a user must see (free names as <name>).
SHOWN = {
    "suite": "where the data stages write (resources/<suite>/, results/<suite>/); the demo changes it",
    "backbones.<name>.gpus": "GPUs of a training job's node, which a cluster must match",
    "hardware.gpu_memory_gib": "the GPUs the memory plan is made for, which a user on other GPUs sets",
}


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _free_map(annotation: Any) -> type[BaseModel] | None:
    """The model of a ``dict[str, Model]`` field (a map with free keys), else None."""
    if typing.get_origin(annotation) is dict:
        models = _models(typing.get_args(annotation)[1])
        return models[0] if models else None
    return None


def _default(field) -> Any:
    """A field's default as the config holds it (MISSING for a required field)."""
    default = dataclasses.MISSING if field.is_required() else field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return default.model_dump(mode="json")
    if isinstance(default, dict):  # a map whose default holds entries (a dataset's release files)
        return {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in default.items()}
    return default


def _leaves(
    model: type[BaseModel], raw: Mapping[str, Any], path: str = "", key: str = "", defaults: Any = None
) -> Iterator:
    """``(dotted path, generic key, value, model default or MISSING)`` of every value ``raw`` sets;
    ``defaults``: the values the enclosing section's default gives its keys (a dataset's release
    files and splits, from the registry), which win over the keys' own."""
    defaults = defaults if isinstance(defaults, Mapping) else {}
    for name, value in raw.items():
        field = model.model_fields.get(name)
        dotted, generic = f"{path}{name}", f"{key}{name}"
        if field is None:
            continue
        default = defaults[name] if name in defaults else _default(field)
        sub, free = _models(field.annotation), _free_map(field.annotation)
        if free is not None and isinstance(value, Mapping):
            given = default if isinstance(default, Mapping) else {}
            for item, spec in value.items():
                if isinstance(spec, Mapping):
                    yield from _leaves(free, spec, f"{dotted}.{item}.", f"{generic}.<name>.", given.get(item))
            continue
        if sub and isinstance(value, Mapping):
            yield from _leaves(sub[0], value, f"{dotted}.", f"{generic}.", default)
            continue
        yield dotted, generic, value, default


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    """The value at ``dotted`` (free names may hold dots, as release files do), or MISSING."""
    node: Any = config
    rest = dotted
    while rest:
        if not isinstance(node, Mapping):
            return dataclasses.MISSING
        key = next(
            (k for k in sorted(node, key=len, reverse=True) if rest == k or rest.startswith(f"{k}.")), None
        )
        if key is None:
            return dataclasses.MISSING
        node, rest = node[key], rest[len(key) + 1 :]
    return node


def restated(raw: Mapping[str, Any], effective: Mapping[str, Any] | None = None) -> list[str]:
    """Keys of ``raw`` whose value equals what is in effect without them: the model's default, or
    for an overlay the value of ``effective`` (the resolved configuration it is laid over)."""
    out = []
    for dotted, generic, value, default in _leaves(Config, raw):
        before = default if effective is None else _lookup(effective, dotted)
        if before is dataclasses.MISSING and effective is not None:
            before = default
        if before is not dataclasses.MISSING and value == before and generic not in SHOWN:
            out.append(dotted)
    return out


def test_the_paper_config_holds_choices_only():
    assert restated(merge_files([PAPER])) == []
    assert all(reason for reason in SHOWN.values())


def test_the_demo_overlay_changes_what_it_names():
    assert restated(merge_files([DEMO]), resolved_config(PAPER)) == []


def test_a_restated_default_is_found(tmp_path):
    paper = merge_files([PAPER])
    paper["training"]["lr"] = 1.0e-5  # the default
    paper["variants"]["grpo"]["cost"] = 0.01  # a variant's default
    paper["mix"] = {"counts": {"quest": 2000}}
    assert sorted(restated(paper)) == ["mix.counts.quest", "training.lr", "variants.grpo.cost"]
    demo = merge_files([DEMO])
    demo["retrieval"]["reranker"]["revision"] = "953dc6f6f85a1b2dbfca4c34a2796e7dde08d41e"  # the paper's
    demo["evaluation"]["top_p"] = 1.0
    assert sorted(restated(demo, resolved_config(PAPER))) == [
        "evaluation.top_p",
        "retrieval.reranker.revision",
    ]


def test_a_restated_dataset_entry_is_found():
    """The datasets' release files and splits are their registry entries' (spader.datasets): a
    config that states one of them again restates a default."""
    paper = merge_files([PAPER])
    paper["datasets"] = {
        "qampari": {
            "files": {"qampari.zip": {"url": "https://aggreg-qa.s3.amazonaws.com/qampari.zip"}},
            "splits": {"test": {"member": "qampari_data/test_data.jsonl"}},
        },
        "webqsp": {"files": {"WebQSP.zip": {"url": "resources/manual/WebQSP.zip"}}},  # a choice
        "quest": {"splits": {"train": {"file": "train_aug.jsonl"}}},
    }
    assert sorted(restated(paper)) == [
        "datasets.qampari.files.qampari.zip.url",
        "datasets.qampari.splits.test.member",
        "datasets.quest.splits.train.file",
    ]


# ---------------------------------------------------------------------------------------------
# Settings objects: built from the typed sections, no defaults of their own
# ---------------------------------------------------------------------------------------------
#: The settings objects built from config sections: ``(file, class)``, a dataclass each.
SETTINGS = [
    ("src/spader/agent/loop.py", "AgentSettings"),
    ("src/spader/retrieval/backend.py", "SearchSettings"),
    ("src/spader/evaluation/tables.py", "Uncertainty"),
    ("src/spader/integrations/verl/scorer_rewards.py", "JudgeSettings"),
    ("src/spader/integrations/verl/scorer_rewards.py", "StepSearchSettings"),
    ("src/spader/methods/spader/rewards.py", "SpaderSettings"),
]
#: Settings that are config sections themselves (their defaults are the model's): ``(file, name)``.
SECTIONS = [
    ("src/spader/demo/sft.py", "WarmstartSettings = WarmstartConfig"),
    ("src/spader/scorers/evidence.py", "EvidenceSettings = EvidenceConfig"),
]


def own_defaults(path: Path, name: str) -> list[str]:
    """Fields of class ``name`` in ``path`` declared with a value (a default of their own)."""
    (cls,) = [
        n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef) and n.name == name
    ]
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and n.value is not None and isinstance(n.target, ast.Name)
    ]


def test_settings_objects_have_no_defaults_of_their_own(tmp_path):
    for rel, name in SETTINGS:
        # Uncertainty.reference names the method tested against, no config key
        assert own_defaults(REPO / rel, name) in ([], ["reference"]), (rel, name)
    for rel, line in SECTIONS:
        assert f"\n{line}\n" in (REPO / rel).read_text(), (rel, line)
    probe = tmp_path / "probe.py"
    probe.write_text("class S:\n    a: int\n    b: float = 0.5\n    c = 3\n")
    assert own_defaults(probe, "S") == ["b"]


# ---------------------------------------------------------------------------------------------
# No `.get(key, literal)` for a config key
# ---------------------------------------------------------------------------------------------
def _config_keys() -> set[str]:
    keys: set[str] = set()
    todo: list[type[BaseModel]] = [Config]
    while todo:
        model = todo.pop()
        for name, field in model.model_fields.items():
            keys.add(name)
            todo += _models(field.annotation)
    return keys


#: Keys of a config section that are also keys of other documents the package reads with a default
#: of their own (verl's config, hub files, records), by file.
NOT_CONFIG = {
    "src/spader/scorers/judge_server.py": {"data"},  # an OpenAI /models reply
    "src/spader/integrations/verl/cpu/replica.py": {"batch_size"},  # verl's rollout engine_kwargs
    "src/spader/planning/calibration.py": {"model", "device"},  # a calibration record's fields
}


def literal_fallbacks(files: list[Path], keys: set[str]) -> list[str]:
    """``file:line key`` of every ``x.get("<config key>", <constant other than None>)``."""
    out = []
    for path in files:
        rel = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "get" or len(node.args) != 2:
                continue
            key, fallback = node.args
            if not (isinstance(key, ast.Constant) and key.value in keys):
                continue
            if isinstance(fallback, ast.Constant) and fallback.value is None:
                continue
            if key.value in NOT_CONFIG.get(rel, set()):
                continue
            literal = isinstance(fallback, ast.Constant | ast.List | ast.Dict | ast.Tuple) or (
                isinstance(fallback, ast.UnaryOp) and isinstance(fallback.operand, ast.Constant)
            )
            if literal:
                out.append(f"{rel}:{node.lineno} {key.value}")
    return out


def test_no_literal_fallback_for_a_config_key(tmp_path):
    files = [*(REPO / "src").rglob("*.py"), *(REPO / "workflow" / "scripts").glob("*.py")]
    keys = _config_keys()
    assert literal_fallbacks(files, keys) == []
    probe = REPO / "tests" / "config" / "_probe_fallback.py"
    try:
        probe.write_text('x = {}.get("batch_size", 8)\ny = {}.get("gpus", 1)\nz = {}.get("title", "")\n')
        assert literal_fallbacks([probe], keys) == [
            "tests/config/_probe_fallback.py:1 batch_size",
            "tests/config/_probe_fallback.py:2 gpus",
        ]
    finally:
        probe.unlink()
