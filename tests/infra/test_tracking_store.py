"""A damaged or replaced MLflow store is one line naming it: cut short, zeroed, replaced by
another file, by a directory or by another SQLite database; checked before MLflow touches it
(its own errors are dozens of frames naming no file), at the workflow's start too."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from spader.infra import tracking
from spader.infra.tracking import MlflowSettings, TrackingStoreError, end_pipeline_run, start_pipeline_run

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def _cfg(root: Path) -> dict:
    return {
        "mlflow": {
            "enabled": True,
            "tracking_uri": f"sqlite:///{root}/mlflow.db",
            "experiment": "store-test",
            "artifact_root": str(root / "artifacts"),
            "state_dir": str(root / "state"),
        }
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> bytes:
    """The bytes of a real MLflow store holding a pipeline run."""
    root = tmp_path_factory.mktemp("store")
    start_pipeline_run(_cfg(root), ["x"], root)
    return (root / "mlflow.db").read_bytes()


def _other_database(path: Path) -> None:
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE notes (text TEXT)")
        con.execute("INSERT INTO notes VALUES ('not mlflow')")


DAMAGE = {
    "cut-in-half": (lambda db, data: db.write_bytes(data[: len(data) // 2]), "is damaged"),
    "cut-to-one-page": (lambda db, data: db.write_bytes(data[:4096]), "is damaged"),
    "empty": (lambda db, data: db.write_bytes(b""), "is empty (cut short?)"),
    "zeroed": (lambda db, data: db.write_bytes(bytes(len(data))), "is not a SQLite database"),
    "text": (lambda db, data: db.write_text("runs: []\n" * 100), "is not a SQLite database"),
    "middle-overwritten": (
        lambda db, data: db.write_bytes(data[:8192] + b"\xff" * 65536 + data[8192 + 65536 :]),
        "is damaged",
    ),
    "directory": (lambda db, data: (db.unlink(), db.mkdir()), "is not a file"),
    "other-database": (
        lambda db, data: (db.unlink(), _other_database(db)),
        "is a SQLite database without MLflow's tables",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_store_is_named_in_one_line(tmp_path, store, damage):
    db = tmp_path / "mlflow.db"
    db.write_bytes(store)
    make, what = DAMAGE[damage]
    make(db, store)
    tracking._CHECKED_STORES.clear()
    with pytest.raises(TrackingStoreError) as err:
        start_pipeline_run(_cfg(tmp_path), ["x"], tmp_path)
    message = str(err.value)
    assert message.startswith(f"MLflow store {db} {what}") and "\n" not in message, message
    assert "mlflow.enabled: false" in message
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "pipeline_run.json").write_text('{"experiment_id": "1", "run_id": "0"}')
    with pytest.raises(TrackingStoreError):  # the run's end, when it was damaged while it ran
        end_pipeline_run(_cfg(tmp_path), "FAILED", tmp_path)


def test_an_intact_store_and_a_missing_one_are_used(tmp_path, store):
    (tmp_path / "mlflow.db").write_bytes(store)
    start_pipeline_run(_cfg(tmp_path), ["x"], tmp_path)
    end_pipeline_run(_cfg(tmp_path), "FINISHED", tmp_path)
    fresh = tmp_path / "fresh"
    start_pipeline_run(_cfg(fresh), ["x"], fresh)  # none yet: MLflow creates it
    tracking.check_store(MlflowSettings(_cfg(fresh)["mlflow"], fresh))


@pytest.mark.slow
def test_the_workflow_names_a_replaced_store_in_one_line(tmp_path, smk):
    work = smk.copy_repo(tmp_path / "repo")
    db = work / "results" / "mlflow" / "mlflow.db"
    db.parent.mkdir(parents=True)
    db.write_text("not a database\n")
    proc = subprocess.run(
        [SNAKEMAKE, "resources/demo/datasets/quest/test.jsonl", "--cores", "1", "--configfile", "config/demo.yaml"],
        cwd=work, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"MLflow store {db} is not a SQLite database (replaced by another file?)" in out, out[-3000:]
    # Snakemake's way with an error of a hook: the message, and the hook's line (not 21-34 frames)
    assert "Traceback" not in out and out.count('File "') <= 1 and "sqlalchemy" not in out, out[-3000:]
    assert not (work / "resources/demo/datasets").exists()  # no job ran
