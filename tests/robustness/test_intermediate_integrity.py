"""Corrupted intermediates are caught by their consumers: whole lines deleted from a normalized
file, a truncated or garbled training parquet, a flipped byte in a model directory, a download
damaged in place. Each stage records rows, bytes and sha256 of what it writes (a manifest of every
file for a directory); the next one checks before reading and names the file and the rule that
rebuilds it. Records live in one hidden directory per tree (``results/.integrity/``), hold relative
paths only, and a missing record is reported where one is expected. The releases are the bundled
demo files (real formats)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from spader.config.model import MixConfig
from spader.data import export_rl_dataset, mix_training_set, normalize_file
from spader.infra import integrity
from spader.infra.download import fetch, keep_path
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
            MixConfig.model_validate({"counts": COUNTS, "val_per_dataset": 1}),
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
            MixConfig.model_validate({"counts": COUNTS, "val_per_dataset": 0}),
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


def test_file_without_record_is_accepted_outside_the_trees_and_a_rewrite_replaces_the_record(
    pipeline, tmp_path
):
    path = pipeline["train"]
    integrity.record_path(path).unlink()
    assert integrity.verify(path) is None  # files from outside the pipeline have no record
    other = tmp_path / "x.jsonl"
    other.write_text('{"a": 1}\n')
    integrity.write_record(other)
    other.write_text('{"a": 1}\n{"a": 2}\n')
    integrity.write_record(other)
    assert integrity.verify(other).rows == 2


def _flip(path: Path, at: int) -> None:
    """One byte changed in place; size and modification time kept (what a bad disk or a stray
    write leaves behind)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns


def _model_dir(root: Path) -> Path:
    model = root / "results" / "demo" / "models" / "spader"
    (model / "tokenizer").mkdir(parents=True)
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (model / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    (model / "tokenizer" / "vocab.json").write_text('{"a": 0}')
    return model


def test_a_directory_output_gets_a_manifest_and_a_flipped_byte_is_caught(tmp_path):
    model = _model_dir(tmp_path)
    with job(_smk(tmp_path, "export_checkpoint", [], [str(model)])):
        pass
    rec = integrity.read_record(model)
    assert rec.kind == "directory" and rec.producer == "export_checkpoint"
    assert [f[0] for f in rec.files] == ["config.json", "model.safetensors", "tokenizer/vocab.json"]
    assert rec.size == sum((model / f[0]).stat().st_size for f in rec.files)
    (model / ".snakemake_timestamp").write_text("")  # what Snakemake adds after the job, then touches
    with job(_smk(tmp_path, "evaluate_policy", [str(model)], [])):
        pass  # intact: accepted
    _flip(model / "model.safetensors", 5000)
    ran = []
    with pytest.raises(IntegrityError) as err, job(_smk(tmp_path, "evaluate_policy", [str(model)], [])):
        ran.append(True)
    assert not ran
    message = str(err.value)
    assert message.startswith(f"{model} was changed after it was written")
    assert "model.safetensors changed: its sha256 is" in message and "rule 'export_checkpoint'" in message
    assert "before rule 'evaluate_policy' reads it" in message


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda m: (m / "tokenizer" / "vocab.json").unlink(), "1 of the 3 files rule 'x' wrote are missing"),
        (
            lambda m: (m / "extra.bin").write_bytes(b"1"),
            "1 files were added after rule 'x' wrote it (extra.bin)",
        ),
        (lambda m: (m / "config.json").write_text("{}"), "config.json has 2 bytes, rule 'x' wrote 39"),
        (lambda m: shutil.rmtree(m) or m.write_text("x"), "it is a file, rule 'x' wrote a directory"),
    ],
    ids=["file-removed", "file-added", "file-resized", "replaced-by-a-file"],
)
def test_other_damage_to_a_directory(tmp_path, damage, fragment):
    model = _model_dir(tmp_path)
    integrity.write_record(model, producer="x")
    damage(model)
    with pytest.raises(IntegrityError, match="was changed after it was written") as err:
        integrity.verify(model)
    assert fragment in str(err.value)


def _demo_download(tmp_path: Path) -> tuple[Path, Path]:
    """A release downloaded the way rule download_dataset does: into resources/, from a source
    named relative to the repository (``file:`` URL)."""
    repo = tmp_path / "repo"
    (repo / "resources" / "demo" / "quest").mkdir(parents=True)
    source = repo / "resources" / "demo" / "quest" / "test.jsonl"
    source.write_text('{"query": "Novels by Robert B. Parker", "docs": ["High Profile"]}\n')
    dest = tmp_path / "work" / "resources" / "demo" / "datasets" / "quest" / "test.jsonl"
    fetch(str(source), dest, record_source="file:resources/demo/quest/test.jsonl")
    return source, dest


def test_a_download_damaged_in_place_is_caught_by_the_next_job_that_reads_it(tmp_path):
    _, dest = _demo_download(tmp_path)
    records = dest.parents[4] / "results" / "demo" / "data" / "normalized" / "quest" / "test.jsonl"
    _flip(dest, dest.read_bytes().index(b"Parker"))  # the question's text, same size and time
    ran = []
    smk = _smk(tmp_path, "normalize_dataset", [str(dest)], [str(records)])
    with pytest.raises(IntegrityError) as err, job(smk):
        ran.append(True)
    assert not ran and not records.exists()  # the damaged question never reaches the records
    assert str(dest) in str(err.value) and "its sha256 is" in str(err.value)
    assert "before rule 'normalize_dataset' reads it" in str(err.value)


