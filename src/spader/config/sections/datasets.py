"""``datasets``: the release files and splits of each dataset, one section per entry of the
registry (:mod:`spader.datasets`), laid over the entry's own files and splits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, create_model, model_validator

from spader.config.sections.base import FileName, Section
from spader.datasets import registry

__all__ = [
    "DatasetConfig",
    "DatasetsConfig",
    "HubSource",
    "SourceConfig",
    "SplitConfig",
    "SplitsConfig",
    "dataset_defaults",
]


class HubSource(Section):
    """A file on the Hugging Face hub."""

    repo_id: str = Field(description="hub repository id, e.g. cmalaviya/quest")
    filename: str = Field(description="file path inside the repository")
    revision: str = Field("main", description="branch, tag or commit")
    repo_type: Literal["dataset", "model"] = Field("dataset", description="hub repository type")
    format: Literal["raw", "mintaka_parquet"] = Field(
        "raw",
        description="raw: the file as is; mintaka_parquet: rebuild mintaka_<split>.json from the "
        "parquet export",
    )
    split: str | None = Field(
        None,
        description="format mintaka_parquet: keep only the rows of this split when the file has a "
        "`split` column (null: all rows)",
    )
    local_dir: str | None = Field(
        None,
        description="read the hub layout from this local directory instead of the network (offline "
        "mirrors, tests)",
    )


class SourceConfig(Section):
    """Where a release file comes from."""

    url: str | None = Field(
        description="http(s) URL, file: URL, or a path (relative paths resolve against the repository "
        "root). null means the file must be supplied by the user; the download rule then fails "
        "with a message naming this key."
    )
    hub: HubSource | None = Field(
        None, description="Load the file from the Hugging Face hub instead of `url`."
    )


class SplitConfig(Section):
    """Which release file (and zip member) holds one split."""

    file: str = Field(description="a key of the dataset's `files`")
    member: str | None = Field(None, description="member path inside a zip archive")


class SplitsConfig(Section):
    """train (the mix pool) and test (the evaluation set)."""

    train: SplitConfig = Field(description="the split the training mix draws from")
    test: SplitConfig = Field(description="the evaluation set")


class DatasetConfig(Section):
    """One dataset's release files and splits (docs/data.md)."""

    files: dict[FileName, SourceConfig] = Field(
        min_length=1, description="Release files by name; each is fetched by rule download_dataset."
    )
    splits: SplitsConfig = Field(description="train (the mix pool) and test (the evaluation set).")

    @model_validator(mode="after")
    def _splits_name_files(self) -> DatasetConfig:
        for split in ("train", "test"):
            name = getattr(self.splits, split).file
            if name not in self.files:
                raise ValueError(
                    f"splits.{split}.file: '{name}' is not a key of files ({', '.join(self.files)})"
                )
        return self


def dataset_defaults(datasets: Any) -> Any:
    """``datasets`` (the config's section) laid over the registry's entries (:mod:`spader.datasets`),
    key by key as a config file is laid over another: the registry is the layer below
    ``config/config.yaml``, so a config gives only what it changes (a release file's source, a split's
    member) and keeps the entry's other files. A dataset the registry does not know is kept, for the
    check to name it; a section that is not a mapping is returned as it is, for the check to refuse."""
    from spader.config.files import merge_into  # (files imports the model, which imports this module)

    if not isinstance(datasets, Mapping):
        return datasets
    out: dict[str, Any] = {}
    for name, entry in registry().items():
        given = datasets.get(name, {})
        out[name] = merge_into(entry.config_default(), given) if isinstance(given, Mapping) else given
    return {**out, **{k: v for k, v in datasets.items() if k not in out}}


def _section_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _dataset_section(name: str) -> type[DatasetConfig]:
    """``datasets.<name>``: :class:`DatasetConfig` with the registry entry's release files and
    splits as its defaults (a class per dataset, so that the schema states them)."""
    default = registry()[name].config_default()
    splits = create_model(
        f"{_section_name(name)}Splits",
        __base__=SplitsConfig,
        __doc__=SplitsConfig.__doc__,
        **{
            split: (
                SplitConfig,
                Field(
                    default_factory=lambda s=split: SplitConfig.model_validate(default["splits"][s]),
                    description=SplitsConfig.model_fields[split].description,
                ),
            )
            for split in ("train", "test")
        },
    )
    files = DatasetConfig.model_fields["files"]
    return create_model(
        f"{_section_name(name)}Dataset",
        __base__=DatasetConfig,
        __doc__=DatasetConfig.__doc__,
        files=(
            dict[FileName, SourceConfig],
            Field(
                default_factory=lambda: {
                    k: SourceConfig.model_validate(v) for k, v in default["files"].items()
                },
                min_length=1,
                description=files.description,
            ),
        ),
        splits=(
            splits,
            Field(default_factory=splits, description=DatasetConfig.model_fields["splits"].description),
        ),
    )


class _Datasets(Section):
    @model_validator(mode="before")
    @classmethod
    def _over_the_registry(cls, data: Any) -> Any:
        return dataset_defaults(data)


#: ``datasets``: one section per dataset of the registry.
DatasetsConfig = create_model(
    "DatasetsConfig",
    __base__=_Datasets,
    __doc__="The datasets' release files (docs/data.md), one section per dataset of the registry "
    "(spader.datasets); a config gives only what it changes.",
    **{
        name: (section, Field(default_factory=section, description=entry.description))
        for name, entry in registry().items()
        for section in [_dataset_section(name)]
    },
)
