"""The expensive-output guard's decision and the recompute-on-purpose command, without Snakemake
(the workflow hands the guard its planned jobs; tests/workflow/test_demo.py runs both through the
demo's real DAG)."""

from __future__ import annotations

import sys

import pytest

from spader.infra.replace_guard import (
    PlannedJob,
    guard_message,
    main,
    move_workdir_aside,
    rerun,
    snakemake_command,
    unintended_replacements,
)


def _chain(forced: str | None = None, existing=("index", "train", "export", "eval")) -> list[PlannedJob]:
    """index -> train -> export -> eval -> table, every job planned (something upstream changed)."""
    rules = {
        "index": "build_bm25_index",
        "train": "train_policy",
        "export": "export_checkpoint",
        "eval": "evaluate_policy",
        "table": "aggregate_results",
    }
    keys = list(rules)
    return [
        PlannedJob(
            key=k,
            rule=rules[k],
            label=f"{rules[k]} (x)",
            existing=[f"results/{k}.out"] if k in existing else [],
            forced=k == forced,
            upstream=keys[i - 1 : i],
        )
        for i, k in enumerate(keys)
    ]


def test_existing_expensive_outputs_are_not_replaced_unless_this_run_forced_them():
    blocked = unintended_replacements(_chain())
    assert [j.key for j in blocked] == ["index", "train", "export", "eval"]  # the table is cheap
    # forcing a job makes it and everything downstream intended, not what is upstream of it
    assert [j.key for j in unintended_replacements(_chain(forced="train"))] == ["index"]
    assert unintended_replacements(_chain(forced="index")) == []
    # outputs that do not exist (or are incomplete, which the workflow leaves out) are no result
    assert unintended_replacements(_chain(existing=())) == []
    message = guard_message(unintended_replacements(_chain(forced="export")))
    assert "would replace 2 expensive result(s)" in message
    assert "  build_bm25_index (x): results/index.out" in message
    assert "spader rerun results/index.out results/train.out -- " in message


def test_the_guard_walks_a_deep_plan_without_recursion():
    jobs = [
        PlannedJob(
            str(i), "evaluate_policy", str(i), ["o"], forced=i == 0, upstream=[str(i - 1)] if i else []
        )
        for i in range(5000)
    ]
    assert unintended_replacements(list(reversed(jobs))) == []


def test_recompute_runs_snakemake_with_forcerun_last(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ran = []
    assert (
        rerun(["results/q/eval/spader/quest.json"], ["--cores", "1", "results/q/f1.tsv"], run=ran.append)
        is None
    )
    assert ran == [[sys.executable, "-m", "snakemake", "--cores", "1", "results/q/f1.tsv", "--forcerun",
                    "results/q/eval/spader/quest.json"]]  # fmt: skip
    assert snakemake_command(["evaluate_policy"], [])[-2:] == ["--forcerun", "evaluate_policy"]


def test_retraining_from_scratch_moves_the_checkpoints_aside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    final = "results/q/train/spader/final.json"
    work = tmp_path / "results/q/train/spader/work"
    (work / "checkpoints").mkdir(parents=True)
    ran = []
    rerun([final], ["-n"], from_scratch=True, run=ran.append)  # a dry run moves nothing
    assert work.is_dir() and ran[-1][-2:] == ["--forcerun", final]
    (work / "trainer.lock").write_text("{}")
    with pytest.raises(ValueError, match="a training job holds"):
        move_workdir_aside(final)
    (work / "trainer.lock").unlink()
    rerun([final], ["--cores", "1"], from_scratch=True, run=ran.append)
    assert not work.exists()
    (moved,) = work.parent.glob("work.replaced-*")
    assert (moved / "checkpoints").is_dir()  # kept, not deleted
    with pytest.raises(ValueError, match="applies to training records"):
        rerun(["results/q/eval/spader/quest.json"], [], from_scratch=True, run=ran.append)


def test_the_command_line_splits_its_options_from_snakemakes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ran = []
    monkeypatch.setattr("spader.infra.replace_guard.subprocess.call", lambda cmd: ran.append(cmd) or 0)
    assert main(["a.json", "b.json", "--", "--profile", "slurm", "-n"]) == 0
    assert ran[-1][3:] == ["--profile", "slurm", "-n", "--forcerun", "a.json", "b.json"]
    with pytest.raises(SystemExit):
        main(["a.json", "--from-scratch"])


def test_an_output_named_by_an_absolute_path_inside_the_working_directory_is_recomputed(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    ran = []
    wanted = "results/q/eval/spader/quest.json"
    for named in (str(tmp_path / wanted), f"./{wanted}", "results//q/eval/../eval/spader/quest.json"):
        rerun([named], ["-n"], run=ran.append)
        assert ran[-1][-2:] == ["--forcerun", wanted], named
    elsewhere = tmp_path / "elsewhere"
    rerun([str(elsewhere / wanted)], ["-n", "-d", str(elsewhere)], run=ran.append)  # snakemake's -d
    assert ran[-1][-2:] == ["--forcerun", wanted]
    with pytest.raises(
        ValueError, match=r"/outside/results/x.json is outside the directory the workflow runs in"
    ):
        rerun(["/outside/results/x.json"], [], run=ran.append)
    assert rerun(["evaluate_policy"], [], run=ran.append) is None and ran[-1][-1] == "evaluate_policy"
    final = tmp_path / "results/q/train/spader/final.json"  # --from-scratch takes one too
    (final.parent / "work").mkdir(parents=True)
    rerun([str(final)], [], from_scratch=True, run=ran.append)
    assert not (final.parent / "work").exists() and ran[-1][-1] == "results/q/train/spader/final.json"


def test_snakemake_finds_the_rule_of_an_absolute_path(tmp_path):
    """What Snakemake plans for it (it said "no rule produces" an absolute path)."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    target = "results/demo/data/eval/quest.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "spader.infra.replace_guard", str(tmp_path / target), "--", "-n", target, "-s",
         str(repo / "workflow" / "Snakefile"), "-d", str(tmp_path), "--configfile", str(repo / "config" / "demo.yaml")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "export_eval_set" in out and "No rule" not in out and "no rule" not in out
