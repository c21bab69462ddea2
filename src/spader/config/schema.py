"""The JSON schema of the configuration, generated from :class:`spader.config.model.Config`.

``workflow/schemas/config.schema.yaml`` is this schema written out (``python -m spader.config
write``), for editors and tools that read JSON schemas: the workflow checks a config with the model
itself (``spader.config.checks``), and a config the schema fills in (Snakemake's ``validate(...,
set_default=True)``) gets the model's defaults (a test holds both equal). Nothing in the file is written by hand: a test fails when it differs from
:func:`json_schema`.

Beyond pydantic's own generator: no ``title`` keys, sections (nested models with a default) get
``default: {}`` when each of their keys has a default (``validate(..., set_default=True)`` then
fills their keys one by one; a section with a required key keeps its whole default), fields that
point at a section keep their description, and maps with free keys (backbones, variants, release
files) reject keys that do not match their pattern.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from spader.config.model import Config

__all__ = ["HEADER", "dump_yaml", "json_schema"]

HEADER = (
    "# Generated from spader.config.model by `spader config docs`; do not edit by hand.\n"
    "# Every key, its type, default and description: config/README.md (generated from the same model).\n"
)


class _Generator(GenerateJsonSchema):
    def default_schema(self, schema):
        if "default_factory" in schema and "default" not in schema:
            schema = {**schema, "default": schema["default_factory"]()}
            schema.pop("default_factory")
        return super().default_schema(schema)

    def field_title_should_be_set(self, schema) -> bool:
        return False


def _models(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model class reachable from ``model``, by class name (the ``$defs`` keys)."""
    out: dict[str, type[BaseModel]] = {}
    todo = [model]
    while todo:
        current = todo.pop()
        if current.__name__ in out:
            continue
        out[current.__name__] = current
        for field in current.model_fields.values():
            todo.extend(_nested_models(field.annotation))
    return out


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _nested_models(arg)]


def _refers_to_model(node: Mapping[str, Any]) -> bool:
    return "$ref" in node or any("$ref" in branch for branch in node.get("anyOf", ()))


def _finish_object(node: dict, model: type[BaseModel]) -> None:
    node.pop("title", None)
    if model.__doc__:
        node["description"] = " ".join(model.__doc__.split())
    for name, prop in (node.get("properties") or {}).items():
        field = model.model_fields[name]
        if field.description and "description" not in prop:
            prop["description"] = " ".join(field.description.split())
        if (
            _refers_to_model(prop)
            and isinstance(prop.get("default"), dict)
            and _fills_itself(field.annotation)
        ):
            prop["default"] = {}  # filled key by key from the section's own defaults
        _finish_nullable(prop)
        _finish_maps(prop)


def _fills_itself(annotation: Any) -> bool:
    """Whether every key of the section(s) ``annotation`` names has a default (so that an empty
    section is filled key by key); a section with a required key keeps its whole default (a
    dataset's splits)."""
    return all(not f.is_required() for m in _nested_models(annotation) for f in m.model_fields.values())


def _finish_nullable(prop: dict) -> None:
    """``anyOf: [$ref, null]`` (an optional section) as ``if object then $ref``: Snakemake's
    default-filling validator would otherwise try to fill the section's defaults into ``null``."""
    branches = prop.get("anyOf") or []
    refs = [b for b in branches if "$ref" in b]
    if len(refs) == 1 and len(branches) == 2 and {"type": "null"} in branches:
        del prop["anyOf"]
        prop.update({"type": ["object", "null"], "if": {"type": "object"}, "then": refs[0]})


def _finish_maps(node: dict) -> None:
    if "patternProperties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False


_KEY_ORDER = ("$ref", "description", "type", "enum", "const", "default")


def _ordered(node: Any) -> Any:
    """Description, type and default first in every node (the file is read by people too)."""
    if isinstance(node, list):
        return [_ordered(v) for v in node]
    if not isinstance(node, dict):
        return node
    first = [k for k in _KEY_ORDER if k in node]
    rest = [k for k in node if k not in _KEY_ORDER]
    return {k: (node[k] if k in ("default", "enum", "const") else _ordered(node[k])) for k in first + rest}


def json_schema() -> dict[str, Any]:
    """The configuration schema (JSON Schema draft 2020-12) as a dict."""
    schema = Config.model_json_schema(schema_generator=_Generator, mode="validation")
    models = _models(Config)
    for name, node in schema.get("$defs", {}).items():
        _finish_object(node, models[name])
    _finish_object(schema, Config)
    ordered = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "SPADER workflow configuration",
        **{k: v for k, v in schema.items() if k != "$defs"},
        "$defs": schema.get("$defs", {}),
    }
    return copy.deepcopy(_ordered(ordered))


def dump_yaml(schema: Mapping[str, Any]) -> str:
    """The schema as the YAML text of ``workflow/schemas/config.schema.yaml``."""
    import yaml

    return HEADER + yaml.safe_dump(dict(schema), sort_keys=False, allow_unicode=True, width=110)
