"""Datasets: release files -> unified records (norm_v1) -> training mix, verl parquet, evaluation sets.

Normative description: docs/data.md (each dataset's release format; unified records and the mix).
Which datasets there are, and what each needs (release files, extractor, record layout, ``meta``
fields, paper count), is the registry's (:mod:`spader.datasets`).

Modules: :mod:`~spader.data.readers` (release files, errors with file and line),
:mod:`~spader.data.sources` (one extractor per dataset), :mod:`~spader.data.records` (the unified
record, ``build_entities``, schemas), :mod:`~spader.data.mix`, :mod:`~spader.data.export`,
:mod:`~spader.data.release_files` and :mod:`~spader.data.layout` (release-file writers). CLI:
``spader data normalize ...`` (alias ``python -m spader.data``).
"""

from spader.data.export import (
    EVAL_SCHEMA,
    SEARCH_TOOL_NAME,
    VERL_SCHEMA,
    eval_rows,
    export_eval_set,
    export_rl_dataset,
    verl_rows,
)
from spader.data.mix import MixError, build_mix, mix_metrics, mix_training_set
from spader.data.records import (
    DATASETS,
    MIX_SCHEMA,
    DataFormatError,
    build_entities,
    read_records,
    record_schema,
    strip_parenthetical,
)
from spader.data.release_files import DatasetSourceError, download_dataset, fetch_from_hub
from spader.data.sources import NormalizeSummary, drops_path_for, normalize_file, normalize_release

__all__ = [
    "DATASETS",
    "EVAL_SCHEMA",
    "MIX_SCHEMA",
    "SEARCH_TOOL_NAME",
    "VERL_SCHEMA",
    "DataFormatError",
    "DatasetSourceError",
    "MixError",
    "NormalizeSummary",
    "build_entities",
    "build_mix",
    "download_dataset",
    "drops_path_for",
    "eval_rows",
    "export_eval_set",
    "export_rl_dataset",
    "fetch_from_hub",
    "mix_metrics",
    "mix_training_set",
    "normalize_file",
    "normalize_release",
    "read_records",
    "record_schema",
    "strip_parenthetical",
    "verl_rows",
]
