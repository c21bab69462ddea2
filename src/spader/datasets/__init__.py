"""The datasets the pipeline knows, as one registry: every other place that names a dataset derives
from it (the configuration's sections ``datasets.<name>`` and ``mix.counts``, the training mix, the
rerun table, the readers and extractors of release files, the workflow's wildcards and tables, the
demo's release files).

A dataset is one :class:`Dataset` entry: its release files (each with the URL it is fetched from
unless the configuration says otherwise), which file (and zip member) holds its train and test
splits, how its records are laid out and which function turns one of them into a unified record,
the fields of its records' ``meta``, its number of training questions in the paper's mix, and the
function that writes its release files for the CPU demo. Functions are named by
``"module:function"`` paths, so the registry, low in the layers, imports none of the code they
belong to (the demo's writers stay out of the package's imports).

The paper's four datasets are the entries of :mod:`spader.datasets.builtin`. A package outside the
project adds one through an entry point of group ``spader.datasets`` naming a :class:`Dataset`
object (in its ``pyproject.toml``: ``[project.entry-points."spader.datasets"]`` then
``mydata = "mypkg.data:DATASET"``); the registry lists the built-in datasets in table order, then
those of entry points by entry-point name. An entry point that cannot be loaded, or that names
something else, fails with one line naming it; so does a name registered twice.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from types import MappingProxyType
from typing import Any

from spader.core.imports import import_object

__all__ = [
    "ENTRY_POINT_GROUP",
    "FILE_NAME_PATTERN",
    "LAYOUTS",
    "META_TYPES",
    "NAME_PATTERN",
    "Dataset",
    "DatasetRegistryError",
    "ReleaseFile",
    "Split",
    "build_registry",
    "dataset",
    "entry_point_datasets",
    "names",
    "registry",
    "resolve",
]

#: The entry-point group through which another package registers a dataset.
ENTRY_POINT_GROUP = "spader.datasets"
#: A dataset's name (a config key, a wildcard value, a directory name, a record id's prefix).
NAME_PATTERN = r"^[a-z0-9_]+$"
#: A release file's name: a plain file name (``.`` and ``..`` name directories).
FILE_NAME_PATTERN = r"^(?:[A-Za-z0-9_-]|\.[A-Za-z0-9_-]|\.\.[A-Za-z0-9._-])[A-Za-z0-9._-]*$"
#: How a release file holds its records: one JSON object per line, or one JSON document (an array
#: of records, or an object whose ``records_key`` holds the array).
LAYOUTS = ("jsonl", "json")
#: The types a ``meta`` field can have in the record tables.
META_TYPES = ("string", "integer", "float", "boolean", "list[string]", "list[list[string]]")
#: ``meta`` fields every record has (where it was read), before the dataset's own.
COMMON_META = ("source_file", "source_id")
SPLITS = ("train", "test")


class DatasetRegistryError(ValueError):
    """A dataset entry is invalid, registered twice, or cannot be loaded; the message (one line)
    names the dataset or the entry point."""


@dataclass(frozen=True)
class ReleaseFile:
    """One release file of a dataset.

    Attributes:
        name: its file name (``datasets.<dataset>.files.<name>``; where the download puts it).
        url: where it is fetched from by default (http(s), ``file:`` or a path relative to the
            repository); None when the user must supply it.
        supply: for a file without a URL, how the user gets it (said when it is missing).
    """

    name: str
    url: str | None
    supply: str | None = None


@dataclass(frozen=True)
class Split:
    """The release file that holds a split, and its member when the file is a zip archive."""

    file: str
    member: str | None = None


@dataclass(frozen=True)
class Dataset:
    """One dataset: what the pipeline needs to fetch, read, mix, evaluate and demonstrate it.

    Attributes:
        name: the dataset's name (:data:`NAME_PATTERN`): config key, wildcard, record id prefix.
        title: how the docs and tables write it (``QAMPARI``).
        files: its release files, with their default sources.
        train: the split the training mix draws from.
        test: the evaluation set.
        extract: the extractor (``"module:function"`` or the function): one raw record
            ``(obj, source, line, split)`` to ``(source_id, question, alias groups, meta)``, or
            :class:`spader.data.records.Drop` for a record to leave out (see :mod:`spader.data.sources`).
        layout: how a release file holds the records (:data:`LAYOUTS`).
        records_key: layout ``json``: the key of the top-level object that holds the records
            (None: the document is the array).
        zip_member: the member of a split in a zip archive when the config names none, with
            ``{split}`` standing for the split's name.
        meta: the dataset's own ``meta`` fields and their types (:data:`META_TYPES`), in order;
            ``source_file`` and ``source_id`` come first in every record.
        paper_count: its training questions in the paper's mix (the default of ``mix.counts``).
        demo_writer: the function (``"module:function"`` or the function) that writes its
            release files for the CPU demo, ``(out_dir, world, rng) -> [relative paths]``; None
            when the demo has none.
        about: one line for the configuration reference (default: the title and where the docs
            describe it).
    """

    name: str
    title: str
    files: tuple[ReleaseFile, ...]
    train: Split
    test: Split
    extract: str | Callable[..., Any]
    layout: str = "jsonl"
    records_key: str | None = None
    zip_member: str | None = None
    meta: Mapping[str, str] = field(default_factory=dict)
    paper_count: int = 0
    demo_writer: str | Callable[..., Any] | None = None
    about: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(self.files))
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))
        problem = self._problem()
        if problem:
            raise DatasetRegistryError(f"dataset '{self.name}': {problem}")

    def _problem(self) -> str | None:
        if not isinstance(self.name, str) or not re.match(NAME_PATTERN, self.name):
            return f"the name must match {NAME_PATTERN}"
        if not self.files or not all(isinstance(f, ReleaseFile) for f in self.files):
            return "files must be one or more ReleaseFile entries"
        names = [f.name for f in self.files]
        bad = [n for n in names if not isinstance(n, str) or not re.match(FILE_NAME_PATTERN, n)]
        if bad or len(set(names)) != len(names):
            return f"release file names must be distinct plain file names, got {names}"
        for split in SPLITS:
            spec = getattr(self, split)
            if not isinstance(spec, Split) or spec.file not in names:
                return f"the {split} split must be a Split naming one of its files ({', '.join(names)})"
        if not (isinstance(self.extract, str) and ":" in self.extract) and not callable(self.extract):
            return "extract must be a function or a 'module:function' path"
        if self.layout not in LAYOUTS:
            return f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}"
        for key, kind in self.meta.items():
            if key in COMMON_META or not re.match(r"^[a-z][a-z0-9_]*$", str(key)):
                return f"meta field {key!r} must be a lower-case name other than {', '.join(COMMON_META)}"
            if kind not in META_TYPES:
                return f"meta field '{key}' has type {kind!r}, not one of {', '.join(META_TYPES)}"
        if type(self.paper_count) is not int or self.paper_count < 0:
            return f"paper_count must be a non-negative integer, got {self.paper_count!r}"
        writer = self.demo_writer
        if writer is not None and not (isinstance(writer, str) and ":" in writer) and not callable(writer):
            return "demo_writer must be None, a function or a 'module:function' path"
        return None

    @property
    def description(self) -> str:
        """:attr:`about`, or the title and where the docs describe it."""
        return self.about or f'{self.title} (docs/data.md, "{self.title}")'

    def split(self, name: str) -> Split:
        """The ``train`` or ``test`` split."""
        if name not in SPLITS:
            raise KeyError(f"dataset '{self.name}' has no split '{name}' (only {', '.join(SPLITS)})")
        return getattr(self, name)

    def member(self, split: str) -> str | None:
        """The zip member of ``split`` when the config names none (:attr:`zip_member`)."""
        return self.zip_member.format(split=split) if self.zip_member else None

    def config_default(self) -> dict[str, Any]:
        """Its ``datasets.<name>`` section as the configuration holds it by default."""
        return {
            "files": {f.name: {"url": f.url, "hub": None} for f in self.files},
            "splits": {s: {"file": self.split(s).file, "member": self.split(s).member} for s in SPLITS},
        }

    def extractor(self) -> Callable[..., Any]:
        """The extractor function (:attr:`extract` loaded)."""
        return resolve(self.extract, what=f"dataset '{self.name}': extract")

    def writer(self) -> Callable[..., Any] | None:
        """The demo's writer of its release files (:attr:`demo_writer` loaded), or None."""
        if self.demo_writer is None:
            return None
        return resolve(self.demo_writer, what=f"dataset '{self.name}': demo_writer")


