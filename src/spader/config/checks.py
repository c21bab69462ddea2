"""Checking a workflow configuration before any job (called first thing in ``common.smk``).

Two passes, both generated from one model (:mod:`spader.config.model`):

1. the JSON schema (:mod:`spader.config.schema`): types, ranges and unknown keys, each error
   naming the dotted key (``config key 'training.lr': 'fast' is not of type 'number'``);
2. the model itself, after every default is filled in: the rules that cross keys and sections
   (a target naming a backbone, a backbone naming a variant, ...) and the checks that read the
   file system (a variant's verl YAML, a local model path).

Every error of a pass is reported at once, so a bad config fails before the DAG is built.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from spader.config.model import Config, dataset_defaults
from spader.config.schema import json_schema

__all__ = ["ConfigError", "check_config", "hub_slug", "verl_config_chain", "verl_config_dir"]

# libyaml's safe loader where PyYAML was built with it (the workflow reads these YAMLs at every start)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


def _dotted(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def schema_errors(config: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> list[str]:
    """JSON-schema errors of ``config``, one message per problem, each naming the dotted key."""
    validator = Draft202012Validator(schema if schema is not None else json_schema())
    messages = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        key = _dotted(err.absolute_path)
        if err.validator == "additionalProperties":
            known = set((err.schema.get("properties") or {}).keys())
            patterns = list((err.schema.get("patternProperties") or {}).keys())
            extra = (
                sorted(
                    k for k in set(err.instance) - known if not any(re.search(p, str(k)) for p in patterns)
                )
                if isinstance(err.instance, Mapping)
                else []
            )
            for name in extra:
                sub = f"{key}.{name}" if err.absolute_path else name
                why = f"names must match {patterns[0]}" if patterns else "unknown key"
                messages.append(f"config key '{sub}' is not allowed ({why})")
            if extra:
                continue
        messages.append(f"config key '{key}': {err.message}")
    return messages


#: What a shell would expand and a configuration value does not: ``${VAR}``, ``${VAR:-default}``,
#: ``$VAR``, ``$(command)``, ``$((...))``.
_ENVIRONMENT = re.compile(r"\$(?:\{[^}]*\}?|[A-Za-z_][A-Za-z0-9_]*|\()")


def environment_errors(config: Any, path: tuple[str, ...] = ()) -> list[str]:
    """One message per string value of ``config`` that looks like a shell variable or command:
    nothing expands it (Snakemake and YAML read it as written), so it would reach a job as text.

    >>> environment_errors({"mlflow": {"tracking_uri": "${MLFLOW_URI}"}})  # doctest: +ELLIPSIS
    ["config key 'mlflow.tracking_uri': '${MLFLOW_URI}' looks like an environment variable..."]
    """
    if isinstance(config, Mapping):
        return [e for k, v in config.items() for e in environment_errors(v, (*path, str(k)))]
    if isinstance(config, list | tuple):
        return [e for i, v in enumerate(config) for e in environment_errors(v, (*path, str(i)))]
    if isinstance(config, str) and (found := _ENVIRONMENT.search(config)):
        return [
            f"config key '{_dotted(path)}': {config!r} looks like an environment variable or a shell "
            f"command ({found.group(0)!r}), which configuration values never expand; write the value itself"
        ]
    return []


_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.]*): ")


def _model_errors(exc: ValidationError) -> list[str]:
    """Pydantic's errors as ``config key '<dotted>': <message>`` lines.

    Validators of a section start their message with the field they are about (``model: ...``),
    which is appended to the section's location; the root's cross-key rules name their keys
    themselves, one per line.
    """
    out = []
    for err in exc.errors():
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        loc = [str(p) for p in err.get("loc", ())]
        for line in msg.splitlines():
            if line.startswith("config key "):
                out.append(line)
                continue
            match = _FIELD_PREFIX.match(line)
            key = loc + ([match.group(1)] if match else [])
            text = line[match.end() :] if match else line
            out.append(f"config key '{_dotted(key)}': {text}")
    return out


def check_config(
    config: Mapping[str, Any],
    verl_config_dir: str | os.PathLike | None = None,
    *,
    check_paths: bool = True,
) -> Config:
    """Validate ``config`` (raw, as read from YAML) and return it as a typed :class:`Config`.

    Args:
        config: the merged configuration (missing keys take their defaults; ``datasets`` is laid
            over the registry's entries first, :func:`~spader.config.model.dataset_defaults`).
        verl_config_dir: the project's verl YAML directory; when given, every variant's
            ``verl_config`` must name a file in it.
        check_paths: whether local model paths must exist.
    Returns:
        The configuration with every default filled in.
    Raises:
        ConfigError: listing every invalid key (schema errors first; the rules between keys are
            checked once the schema passes).
    """
    given = config["datasets"] if "datasets" in config else {}  # a config without it changes nothing
    config = {**config, "datasets": dataset_defaults(given)}
    errors = environment_errors(config) + schema_errors(config)
    if not errors:
        try:
            return Config.model_validate(
                copy.deepcopy(dict(config)),
                context={"verl_config_dir": verl_config_dir, "check_paths": check_paths},
            )
        except ValidationError as exc:
            errors = _model_errors(exc)
    raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))


def hub_slug(repo_id: str) -> str:
    """Directory name of a hub repository under resources/models/hub/ (``org--name``).

    >>> hub_slug("Qwen/Qwen3-8B")
    'Qwen--Qwen3-8B'
    """
    return repo_id.replace("/", "--")


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
            doc = yaml.load(f, Loader=_LOADER) or {}
        for entry in doc.get("defaults", []) or []:
            if isinstance(entry, str) and entry != "_self_":
                todo.append(entry)
    return chain
