"""Workflow configuration checks run before any job (called first thing in ``common.smk``).

JSON-schema errors are reported with the dotted key that is wrong (``config key 'training.lr':
'fast' is not of type 'number'``), and cross-references the schema cannot express (a backbone
naming an unknown variant, a split naming a file that is not listed, a missing verl YAML) are
checked here too, so that a bad config fails before the DAG is built.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

__all__ = [
    "USER_SUPPLIED",
    "ConfigError",
    "check_config",
    "hub_slug",
    "load_schema",
    "missing_sources",
    "model_kind",
    "verl_config_dir",
]

DATASETS = ("qampari", "mintaka", "webqsp", "quest")
BASELINES = ("rag", "react")
TINY_KINDS = ("qwen3", "reranker")

#: Release files the project cannot fetch for the user, with where to get them.
USER_SUPPLIED = {
    "WebQSP.zip": "WebQSP is not redistributable: download WebQSP.zip from "
    "https://www.microsoft.com/en-us/download/details.aspx?id=52763",
}


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


def load_schema(path: str | os.PathLike) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _dotted(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def _schema_errors(config: Mapping[str, Any], schema: dict) -> list[str]:
    validator = Draft202012Validator(schema)
    messages = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        key = _dotted(err.absolute_path)
        if err.validator == "additionalProperties":
            known = set((err.schema.get("properties") or {}).keys())
            extra = sorted(set(err.instance) - known) if isinstance(err.instance, Mapping) else []
            for name in extra:
                sub = f"{key}.{name}" if err.absolute_path else name
                messages.append(f"config key '{sub}' is not allowed (unknown key)")
            if extra:
                continue
        messages.append(f"config key '{key}': {err.message}")
    return messages


def model_kind(name: str) -> str:
    """``tiny`` (``tiny:<kind>``, built locally), ``path`` (an existing local path) or ``hub`` (a hub id)."""
    if name.startswith("tiny:"):
        return "tiny"
    if os.path.exists(name) or name.startswith(("/", "./", "../")):
        return "path"
    return "hub"


def hub_slug(repo_id: str) -> str:
    """Directory name of a hub repository under resources/models/hub/ (``org--name``)."""
    return repo_id.replace("/", "--")


def _semantic_errors(config: Mapping[str, Any], verl_config_dir: Path | None) -> list[str]:
    errors: list[str] = []
    backbones = config.get("backbones", {})
    variants = config.get("variants", {})
    for t in config.get("targets", []):
        if t not in backbones:
            errors.append(f"config key 'targets': '{t}' is not a key of 'backbones' ({', '.join(backbones)})")
    for b, spec in backbones.items():
        for v in spec.get("variants", []):
            if v not in variants:
                errors.append(f"config key 'backbones.{b}.variants': '{v}' is not a key of 'variants'")
        model = str(spec.get("model", ""))
        if model.startswith("tiny:") and model[5:] != "qwen3":
            errors.append(f"config key 'backbones.{b}.model': tiny backbones are 'tiny:qwen3', got '{model}'")
        if spec.get("warmstart") is not None and not model.startswith("tiny:"):  # real backbones as released
            errors.append(
                f"config key 'backbones.{b}.warmstart': only tiny backbones (tiny:qwen3) are warm-started, "
                f"'{model}' is used as released; set it to null"
            )
        if model_kind(model) == "path" and not os.path.exists(model):
            errors.append(f"config key 'backbones.{b}.model': local path '{model}' does not exist")
    reranker = (config.get("retrieval", {}).get("reranker") or {}).get("model")
    if isinstance(reranker, str) and reranker.startswith("tiny:") and reranker != "tiny:reranker":
        errors.append(
            f"config key 'retrieval.reranker.model': tiny rerankers are 'tiny:reranker', got '{reranker}'"
        )
    for v, spec in variants.items():
        if verl_config_dir is not None:
            path = verl_config_dir / f"{spec.get('verl_config')}.yaml"
            if not path.exists():
                errors.append(f"config key 'variants.{v}.verl_config': {path} does not exist")
        if spec.get("advantage") == "gae" and spec.get("reward") not in ("terminal", "stepsearch"):
            errors.append(
                f"config key 'variants.{v}.reward': PPO (advantage gae) is trained on the terminal reward"
            )
        # the step-level baselines are each defined with one estimator (docs/baselines.md)
        pairs = {"stepsearch": "gae", "r3rag": "turn_gae"}
        reward, advantage = spec.get("reward"), spec.get("advantage")
        if (reward in pairs or advantage == "turn_gae") and pairs.get(reward) != advantage:
            errors.append(
                f"config key 'variants.{v}.advantage': {advantage!r} does not train reward {reward!r} "
                f"(stepsearch: gae, r3rag: turn_gae)"
            )
        if reward == "r3rag" and spec.get("judge", "llm") == "reranker" and reranker in (None, "none"):
            errors.append(
                f"config key 'variants.{v}.judge': the reranker judge needs retrieval.reranker.model"
            )
    errors += _served_judge_errors(config)
    training = config.get("training", {})
    device, backend = training.get("device", "cuda"), training.get("rollout_backend", "sglang")
    if (device, backend) not in (("cuda", "sglang"), ("cpu", "transformers")):
        errors.append(
            f"config key 'training.rollout_backend': {backend!r} cannot serve training.device {device!r} "
            "(cuda trains with sglang, cpu with transformers)"
        )
    for d, spec in config.get("datasets", {}).items():
        files = spec.get("files", {})
        for split, s in (spec.get("splits") or {}).items():
            if s.get("file") not in files:
                errors.append(
                    f"config key 'datasets.{d}.splits.{split}.file': '{s.get('file')}' is not a key of "
                    f"'datasets.{d}.files' ({', '.join(files)})"
                )
        for name in files:
            if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
                errors.append(
                    f"config key 'datasets.{d}.files.{name}': file names may use letters, digits, . _ -"
                )
    return errors


def _served_judge_errors(config: Mapping[str, Any]) -> list[str]:
    """A judge served on the training node leaves verl the other GPUs, whose number must divide
    the trajectories of a step (verl's own check, made here before anything runs)."""
    judge = config.get("judge") or {}
    if judge.get("url"):
        return []
    training = config.get("training", {})
    per_step = int(training.get("train_batch_size", 32)) * int(training.get("rollout_n", 16))
    variants = config.get("variants", {})
    errors = []
    for b, spec in config.get("backbones", {}).items():
        served = [
            v
            for v in spec.get("variants", [])
            if variants.get(v, {}).get("reward") == "r3rag" and variants[v].get("judge", "llm") == "llm"
        ]
        if not served:
            continue
        left = int(spec.get("gpus", 0)) - int(judge.get("gpus", 4))
        if left < 1 or per_step % left:
            errors.append(
                f"config key 'judge.gpus': backbone '{b}' trains {served[0]} on {spec.get('gpus')} GPUs, "
                f"{judge.get('gpus', 4)} of them serving the judge; the {max(left, 0)} left must be >= 1 and "
                f"divide the {per_step} trajectories of a step (or set judge.url)"
            )
    return errors


def check_config(
    config: Mapping[str, Any],
    schema: dict | str | os.PathLike,
    verl_config_dir: str | os.PathLike | None = None,
) -> None:
    """Raise :class:`ConfigError` listing every invalid key (schema and cross-references)."""
    if not isinstance(schema, dict):
        schema = load_schema(schema)
    errors = _schema_errors(config, schema)
    if not errors:
        errors = _semantic_errors(config, Path(verl_config_dir) if verl_config_dir else None)
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))