def _one_line(exc: BaseException) -> str:
    text = "; ".join(p.strip() for p in str(exc).splitlines() if p.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def resolve(ref: str | Callable[..., Any], *, what: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` path names (a function is returned as it is).

    Raises:
        DatasetRegistryError: naming ``what`` and the path when it cannot be imported.
    """
    if callable(ref):
        return ref
    try:
        target = import_object(str(ref))
    except Exception as exc:  # an import can fail in any way; one line names what and where
        raise DatasetRegistryError(f"{what} '{ref}' cannot be loaded ({_one_line(exc)})") from exc
    if not callable(target):
        raise DatasetRegistryError(f"{what} '{ref}' is not a function")
    return target


def _meta_conflicts(entries: Iterable[tuple[Dataset, str]]) -> list[str]:
    """A ``meta`` field two datasets declare with different types (the training mix holds the
    union of every dataset's fields, one type each)."""
    seen: dict[str, tuple[str, str]] = {}
    out = []
    for entry, _origin in entries:
        for key, kind in entry.meta.items():
            other = seen.setdefault(key, (kind, entry.name))
            if other[0] != kind:
                out.append(
                    f"meta field '{key}' is {other[0]} in dataset '{other[1]}' but {kind} in '{entry.name}'"
                )
    return out


def build_registry(entries: Iterable[tuple[Dataset, str]]) -> Mapping[str, Dataset]:
    """The registry of ``entries`` (each with where it comes from, for messages), in order.

    Raises:
        DatasetRegistryError: a name registered twice, or a ``meta`` field of two types.
    """
    entries = list(entries)
    out: dict[str, Dataset] = {}
    origins: dict[str, str] = {}
    for entry, origin in entries:
        if not isinstance(entry, Dataset):
            raise DatasetRegistryError(
                f"{origin}: names a {type(entry).__name__}, not a spader.datasets.Dataset"
            )
        if entry.name in out:
            raise DatasetRegistryError(
                f"dataset '{entry.name}' is registered twice ({origins[entry.name]}, and {origin})"
            )
        out[entry.name] = entry
        origins[entry.name] = origin
    conflicts = _meta_conflicts(entries)
    if conflicts:
        raise DatasetRegistryError(conflicts[0])
    return MappingProxyType(out)


def entry_point_datasets(points: Iterable[metadata.EntryPoint] | None = None) -> list[tuple[Dataset, str]]:
    """The datasets of entry points of group :data:`ENTRY_POINT_GROUP` (default: those installed),
    by entry-point name, each with where it comes from.

    Raises:
        DatasetRegistryError: naming the entry point that cannot be loaded or names no dataset.
    """
    if points is None:
        points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    out = []
    for point in sorted(points, key=lambda p: p.name):
        origin = f"entry point '{point.name} = {point.value}' (group {ENTRY_POINT_GROUP})"
        try:
            entry = point.load()
        except Exception as exc:  # a broken plug-in can fail in any way; one line names it
            why = _one_line(exc)
            if "partially initialized module 'spader" in why:  # it imports the package while it loads
                why += f"; {_REENTRY}"
            raise DatasetRegistryError(f"dataset {origin} cannot be loaded ({why})") from exc
        if not isinstance(entry, Dataset):
            raise DatasetRegistryError(
                f"dataset {origin} names a {type(entry).__name__}, not a spader.datasets.Dataset"
            )
        out.append((entry, origin))
    return out


_LOADING: list[bool] = []
_REENTRY = (
    "a dataset's module imports spader's configuration or data at its top; it may import only "
    "spader.datasets, and name its functions by 'module:function' paths"
)


@functools.cache
def registry() -> Mapping[str, Dataset]:
    """Every dataset, by name: the built-in ones in table order, then those of entry points.

    Raises:
        DatasetRegistryError: an entry point cannot be loaded, names no dataset, or its module
            asks for the registry while it loads (it imports the package's configuration or data
            at its top: name the functions by ``"module:function"`` paths instead).
    """
    from spader.datasets.builtin import BUILTIN

    if _LOADING:
        raise DatasetRegistryError(f"the registry of datasets was asked for while it loads: {_REENTRY}")
    _LOADING.append(True)
    try:
        return build_registry([*((d, "spader.datasets.builtin") for d in BUILTIN), *entry_point_datasets()])
    finally:
        _LOADING.clear()


def names() -> tuple[str, ...]:
    """The datasets' names, in table order."""
    return tuple(registry())


def dataset(name: str) -> Dataset:
    """The entry of dataset ``name``.

    Raises:
        DatasetRegistryError: naming the dataset and the known ones.
    """
    known = registry()
    if name not in known:
        raise DatasetRegistryError(f"unknown dataset '{name}' (known: {', '.join(known)})")
    return known[name]
