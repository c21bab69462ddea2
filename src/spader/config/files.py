"""Reading configuration files the way the workflow does, and refusing what Snakemake would let pass.

Snakemake 9.27 reads ``config/config.yaml`` (the Snakefile's ``configfile:``) and every
``--configfile`` itself: it first merges the ``--configfile`` files into one overlay, in order, and
then merges that overlay into the workflow's file (``snakemake.settings.types.ConfigSettings`` and
``Workflow.configfile``), each merge with ``snakemake.utils.update_config``: a mapping merges key by
key into a mapping (and replaces anything else), every other value (a list, a scalar, null)
replaces what was there, and an empty mapping changes nothing. :func:`merge_into` and
:func:`merge_files` do exactly that, so ``spader config show --configfile A B`` prints the
configuration a ``snakemake --configfile A B`` run validates.

Snakemake's YAML loader keeps the last of two equal keys of one mapping, so a section given twice
loses the first silently; :func:`load_yaml` refuses it, naming the key, the file and both lines.
The workflow re-reads its config files with it at start-up (``workflow/rules/common.smk``). A file
that is not UTF-8 is one line naming it and the line (:func:`decoded`), from ``spader`` and from
``snakemake`` (which the default profile has check the files before it reads them:
:func:`refuse_unreadable_configfiles`).
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from spader.config.checks import ConfigError, check_config
from spader.config.model import Config

__all__ = [
    "DEFAULT_CONFIG",
    "config_paths",
    "configfile_arguments",
    "decoded",
    "in_file_order",
    "load_config",
    "load_yaml",
    "merge_files",
    "merge_into",
    "refuse_unreadable_configfiles",
    "resolved_config",
]

#: The workflow's own config file, relative to the repository (the Snakefile's ``configfile:``).
DEFAULT_CONFIG = Path("config") / "config.yaml"


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML's safe loader, refusing a key given twice in one mapping."""


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:  # the mapping's own keys (a `<<` merge may be overridden)
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the constructor below reports it
            continue
        if first is not None:
            raise ConfigError(
                f"config key '{key}' is given twice in one mapping of {getattr(loader, 'spader_path', '<yaml>')} "
                f"(lines {first.line + 1} and {key_node.start_mark.line + 1}); YAML would keep only the last"
            )
        seen[key] = key_node.start_mark
    loader.flatten_mapping(node)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def decoded(data: bytes, path: str | os.PathLike) -> str:
    r"""A config file's bytes as text; a ConfigError naming the file, line and byte when they are
    not UTF-8 (what YAML files are, and what Snakemake reads them as).

    >>> decoded(b"a: 1\nb: \xff\n", "my.yaml")
    Traceback (most recent call last):
    ...
    spader.config.checks.ConfigError: config file my.yaml line 2: not UTF-8 text (byte 0xff at column 4); save it as UTF-8
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            f"config file {path} line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at column "
            f"{column}); save it as UTF-8"
        ) from None


def configfile_arguments(argv: Sequence[str]) -> list[str]:
    """The files a ``snakemake`` command line names with ``--configfile``/``--configfiles``.

    >>> configfile_arguments(["-n", "--configfile", "a.yaml", "b.yaml", "-c", "2", "--configfiles=c.yaml"])
    ['a.yaml', 'b.yaml', 'c.yaml']
    """
    files: list[str] = []
    taking = False
    for arg in argv:
        name, eq, value = arg.partition("=")
        if name in ("--configfile", "--configfiles"):
            taking = not eq
            files += [value] if eq else []
        elif arg.startswith("-") and len(arg) > 1:
            taking = False
        elif taking:
            files.append(arg)
    return files


def refuse_unreadable_configfiles(argv: Sequence[str] | None = None) -> None:
    """Stop a ``snakemake`` run whose ``--configfile`` is not UTF-8 with one line naming it
    (exit status 2). Snakemake reads those files before the workflow, and a byte that is not UTF-8
    ends it with a traceback that names no file; the workflow's default profile calls this while
    Snakemake reads it (``profiles/default/config.yaml``), before Snakemake reads the files."""
    for path in configfile_arguments(sys.argv[1:] if argv is None else argv):
        try:
            decoded(Path(path).read_bytes(), path)
        except OSError:
            continue  # Snakemake says that a file is missing, in one line
        except ConfigError as exc:
            sys.stderr.write(f"snakemake: error: {exc}\n")
            raise SystemExit(2) from None


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """One config file as a mapping (an empty file is ``{}``).

    Raises:
        ConfigError: the file is missing or unreadable, is not YAML, is not a mapping at its top
            level, or gives a key twice in one mapping (the message names the key, file and lines).
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
    text = decoded(data, path)
    loader = _StrictLoader(text)
    loader.spader_path = str(path)
    try:
        doc = loader.get_single_data()
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config file {path}{line}: not valid YAML ({problem})") from exc
    finally:
        loader.dispose()
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(
            f"config file {path}: the top level must be a mapping of keys, got {type(doc).__name__}"
        )
    return doc