def test_a_missing_record_is_reported_where_one_is_expected(tmp_path, pipeline):
    # under results/: every job records its outputs
    out = tmp_path / "results" / "demo" / "data" / "mix" / "stats.json"
    out.parent.mkdir(parents=True)
    with job(_smk(tmp_path, "mix_training_set", [], [str(out)])):
        out.write_text('{"n": 1}')
    integrity.record_path(out).unlink()
    with pytest.raises(
        IntegrityError, match=r"has no integrity record .* is missing, before rule 'x' reads it"
    ) as err:
        with job(_smk(tmp_path, "x", [str(out)], [])):
            pass
    assert "every output under results/ is recorded by the job that writes it" in str(err.value)
    # an output known to be intact (written before records existed) is recorded as it is
    assert f"spader integrity record {out}" in str(err.value)
    assert integrity.main(["record", str(out), "--producer", "mix_training_set"]) == 0
    assert integrity.main(["verify", str(out)]) == 0 and integrity.verify(out).producer == "mix_training_set"
    out.write_text('{"n": 7}')
    integrity.set_job_rule(None)
    assert integrity.main(["verify", str(out)]) == 1
    # a download: its record is gone while its verified twin is there
    _, dest = _demo_download(tmp_path)
    integrity.record_path(dest).unlink()
    with pytest.raises(IntegrityError, match="it was downloaded") as err:
        integrity.verify_inputs([str(dest)], rule="normalize_dataset")
    assert f"Delete {dest} and {keep_path(dest)}" in str(err.value)
    with pytest.raises(Exception, match="integrity record .* is gone, so it cannot be checked"):
        fetch("file:unused", dest, record_source="file:resources/demo/quest/test.jsonl")
    # outside the trees (a file from outside the pipeline): no record, nothing to check
    integrity.record_path(pipeline["train"]).unlink()
    assert integrity.verify_inputs([str(pipeline["train"])]) == 0


def test_records_live_in_one_hidden_directory_with_relative_paths_and_move_with_the_tree(tmp_path):
    model = _model_dir(tmp_path)
    table = tmp_path / "results" / "demo" / "data" / "mix" / "train.jsonl"
    table.parent.mkdir(parents=True)
    table.write_text('{"a": 1}\n')
    with job(_smk(tmp_path, "some_rule", [], [str(model), str(table)])):
        pass
    _, dest = _demo_download(tmp_path)
    store = tmp_path / "results" / integrity.STORE
    assert integrity.record_path(table) == store / "demo" / "data" / "mix" / "train.jsonl.json"
    assert integrity.record_path(model) == store / "demo" / "models" / "spader.json"
    assert integrity.record_path(dest).is_relative_to(tmp_path / "work" / "resources" / integrity.STORE)
    # nothing beside the data: the user sees only what jobs wrote
    beside = [p for p in (tmp_path / "results").rglob("*") if integrity.STORE not in p.parts]
    assert not [p for p in beside if p.name.endswith((".integrity", ".json.json")) or p.suffix == ".tmp"]
    # no absolute path in any record
    for record in [*store.rglob("*.json"), *(tmp_path / "work").rglob("*.json")]:
        text = record.read_text()
        assert str(tmp_path) not in text and '"/' not in text, (record, text)
    assert integrity.read_record(dest).extra["source"] == "file:resources/demo/quest/test.jsonl"
    # the tree moved elsewhere (a copy of the repository): its records still hold
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "results", moved / "results")
    assert integrity.verify(moved / "results" / "demo" / "models" / "spader").kind == "directory"
    assert integrity.verify(moved / "results" / "demo" / "data" / "mix" / "train.jsonl").rows == 1
    _flip(moved / "results" / "demo" / "models" / "spader" / "config.json", 3)
    integrity.set_job_rule(None)  # the next job (a process of its own) hashes its inputs again
    with pytest.raises(IntegrityError, match="config.json changed"):
        integrity.verify(moved / "results" / "demo" / "models" / "spader")


def test_records_of_the_earlier_layout_are_moved_into_the_store(tmp_path):
    table = tmp_path / "results" / "demo" / "data" / "mix" / "val.jsonl"
    table.parent.mkdir(parents=True)
    table.write_text('{"a": 1}\n{"a": 2}\n')
    rec = integrity.write_record(table, producer="mix_training_set")
    legacy = table.with_name(table.name + ".integrity")
    legacy.write_text(
        json.dumps({**json.loads(integrity.record_path(table).read_text()), "file": table.name})
    )
    integrity.record_path(table).unlink()
    assert integrity.verify(table).sha256 == rec.sha256
    assert integrity.record_path(table).exists() and not legacy.exists()


def test_jobs_writing_records_at_once_in_one_directory(tmp_path):
    """Many writers (jobs on several nodes share the results tree): every record is whole."""
    outs = tmp_path / "results" / "demo" / "eval"
    outs.mkdir(parents=True)
    files = [outs / f"{i}.jsonl" for i in range(64)]
    for i, f in enumerate(files):
        f.write_text(f'{{"x": {i}}}\n' * (i + 1))

    def write(part):
        for f in part:
            integrity.write_record(f, producer="evaluate_policy")

    threads = [threading.Thread(target=write, args=(files[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(integrity.verify(f).rows == i + 1 for i, f in enumerate(files))
    assert not list((tmp_path / "results" / integrity.STORE).rglob("*.tmp"))


def test_a_download_edited_by_hand_is_refused_before_a_job_reads_it(tmp_path):
    """A release file changed in place is damage: the job stops and names the download rule that
    fetches it again (a different release is a change of the configured source)."""
    release = tmp_path / "test.jsonl"
    release.write_text('{"query": "a"}\n')
    integrity.write_record(release, producer="download_dataset", extra={"source": "file:x/test.jsonl"})
    release.write_text('{"query": "Edited: a"}\n')
    with pytest.raises(IntegrityError, match="rule 'download_dataset'"):
        integrity.verify_inputs([str(release)], rule="normalize_dataset")
