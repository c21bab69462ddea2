"""The registry of datasets (spader.datasets): what every other place derives from, the entries it
refuses, the entry points it loads, and the configuration sections built from it."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import plugin_dataset as plugin
import pytest

from spader.config import DATASETS, ConfigError, check_config, resolved_config
from spader.config.model import DatasetsConfig, MixCounts
from spader.data.records import META_FIELDS, MIX_SCHEMA
from spader.datasets import (
    Dataset,
    DatasetRegistryError,
    ReleaseFile,
    Split,
    build_registry,
    dataset,
    entry_point_datasets,
    registry,
)
from spader.datasets.builtin import BUILTIN, MINTAKA, QAMPARI, QUEST
from spader.infra import rerun_keys

REPO = Path(__file__).resolve().parents[2]


def test_the_paper_datasets_are_four_entries_everything_derives_from():
    assert DATASETS == tuple(registry()) == ("qampari", "mintaka", "webqsp", "quest")
    assert [d.name for d in BUILTIN] == list(DATASETS)
    assert MixCounts().model_dump() == {"qampari": 6000, "mintaka": 2000, "webqsp": 2000, "quest": 2000}
    paper = resolved_config(REPO / "config" / "config.yaml")
    assert paper["datasets"] == {d.name: d.config_default() for d in BUILTIN}  # config.yaml states none
    assert list(DatasetsConfig.model_fields) == list(DATASETS) == list(META_FIELDS)
    assert list(META_FIELDS["quest"]) == ["source_file", "source_id", *QUEST.meta]
    assert set(MIX_SCHEMA["meta"].to_schema()) == {
        k for d in BUILTIN for k in ("source_file", "source_id", *d.meta)
    }
    tabled = {k for row in rerun_keys.TABLE for k in row.keys if k.startswith("datasets.")}
    assert {f"datasets.{d}.splits.train.member" for d in DATASETS} <= tabled


def _entry(**changes) -> Dataset:
    return dataclasses.replace(QUEST, **changes)


def test_a_name_registered_twice_is_refused_naming_both():
    with pytest.raises(
        DatasetRegistryError, match=r"dataset 'quest' is registered twice \(built-in, and entry point x\)"
    ):
        build_registry([(QUEST, "built-in"), (_entry(title="Another QUEST"), "entry point x")])
    with pytest.raises(
        DatasetRegistryError,
        match=r"meta field 'template' is string in dataset 'quest' but integer in 'other'",
    ):
        build_registry([(QUEST, "a"), (_entry(name="other", meta={"template": "integer"}), "b")])
    assert list(build_registry([(QUEST, "a"), (_entry(name="other"), "b")])) == ["quest", "other"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "My-Data"}, r"dataset 'My-Data': the name must match"),
        (
            {"test": Split("missing.jsonl")},
            r"dataset 'quest': the test split must be a Split naming one of its files",
        ),
        ({"files": (ReleaseFile("..", None),)}, r"release file names must be distinct plain file names"),
        ({"layout": "csv"}, r"layout must be one of jsonl, json"),
        ({"meta": {"docs_raw": "list[int]"}}, r"meta field 'docs_raw' has type 'list\[int\]'"),
        ({"meta": {"source_id": "string"}}, r"meta field 'source_id' must be a lower-case name other than"),
        ({"paper_count": -1}, r"paper_count must be a non-negative integer"),
        ({"extract": "no_function_named"}, r"extract must be a function or a 'module:function' path"),
    ],
)
def test_an_invalid_entry_is_refused_naming_the_dataset(changes, message):
    with pytest.raises(DatasetRegistryError, match=message):
        _entry(**changes)


def test_an_entrys_functions_load_by_path_and_fail_naming_it():
    from spader.data.sources import extract_mintaka

    assert MINTAKA.extractor() is extract_mintaka
    assert QAMPARI.member("dev") == "qampari_data/dev_data.jsonl" and MINTAKA.member("test") is None
    with pytest.raises(
        DatasetRegistryError,
        match=r"dataset 'quest': extract 'spader.data.sources:nope' cannot be loaded \(AttributeError",
    ):
        _entry(extract="spader.data.sources:nope").extractor()
    with pytest.raises(
        DatasetRegistryError, match="unknown dataset 'nq' \\(known: qampari, mintaka, webqsp, quest\\)"
    ):
        dataset("nq")


def _point(value: str, name: str = "mine") -> metadata.EntryPoint:
    return metadata.EntryPoint(name=name, value=value, group="spader.datasets")


def test_entry_points_load_a_dataset_or_fail_with_one_line_naming_them():
    assert entry_point_datasets([_point("spader.datasets.builtin:QUEST")]) == [
        (QUEST, "entry point 'mine = spader.datasets.builtin:QUEST' (group spader.datasets)")
    ]
    for value, why in [
        (
            "not_a_module_here:DATASET",
            r"cannot be loaded \(ModuleNotFoundError: No module named 'not_a_module_here'\)",
        ),
        ("spader.datasets:names", r"names a function, not a spader.datasets.Dataset"),
    ]:
        with pytest.raises(DatasetRegistryError) as err:
            entry_point_datasets([_point(value)])
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"dataset entry point 'mine = {value}'")
        assert re.search(why, message), message


def test_an_unknown_dataset_in_the_config_is_refused_naming_the_key():
    paper = resolved_config(REPO / "config" / "config.yaml")
    paper["datasets"]["nq"] = {
        "files": {"nq.jsonl": {"url": None}},
        "splits": QUEST.config_default()["splits"],
    }
    with pytest.raises(ConfigError, match=r"config key 'datasets\.nq' is not allowed \(unknown key\)"):
        check_config(paper)
    paper = resolved_config(REPO / "config" / "config.yaml")
    paper["mix"]["counts"]["nq"] = 10
    with pytest.raises(ConfigError, match=r"config key 'mix\.counts\.nq' is not allowed \(unknown key\)"):
        check_config(paper)


def test_a_config_gives_only_what_it_changes_of_an_entry():
    """Laid over the entry key by key, as a config file over another: a file's new source keeps
    the entry's other files and the splits."""
    hub = {"repo_id": "cmalaviya/quest", "filename": "train_aug.jsonl"}
    config = check_config(
        {**_paper_raw(), "datasets": {"quest": {"files": {"train_aug.jsonl": {"url": None, "hub": hub}}}}}
    )
    quest = config.model_dump(mode="json")["datasets"]["quest"]
    assert quest["files"]["test.jsonl"] == {"url": QUEST.files[1].url, "hub": None}
    assert quest["files"]["train_aug.jsonl"]["hub"]["repo_id"] == "cmalaviya/quest"
    assert quest["splits"] == QUEST.config_default()["splits"]
    added = check_config(
        {
            **_paper_raw(),
            "datasets": {
                "quest": {"splits": {"test": {"file": "new.jsonl"}}, "files": {"new.jsonl": {"url": "x"}}}
            },
        }
    )
    assert list(added.datasets.quest.files) == ["train_aug.jsonl", "test.jsonl", "new.jsonl"]