def verl_config_chain(name: str, config_dir: str | os.PathLike) -> list[str]:
    """The project's verl YAML ``name`` and the project YAMLs it inherits from (Hydra ``defaults``
    entries that name a file in ``config_dir``), nearest first. These are the training job's
    inputs, so editing one variant's YAML reruns only the variants built on it."""
    config_dir = Path(config_dir)
    chain: list[str] = []
    todo = [name]
    while todo:
        current = todo.pop(0)
        path = config_dir / f"{current}.yaml"
        if str(path) in chain or not path.exists():
            continue
        chain.append(str(path))
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
        for entry in doc.get("defaults", []) or []:
            if isinstance(entry, str) and entry != "_self_":
                todo.append(entry)
    return chain


def verl_config_dir(root: str | os.PathLike | None = None) -> Path:
    """The project's verl YAML directory, ``<root>/config/verl``: the one place it is looked up.

    Args:
        root: the repository holding the workflow (the workflow passes its own). Without it, the
            checkout this package is installed from (editable install), as tests and the CLIs use.
    Returns:
        The directory (not checked for existence; :func:`check_config` reports missing YAMLs).
    """
    base = Path(root) if root is not None else Path(__file__).resolve().parents[3]
    return base / "config" / "verl"


def missing_sources(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Release files with neither a URL nor a hub location (the user must supply them).

    Returns:
        ``[(config key of the url, what to do)]``, e.g. WebQSP's ``datasets.webqsp.files.WebQSP.zip.url``.
    """
    out = []
    for d, spec in (config.get("datasets") or {}).items():
        for name, source in (spec.get("files") or {}).items():
            if not (source or {}).get("url") and not (source or {}).get("hub"):
                hint = USER_SUPPLIED.get(name, f"{name} has no configured source")
                out.append((f"datasets.{d}.files.{name}.url", f"{hint}, then set this key to its local path"))
    return out
