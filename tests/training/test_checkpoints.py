"""Resume logic: which checkpoint of a training work directory a rerun starts from, and how the
per-step metrics of several attempts combine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from spader.training.checkpoints import (
    TRACKER_FILE,
    complete_checkpoints,
    latest_checkpoint,
    new_metrics_file,
    prune_checkpoints,
    read_step_metrics,
    resume_overrides,
    retire_checkpoints,
)


def make_step(ckpt_dir: Path, step: int, *, world_size: int = 2, ranks=None, data: bool = True) -> Path:
    """A ``global_step_<step>`` directory laid out as verl 0.9.1 writes it."""
    d = ckpt_dir / f"global_step_{step}"
    actor = d / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world_size}))
    for r in range(world_size) if ranks is None else ranks:
        torch.save({}, actor / f"model_world_size_{world_size}_rank_{r}.pt")
        torch.save({}, actor / f"optim_world_size_{world_size}_rank_{r}.pt")
    (actor / "huggingface").mkdir()
    if data:
        torch.save({}, d / "data.pt")
    return d


def track(ckpt_dir: Path, step) -> None:
    (ckpt_dir / TRACKER_FILE).write_text(str(step))


def test_empty_or_missing_directory_means_start_from_scratch(tmp_path):
    assert latest_checkpoint(tmp_path / "nope") is None
    assert latest_checkpoint(tmp_path) is None
    assert resume_overrides(None) == ["trainer.resume_mode=disable"]


def test_tracker_and_newest_complete_checkpoint_agree(tmp_path):
    for s in (100, 200, 300):
        make_step(tmp_path, s)
    track(tmp_path, 300)
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.step == 300
    assert ckpt.path == tmp_path / "global_step_300"
    assert ckpt.actor_dir == tmp_path / "global_step_300" / "actor"


@pytest.mark.parametrize(
    "case, expected",
    [
        ("save killed before data.pt", 200),  # global_step_300 without data.pt
        ("save killed before rank 1 shard", 200),  # global_step_300 with rank 0 only
        ("tracker names a deleted directory", 200),  # tracker 300, directory removed
        ("tracker missing", 300),  # async save never writes it; the complete dir counts
        ("tracker behind a complete newer save", 300),  # killed between save and tracker write
        ("tracker holds garbage", 300),
    ],
)
def test_picker_resumes_from_newest_complete_checkpoint(tmp_path, case, expected, caplog):
    make_step(tmp_path, 100)
    make_step(tmp_path, 200)
    if case == "save killed before data.pt":
        make_step(tmp_path, 300, data=False)
        track(tmp_path, 200)
    elif case == "save killed before rank 1 shard":
        make_step(tmp_path, 300, ranks=[0])
        track(tmp_path, 200)
    elif case == "tracker names a deleted directory":
        shutil.rmtree(make_step(tmp_path, 300))
        track(tmp_path, 300)
    elif case == "tracker missing":
        make_step(tmp_path, 300)
    elif case == "tracker behind a complete newer save":
        make_step(tmp_path, 300)
        track(tmp_path, 200)
    elif case == "tracker holds garbage":
        make_step(tmp_path, 300)
        track(tmp_path, "3 00\x00")
    assert latest_checkpoint(tmp_path).step == expected
    if expected == 200 and case != "tracker names a deleted directory":
        assert "ignoring incomplete checkpoint" in caplog.text


def test_only_incomplete_checkpoints_mean_scratch(tmp_path):
    make_step(tmp_path, 100, data=False)
    track(tmp_path, 100)
    assert complete_checkpoints(tmp_path) == []
    assert latest_checkpoint(tmp_path) is None


def test_other_directories_are_ignored(tmp_path):
    make_step(tmp_path, 7)
    (tmp_path / "global_step_x").mkdir()
    (tmp_path / "global_step_9").write_text("a file, not a directory")
    (tmp_path / "hydra").mkdir()
    assert [c.step for c in complete_checkpoints(tmp_path)] == [7]


def test_resume_overrides_name_the_absolute_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_step(Path("ck"), 40)
    track(Path("ck"), 40)
    ov = resume_overrides(latest_checkpoint("ck"))
    assert ov == [
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path / 'ck' / 'global_step_40'}",
    ]


@pytest.mark.slow
def test_real_verl_checkpoint_is_complete(tmp_path, fsdp_actor):
    """The layout verl's FSDPCheckpointManager writes (2 ranks) plus the trainer's data.pt."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    step_dir = tmp_path / "global_step_5"
    shutil.copytree(fsdp_actor, step_dir / "actor")
    assert latest_checkpoint(tmp_path) is None  # no data.pt yet: the trainer writes it after the actor
    torch.save(StatefulDataLoader(list(range(8)), batch_size=2).state_dict(), step_dir / "data.pt")
    track(tmp_path, 5)
    assert latest_checkpoint(tmp_path).step == 5


