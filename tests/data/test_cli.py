"""`python -m spader.data normalize`: JSON Lines and parquet outputs with the drop counts beside them,
and the datasets/mix config sections through the project's schema check."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from spader.config import ConfigError, check_config, resolved_config
from spader.data import normalize_release, read_records, record_schema
from spader.data.layout import dump_jsonl

REPO = Path(__file__).resolve().parents[2]

ROWS = [
    {
        "qid": "1__wikidata_simple__dev",
        "question_text": "Which films were directed by Ilse Varga?",
        "answer_list": [
            {"answer_text": "The Salt Orchard", "aliases": ["Salt Orchard"]},
            {"answer_text": "Winter Quay", "aliases": []},
        ],
    },
    {
        "qid": "2__wikidata_simple__dev",
        "question_text": "Which rivers flow into Lake Morrow?",
        "answer_list": [],
    },
]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spader.data", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_normalize_cli_outputs(tmp_path, suffix):
    archive = tmp_path / "qampari.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("qampari_data/dev_data.jsonl", dump_jsonl(ROWS))
    out = tmp_path / "out" / f"dev.{suffix}"
    proc = _cli(
        "normalize", "--dataset", "qampari", "--split", "dev", "--input", str(archive), "--output", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    expected, _ = normalize_release("qampari", "dev", archive)
    assert read_records(out, record_schema("qampari")).to_dicts() == expected
    drops = json.loads((tmp_path / "out" / "dev.drops.json").read_text())
    assert drops == {
        "dataset": "qampari",
        "split": "dev",
        "source_file": "qampari_data/dev_data.jsonl",
        "read": 2,
        "kept": 1,
        "dropped": {"empty_answer_list": 1},
    }
    assert "qampari dev: read 2, kept 1, dropped {'empty_answer_list': 1}" in proc.stderr


def test_normalize_cli_rejects_other_suffixes(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps({"query": "q", "docs": ["A"]}) + "\n")
    proc = _cli(
        "normalize",
        "--dataset",
        "quest",
        "--split",
        "test",
        "--input",
        str(path),
        "--output",
        str(tmp_path / "out.csv"),
    )
    assert proc.returncode == 2 and "output must end in .jsonl or .parquet" in proc.stderr


def _config() -> dict:
    return resolved_config(REPO / "config" / "config.yaml")


def test_hub_source_passes_the_schema_and_a_bad_one_names_its_key():
    cfg = _config()
    cfg["datasets"]["quest"]["files"]["train_aug.jsonl"] = {
        "url": None,
        "hub": {"repo_id": "cmalaviya/quest", "filename": "train_aug.jsonl"},
    }
    check_config(cfg)
    cfg["datasets"]["quest"]["files"]["train_aug.jsonl"]["hub"] = {
        "filename": "train_aug.jsonl",
        "format": "tsv",
    }
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert "datasets.quest.files.train_aug.jsonl.hub" in str(err.value)


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda m: m["counts"].update(quest=-1), "mix.counts.quest"),
        (lambda m: m["counts"].update(nq=5), "mix.counts.nq"),
        (lambda m: m.update(val_per_dataset="two"), "mix.val_per_dataset"),
        (lambda m: m.update(eval_limit=0), "mix.eval_limit"),
    ],
)
def test_mix_section_errors_name_the_key(edit, key):
    cfg = _config()
    edit(cfg["mix"])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_config(cfg)


def test_data_package_stays_in_the_pure_core():
    """spader.data and spader.demo import no framework (verl, ray, sglang, snakemake) and no heavy
    service library at import time (ARCHITECTURE.md, layers)."""
    code = (
        "import sys, spader.data, spader.data.__main__, spader.demo; "
        "heavy = ('verl', 'ray', 'sglang', 'snakemake', 'mlflow', 'torch', 'huggingface_hub', 'datasets'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
