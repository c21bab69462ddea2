"""The MLflow store follows its working tree: a tree copied (or moved) with its store writes its
jobs' artifacts only into itself, and finds the artifacts copied with it; a store shared by
several trees (an absolute path) is left as it is. Jobs run through the workflow glue with the tree
as their working directory, on a real MLflow SQLite store."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest

MLFLOW = {
    "enabled": True,
    "tracking_uri": "sqlite:///results/mlflow/mlflow.db",
    "experiment": "spader",
    "artifact_root": "results/mlflow/artifacts",
    "state_dir": "results/mlflow",
    "stale_run_hours": 72,
}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, str]:
    """A working tree with a store that recorded one job (creating a store is the slow part)."""
    tree = tmp_path_factory.mktemp("template") / "tree"
    tree.mkdir()
    return tree, _job(tree, "first")


def _job(tree: Path, name: str, cfg: dict = MLFLOW) -> str:
    """One job as a workflow script runs it, in ``tree`` (its working directory): the glue's MLflow
    run, its output logged as an artifact. Returns the run's id."""
    from spader.infra.glue import job

    out = Path("results/jobs") / f"{name}.txt"
    outputs = type("Outputs", (list,), {"items": lambda self: [("out", str(out))]})([str(out)])
    smk = SimpleNamespace(
        rule="tree_test", log=[], scriptdir=str(tree), config={"mlflow": cfg}, input=[], output=outputs,
        wildcards=SimpleNamespace(items=lambda: [("name", name)]), params=SimpleNamespace(items=lambda: []),
    )  # fmt: skip
    here = Path.cwd()
    os.chdir(tree)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with job(smk) as run:
            out.write_text(f"written by {name}\n")
    finally:
        os.chdir(here)
    return run.info.run_id


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def _client(tree: Path) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{tree}/results/mlflow/mlflow.db")


@pytest.mark.parametrize("how", ["copied", "moved"])  # held out: a tree moved, its old place gone
def test_a_tree_copied_with_its_store_writes_only_into_itself(template, tmp_path, how):
    original = tmp_path / "original"
    shutil.copytree(template[0], original)
    first = template[1]
    assert (original / "results/mlflow/artifacts").exists()
    other = tmp_path / "other"
    if how == "copied":
        shutil.copytree(original, other)
    else:
        original.rename(other)
    before = _snapshot(original) if original.exists() else None

    second = _job(other, "second")

    if how == "copied":
        assert _snapshot(original) == before  # not a byte written in the tree it came from
    else:
        assert not original.exists()  # nothing recreated at the old place
    client = _client(other)
    for run_id, name in ((first, "first"), (second, "second")):
        uri = client.get_run(run_id).info.artifact_uri
        assert uri.startswith((other / "results/mlflow/artifacts").as_uri() + "/"), uri
        local = client.download_artifacts(run_id, f"outputs/{name}.txt", str(tmp_path / f"dl-{how}-{name}"))
        assert Path(local).read_text() == f"written by {name}\n"
        assert str(Path(local).resolve()).startswith(str(tmp_path / f"dl-{how}-{name}"))
    experiment = client.get_experiment_by_name("spader")
    assert experiment.artifact_location == (other / "results/mlflow/artifacts").as_uri()


def test_a_store_outside_the_tree_is_left_as_it_is(tmp_path):
    """Two trees sharing one store by its absolute path: each job's artifacts stay where the store
    says (the shared experiment's directory); nothing is rewritten."""
    shared = tmp_path / "shared"
    cfg = {
        **MLFLOW,
        "tracking_uri": f"sqlite:///{shared}/mlflow.db",
        "artifact_root": str(shared / "artifacts"),
    }
    shared.mkdir()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first = _job(a, "first", cfg)
    moved_cfg = {**cfg, "artifact_root": "results/mlflow/artifacts"}  # this tree would like its own
    second = _job(b, "second", moved_cfg)
    client = mlflow.MlflowClient(tracking_uri=cfg["tracking_uri"])
    for run_id in (first, second):
        assert client.get_run(run_id).info.artifact_uri.startswith((shared / "artifacts").as_uri())
    assert not (b / "results/mlflow/artifacts").exists()


def test_follow_tree_rewrites_only_locations_under_the_recorded_one(template, tmp_path):
    from spader.infra.tracking import MlflowSettings, follow_tree

    tree = tmp_path / "tree"
    shutil.copytree(template[0], tree)
    settings = MlflowSettings(MLFLOW, tree)
    client = _client(tree)
    old = "file:///elsewhere/results/mlflow/artifacts"
    exp = client.create_experiment("moved", artifact_location=old)
    run = client.create_run(exp).info.run_id
    lookalike = client.create_experiment("other", artifact_location=old + "2")  # a prefix, not a parent
    other_run = client.create_run(lookalike).info.run_id
    assert follow_tree(settings, old)
    assert client.get_run(run).info.artifact_uri == f"{settings.artifact_root.as_uri()}/{run}/artifacts"
    assert client.get_run(other_run).info.artifact_uri.startswith(old + "2/")
    assert not follow_tree(settings, settings.artifact_root.as_uri())
