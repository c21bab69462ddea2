"""Corrupted intermediates are caught by their consumers: whole lines deleted from a normalized
file, a truncated or garbled training parquet. Each stage records rows, bytes and sha256 of what
it writes; the next one checks before reading and names the file and the rule that rebuilds it.
The releases are the bundled demo files (real formats)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from spader.data import export_rl_dataset, mix_training_set, normalize_file
from spader.infra import integrity
from spader.infra.glue import job
from spader.infra.integrity import IntegrityError

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo"
COUNTS = {"qampari": 0, "mintaka": 0, "webqsp": 0, "quest": 4}


@pytest.fixture
def pipeline(tmp_path):
    """normalize (QUEST train + test) -> mix -> verl parquet, each as its rule would run it."""
    norm = tmp_path / "normalized" / "quest"
    out = {}
    integrity.set_job_rule("normalize_dataset")
    try:
        for split, name in (("train", "train_aug.jsonl"), ("test", "test.jsonl")):
            out[split] = norm / f"{split}.jsonl"
            normalize_file("quest", split, DEMO / "quest" / name, out[split])
        integrity.set_job_rule("mix_training_set")
        mix = tmp_path / "mix"
        mix_training_set(
            {"quest": out["train"]},
            {"quest": out["test"]},
            mix / "train.jsonl",
            mix / "val.jsonl",
            mix / "stats.json",
            counts=COUNTS,
            val_per_dataset=1,
        )
        integrity.set_job_rule("export_rl_dataset")
        verl = tmp_path / "verl"
        export_rl_dataset(
            mix / "train.jsonl", mix / "val.jsonl", verl / "train.parquet", verl / "val.parquet"
        )
    finally:
        integrity.set_job_rule(None)
    return {**out, "mix": mix, "parquet": verl / "train.parquet"}


def test_every_table_is_recorded(pipeline):
    rec = integrity.read_record(pipeline["train"])
    assert rec.producer == "normalize_dataset"
    assert rec.rows == len(pipeline["train"].read_text().splitlines()) > 4
    parquet = integrity.read_record(pipeline["parquet"])
    assert parquet.producer == "export_rl_dataset"
    assert parquet.rows == pl.read_parquet(pipeline["parquet"]).height == 4


def test_deleted_lines_in_a_normalized_file_stop_the_mix(pipeline, tmp_path):
    path = pipeline["train"]
    size = path.stat().st_size
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1] + lines[3:]))  # two whole, valid records gone
    with pytest.raises(IntegrityError) as err:
        mix_training_set(
            {"quest": path},
            {"quest": pipeline["test"]},
            tmp_path / "m" / "train.jsonl",
            tmp_path / "m" / "val.jsonl",
            tmp_path / "m" / "stats.json",
            counts=COUNTS,
        )
    message = str(err.value)
    assert message.startswith(f"{path} was changed after it was written")
    assert (
        f"it has {path.stat().st_size} bytes, rule 'normalize_dataset' wrote {size} bytes, {len(lines)} rows"
        in message
    )
    assert "rule 'normalize_dataset'" in message and "--forcerun normalize_dataset" in message
    assert not (tmp_path / "m" / "train.jsonl").exists()


def test_deleted_lines_detected_by_rows_when_the_size_is_kept(pipeline):
    """Deleted records replaced by padding of the same length: the row count tells."""
    path = pipeline["train"]
    data = path.read_bytes().split(b"\n")
    removed = len(data[1]) + 1
    path.write_bytes(b"\n".join(data[:1] + data[2:]).rstrip(b"\n") + b" " * removed + b"\n")
    with pytest.raises(
        IntegrityError, match=r"it has \d+ rows, rule 'normalize_dataset' wrote \d+ bytes, \d+ rows"
    ):
        integrity.verify(path)


def _smk(tmp_path, rule, inputs, outputs):
    """The parts of Snakemake's ``snakemake`` object that the glue reads (tracking off)."""
    mlflow = {"enabled": False, "tracking_uri": "sqlite:///x.db", "experiment": "e"}
    mlflow.update(artifact_root="a", state_dir="s")
    return SimpleNamespace(
        rule=rule,
        log=[str(tmp_path / f"{rule}.log")],
        wildcards=SimpleNamespace(items=lambda: []),
        input=inputs,
        output=outputs,
        params=SimpleNamespace(items=lambda: []),
        config={"mlflow": mlflow},
    )


@pytest.mark.parametrize("damage", ["truncate", "garble"])
def test_damaged_training_parquet_stops_the_training_job(pipeline, tmp_path, damage):
    path = pipeline["parquet"]
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:  # same size, one byte changed in the middle of a column chunk
        mid = len(data) // 2
        path.write_bytes(data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :])
    ran = []
    smk = _smk(tmp_path, "train_policy", [str(path), str(path.with_name("val.parquet"))], [])
    with pytest.raises(IntegrityError) as err, job(smk):
        ran.append(True)  # never reached: inputs are checked before the job's body
    assert not ran
    message = str(err.value)
    assert str(path) in message and "rule 'export_rl_dataset'" in message
    assert ("bytes" in message) if damage == "truncate" else ("sha256" in message)
    assert "train_policy" in message  # who was about to read it


def test_job_records_its_outputs_and_a_consumer_accepts_them(tmp_path):
    out = tmp_path / "stats.json"
    with job(_smk(tmp_path, "mix_training_set", [], [str(out)])):
        out.write_text(json.dumps({"n": 1}))
    rec = integrity.read_record(out)
    assert rec.producer == "mix_training_set" and rec.rows is None and rec.size == out.stat().st_size
    with job(_smk(tmp_path, "export_rl_dataset", [str(out)], [])):
        pass
    out.write_text(json.dumps({"n": 2}))  # same size, other content
    with pytest.raises(IntegrityError, match="sha256"), job(_smk(tmp_path, "x", [str(out)], [])):
        pass


def test_file_without_record_is_accepted_and_a_rewrite_replaces_the_record(pipeline, tmp_path):
    path = pipeline["train"]
    integrity.record_path(path).unlink()
    assert integrity.verify(path) is None  # files from outside the pipeline have no record
    other = tmp_path / "x.jsonl"
    other.write_text('{"a": 1}\n')
    integrity.write_record(other)
    other.write_text('{"a": 1}\n{"a": 2}\n')
    integrity.write_record(other)
    assert integrity.verify(other).rows == 2


def test_an_edited_release_file_is_an_input_not_damage(tmp_path):
    """Downloads are verified by the downloader; a release file edited by hand is a new input
    (Snakemake reruns what depends on it), so jobs do not refuse it."""
    release = tmp_path / "test.jsonl"
    release.write_text('{"query": "a"}\n')
    integrity.write_record(release, producer="download_dataset", extra={"source": "file:x/test.jsonl"})
    release.write_text('{"query": "Edited: a"}\n')
    assert integrity.verify_inputs([str(release)], rule="normalize_dataset") == 0
    with pytest.raises(IntegrityError):  # while a direct check still sees the difference
        integrity.verify(release)