def test_metrics_of_several_attempts(tmp_path):
    first = new_metrics_file(tmp_path)
    assert first.name == "attempt_001.jsonl"
    first.write_text(
        "\n".join(json.dumps({"step": s, "data": {"loss": float(s), "first": True}}) for s in (1, 2, 3))
        + '\n{"step": 4, "data": {"lo'  # killed mid-write
    )
    second = new_metrics_file(tmp_path)
    assert second.name == "attempt_002.jsonl"
    # resumed from the step-2 checkpoint: step 3 is trained again; verl logs validation separately
    second.write_text(
        json.dumps({"step": 2, "data": {"val-core/f1": 0.25}})  # validation before resuming
        + "\n"
        + json.dumps({"step": 3, "data": {"loss": 30.0}})
        + "\n"
        + json.dumps({"step": 4, "data": {"loss": 40.0}})
        + "\n"
        + json.dumps({"step": 4, "data": {"val-core/f1": 0.5}})
        + "\n"
    )
    steps = read_step_metrics(tmp_path)
    assert list(steps) == [1, 2, 3, 4]
    assert steps[2] == {"loss": 2.0, "first": True, "val-core/f1": 0.25}  # joins the step's training metrics
    assert steps[3] == {"loss": 30.0}  # the later attempt replaces the step, stale keys do not survive
    assert steps[4] == {"loss": 40.0, "val-core/f1": 0.5}


def test_retention_holds_across_resumes(tmp_path):
    """verl deletes only the checkpoints its own process saved; at the start of an attempt the
    older ones beyond the kept count go (a save cut short after the newest complete one stays)."""
    for s in (100, 200, 300):
        make_step(tmp_path, s)
    remnant = tmp_path / "global_step_50"  # verl deleted its actor; its data loader state is left
    remnant.mkdir()
    torch.save({}, remnant / "data.pt")
    make_step(tmp_path, 400, ranks=[0])  # a save cut short
    track(tmp_path, 300)
    removed = prune_checkpoints(tmp_path, keep=2)
    assert sorted(d.name for d in removed) == ["global_step_100", "global_step_50"]
    assert sorted(d.name for d in tmp_path.glob("global_step_*")) == [
        "global_step_200",
        "global_step_300",
        "global_step_400",
    ]
    assert latest_checkpoint(tmp_path).step == 300
    assert prune_checkpoints(tmp_path, keep=None) == []  # keep all
    assert prune_checkpoints(tmp_path, keep=1)[0].name == "global_step_200"


def test_an_exported_training_keeps_only_its_final_checkpoint(tmp_path, caplog):
    """The export's retention rule: the intermediate checkpoints go, the final one stays, a newer
    step directory (never written by a finished training) is left alone; a final checkpoint that is
    incomplete or outside a work directory's checkpoints/ deletes nothing."""
    ckpt = tmp_path / "work" / "checkpoints"
    for step in (100, 200, 300):
        make_step(ckpt, step)
    make_step(ckpt, 50, data=False)  # a remnant
    make_step(ckpt, 400, data=False)  # newer than the final one
    track(ckpt, 300)
    with caplog.at_level("INFO", logger="spader.training.checkpoints"):
        removed = retire_checkpoints(ckpt / "global_step_300")
    assert sorted(d.name for d in removed) == ["global_step_100", "global_step_200", "global_step_50"]
    assert sorted(d.name for d in ckpt.iterdir() if d.is_dir()) == ["global_step_300", "global_step_400"]
    assert (
        "deleted 3 intermediate checkpoint(s)" in caplog.text
        and "kept the final one, step 300" in caplog.text
    )
    assert latest_checkpoint(ckpt).step == 300  # a re-export, or a resume, still finds it

    make_step(ckpt, 350)
    assert retire_checkpoints(ckpt / "global_step_400") == []  # incomplete: nothing goes
    elsewhere = tmp_path / "other"
    make_step(elsewhere, 1)
    make_step(elsewhere, 2)
    assert retire_checkpoints(elsewhere / "global_step_2") == [] and (elsewhere / "global_step_1").is_dir()