def _paper_raw() -> dict:
    from spader.config import merge_files

    return merge_files([REPO / "config" / "config.yaml"])


def test_a_broken_entry_point_stops_the_command_line_with_one_line(tmp_path):
    site = plugin.write_package(tmp_path, entry="triviads.missing:DATASET")
    proc = subprocess.run(
        [sys.executable, "-m", "spader.cli", "config", "show"],
        env=plugin.env_with(site),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("spader: error: dataset entry point 'trivia = triviads.missing:DATASET'")
    assert "ModuleNotFoundError" in line


def test_an_entry_points_module_that_imports_the_package_is_told_why(tmp_path):
    module = "from spader.data.records import Drop\n" + plugin.ENTRY  # imports the configuration
    site = plugin.write_package(tmp_path, module=module)
    proc = subprocess.run(
        [sys.executable, "-m", "spader.cli", "config", "show"],
        env=plugin.env_with(site),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert (
        "entry point 'trivia = triviads:DATASET'" in proc.stderr and "'module:function' paths" in proc.stderr
    )


def test_an_entry_point_adds_its_dataset_to_the_configuration(tmp_path):
    site = plugin.write_package(tmp_path)
    code = (
        "from spader.config import DATASETS, resolved_config; from spader.config.model import MixCounts; "
        "import sys; c = resolved_config(sys.argv[1]); "
        "print(DATASETS, MixCounts().trivia, sorted(c['datasets']['trivia']['files']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "config" / "config.yaml")],
        env=plugin.env_with(site),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == (
        "('qampari', 'mintaka', 'webqsp', 'quest', 'trivia') 0 ['trivia_test.jsonl', 'trivia_train.jsonl']"
    )