def merge_into(base: dict, update: Mapping) -> dict:
    """Merge ``update`` into ``base`` in place as ``snakemake.utils.update_config`` does, and
    return ``base``: a mapping merges key by key into what is there (a non-mapping there is
    replaced by it), any other value replaces what was there.

    >>> merge_into({"a": {"b": 1, "c": [1]}, "d": 1}, {"a": {"c": [2]}, "d": {"e": 2}})
    {'a': {'b': 1, 'c': [2]}, 'd': {'e': 2}}
    >>> merge_into({"a": [1]}, {"a": {}})
    {'a': [1]}
    """
    for key, value in update.items():
        if isinstance(value, Mapping):
            current = base.get(key)
            if not value:
                base.setdefault(key, {})
                continue
            if not isinstance(current, dict):
                current = {}
            base[key] = merge_into(current, value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def in_file_order(config: Mapping[str, Any], paths: Sequence[str | os.PathLike]) -> dict[str, Any]:
    """``config`` with its variants in the order the config files define them, the first file's
    first (then any given otherwise, such as ``--config``, in ``config``'s order). Snakemake's merge
    puts the variants an overlay names first; the tables' rows and the plots' styles follow this
    order, so an overlay that changes a variant's setting does not reorder them.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.yaml").write_text("variants: {x: {}, y: {}}")
    >>> _ = (d / "b.yaml").write_text("variants: {y: {beta: 1.0}, z: {}}")
    >>> list(in_file_order({"variants": {"y": {}, "z": {}, "x": {}}}, [d / "a.yaml", d / "b.yaml"])["variants"])
    ['x', 'y', 'z']
    """
    order: list[str] = []
    for path in paths:
        for name in load_yaml(path).get("variants") or {}:
            if name not in order:
                order.append(name)
    variants = config.get("variants") or {}
    names = [n for n in order if n in variants] + [n for n in variants if n not in order]
    return {**config, "variants": {n: variants[n] for n in names}}


def merge_files(paths: Sequence[str | os.PathLike]) -> dict[str, Any]:
    """The raw configuration of a run with the workflow's file ``paths[0]`` and the
    ``--configfile`` files ``paths[1:]``: the overlays merged together in order, then into the
    first (Snakemake's order of merging).

    Raises:
        ConfigError: a file cannot be read (see :func:`load_yaml`).
    """
    if not paths:
        return {}
    base = load_yaml(paths[0])
    extra: dict[str, Any] = {}
    for path in paths[1:]:
        merge_into(extra, load_yaml(path))
    return merge_into(base, extra)


def config_paths(
    configfiles: Sequence[str | os.PathLike] | None = None, root: str | os.PathLike | None = None
) -> list[Path]:
    """The workflow's ``config/config.yaml`` (under ``root``, the repository; default: the one this
    package is installed from) followed by ``configfiles`` (as given, relative to the current
    directory like Snakemake's ``--configfile``)."""
    from spader.config.checks import verl_config_dir

    repo = Path(root) if root is not None else verl_config_dir().parents[1]
    return [repo / DEFAULT_CONFIG, *(Path(c) for c in configfiles or ())]


def load_config(
    *paths: str | os.PathLike,
    verl_config_dir: str | os.PathLike | None = None,
    check_paths: bool = True,
) -> Config:
    """Read config files the way a workflow run does (:func:`merge_files`: the first is the
    workflow's file, the others its ``--configfile`` overlays) and check them.

    Used outside a workflow (the commands of ``spader``, the GPU smoke test, tests).

    Raises:
        ConfigError: a file cannot be read, or the merged configuration is invalid (every error,
            each naming its key).
    """
    return check_config(merge_files(paths), verl_config_dir, check_paths=check_paths)


def resolved_config(*paths: str | os.PathLike, verl_config_dir: str | os.PathLike | None = None) -> dict:
    """:func:`load_config` as the plain mapping a workflow run's ``config`` holds (every default
    filled in)."""
    return load_config(*paths, verl_config_dir=verl_config_dir).model_dump(mode="json")
