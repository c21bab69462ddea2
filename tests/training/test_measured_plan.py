"""The second run planned from the first (hardware.calibration naming earlier trainings' measured
records): a record written by the training's own code (spader.training.measure) for a paper job
replaces that job's step time, run hours, save cadence, host memory and checkpoint size; the other
variants of its backbone are scaled by it; a record of other hardware or of a CPU run changes
nothing and the job's notes say why; a malformed record is one line naming the file and the field."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from spader.planning import costs, plan
from spader.training.measure import measured_section, planned_section, step_record, write_planned

REPO = Path(__file__).resolve().parents[2]
#: the first run's steps after the warm-up, as multiples of twice the plan's low end
SPREAD = [1 + 0.01 * k for k in range(10)]


def _plan(tmp_path: Path, overlay: str = "") -> tuple[int, dict]:
    path = tmp_path / "overlay.yaml"
    path.write_text(overlay or "{}\n")
    lines: list[str] = []
    code = plan.main(["--root", str(REPO), "--configfile", str(path), "--json"], out=lines.append)
    return code, json.loads(lines[-1])


def _jobs(result: dict) -> dict[str, dict]:
    return {j["job"]: j for j in result["jobs"]}


def _planned_job(backbone: str, variant: str, overlay: Path | None = None) -> plan.Job:
    from spader.config import load_config

    files = [REPO / "config" / "config.yaml", *([overlay] if overlay else [])]
    config = load_config(*files, verl_config_dir=REPO / "config" / "verl")
    (job,) = plan.plan_config(
        config, REPO / "config" / "verl", only=lambda b, v: (b, v) == (backbone, variant)
    )
    return job


def _verl_steps(job: plan.Job, factor: float, *, warmup: float = 5.0) -> dict[int, dict]:
    """verl's metrics of a first run whose steps take ``factor`` x the plan's low end (x SPREAD), the
    first step (warm-up) ``warmup`` x, step 4 with a 30 s save."""
    est = job.time[job.path]["step"]
    total = sum(est.values())
    steps = {}
    for step, scale in enumerate([warmup / factor, *SPREAD], 1):
        f = factor * scale
        data = {"timing_s/step": total * f, "timing_s/gen": est["rollout"] * f,
                "timing_s/old_log_prob": est["old log-probs"] * f, "timing_s/update_actor": est["actor update"] * f,
                "perf/max_memory_allocated_gb": 61.0}  # fmt: skip
        if step == 4:
            data = {**data, "timing_s/step": total * f + 30.0, "timing_s/save_checkpoint": 30.0}
        steps[step] = data
    return steps


def _final_json(
    tmp_path: Path, job: plan.Job, steps: dict, *, checkpoint_gib: float, host_gib: float
) -> Path:
    """final.json of a finished first run through the training's writers."""
    b, v = job.name.removeprefix("train ").split("/")
    ckpt = tmp_path / f"{b}-{v}" / "global_step_11"
    ckpt.mkdir(parents=True)
    with open(ckpt / "model.pt", "wb") as f:  # a sparse file of the checkpoint's size
        f.truncate(int(checkpoint_gib * plan.GIB))
    final = {
        "backbone": b, "variant": v,
        "measured": measured_section(steps, checkpoint=ckpt, host_gib=host_gib, total_steps=11),
        "planned": planned_section(job, device="cuda"),
    }  # fmt: skip
    path = tmp_path / f"{b}-{v}" / "final.json"
    path.write_text(json.dumps(final))
    return path


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The paper plan, and a finished first run of qwen3_8b/spader whose steps took twice the plan's."""
    tmp = tmp_path_factory.mktemp("first")
    code, before = _plan(tmp)
    assert code == 0
    job = _planned_job("qwen3_8b", "spader")
    steps = _verl_steps(job, 2.0)
    estimated_ckpt = job.final_checkpoint_gib
    final = _final_json(tmp, job, steps, checkpoint_gib=1.25 * estimated_ckpt, host_gib=150.0)
    return before, job, final


def test_the_planned_section_says_what_the_job_ran_on():
    job = _planned_job("qwen3_8b", "spader")
    section = planned_section(job, device="cuda")
    assert section["job"] == "train qwen3_8b/spader" and section["planned_steps"] == job.planned_steps > 0
    assert section["ran_on"] == {
        "gpu": "A100-80GB",
        "gpus": 8,
        "gpus_per_node": 8,
        "nodes": 1,
        "path": "padded",
    }
    cpu = planned_section(None, device="cpu", name="train demo/spader")
    assert cpu["job"] == "train demo/spader" and cpu["ran_on"] is None and "CPU run" in cpu["reason"]


def test_the_measured_job_takes_its_step_time_cadence_host_and_checkpoint_from_the_record(
    first_run, tmp_path
):
    before, job, final = first_run
    code, after = _plan(tmp_path, f"hardware: {{calibration: [{final}]}}\n")
    # R3-RAG's step, twice the plan's too, no longer fits the bound on the work a lost allocation costs
    assert code == 1 and [r.split(":")[0] for r in after["refused"]] == ["train qwen3_8b/r3rag"]
    assert "over training.max_work_lost_minutes (60)" in after["refused"][0]
    old, new = _jobs(before)["train qwen3_8b/spader"], _jobs(after)["train qwen3_8b/spader"]
    assert old["time_source"] == "estimated"
    assert new["time_source"] == f"measured ({final}, 10 steps)"
    # the step less its save: the median and the 90% quantile (the 9th of 10) of steps 2-11
    estimate = sum(job.time[job.path]["step"].values())
    seconds = sorted(2.0 * estimate * s for s in SPREAD)
    low, high = (seconds[4] + seconds[5]) / 2, seconds[8]
    assert new["step_minutes_range"] == [round(low / 60, 2), round(high / 60, 2)]
    assert new["estimated"]["step_seconds"] == [
        round(estimate, 1),
        round(sum(job.time_high[job.path]["step"].values()), 1),
    ]
    parts = new["paths"]["padded"]["run_hours_by_part"]
    assert parts["steps"] == round(job.planned_steps * low / 3600, 2)
    assert new["run_hours"] == pytest.approx(sum(parts.values()), abs=0.06)
    assert new["run_hours"] > 1.9 * old["run_hours"] - 1
    # the cadence from the measured step's high end and the measured checkpoint's save
    measured_ckpt = 1.25 * job.final_checkpoint_gib
    save = costs.save_minutes(measured_ckpt * plan.GIB)
    bound = 60.0  # training.max_work_lost_minutes
    every = math.floor((bound - save) / (high / 60))
    assert (old["save_every_steps"], new["save_every_steps"]) == (4, every) and every < 4
    assert new["max_work_lost_minutes"] == round(every * high / 60 + save, 1) <= bound
    # host memory and the checkpoint: measured, the estimates beside them
    assert new["host_gib"] == 150.0 and new["estimated"]["host_gib"] == old["host_gib"]
    assert new["estimated"]["checkpoint_gib"] == round(job.final_checkpoint_gib, 2)
    assert new["disk_gib"] > old["disk_gib"]
    # the other variants of the backbone: scaled by measured/estimated; the other backbone unchanged
    factor = low / estimate
    for name in ("train qwen3_8b/grpo", "train qwen3_8b/r3rag"):
        scaled = _jobs(after)[name]
        assert scaled["time_source"] == f"scaled from measured qwen3_8b/spader (x{factor:.2f})"
        assert scaled["step_minutes"] == pytest.approx(_jobs(before)[name]["step_minutes"] * factor, abs=0.02)
        assert any("scaled from measured qwen3_8b/spader" in n for n in scaled["notes"])
    assert _jobs(after)["train llama3_1_8b/spader"] == _jobs(before)["train llama3_1_8b/spader"]
    assert after["dag"]["gpu_hours"] > 1.5 * before["dag"]["gpu_hours"]


def test_a_slower_first_run_is_refused_naming_its_step_and_the_bound(tmp_path):
    job = _planned_job("qwen3_8b", "spader")
    final = _final_json(
        tmp_path, job, _verl_steps(job, 8.0), checkpoint_gib=job.final_checkpoint_gib, host_gib=150.0
    )
    code, result = _plan(tmp_path, f"hardware: {{calibration: {final}}}\n")  # one path, not a list
    assert code == 1
    refused = _jobs(result)["train qwen3_8b/spader"]["refused"]
    assert (
        "time limit: a step takes up to" in refused and "over training.max_work_lost_minutes (60)" in refused
    )


def test_a_record_of_other_hardware_or_of_a_cpu_run_changes_nothing_and_the_notes_say_why(
    first_run, tmp_path
):
    _, _, final = first_run
    # a run stopped after some steps: its work directory, the lines of measured.jsonl, planned.json
    work = tmp_path / "work"
    work.mkdir()
    write_planned(work, planned_section(None, device="cpu", name="train llama3_1_8b/spader"))
    job = _planned_job("llama3_1_8b", "spader")
    lines = [json.dumps(step_record(s, d, 3.0)) for s, d in _verl_steps(job, 1.0).items()]
    (work / "measured.jsonl").write_text("\n".join(lines) + "\n")
    h200 = "hardware: {gpu: H200, gpu_memory_gib: 139.0}\n"
    _, before = _plan(tmp_path, h200)
    code, after = _plan(
        tmp_path, f"hardware: {{gpu: H200, gpu_memory_gib: 139.0, calibration: [{final}, {work}]}}\n"
    )
    assert code == 0
    old, new = _jobs(before)["train qwen3_8b/spader"], _jobs(after)["train qwen3_8b/spader"]
    assert new["step_minutes"] == old["step_minutes"] and new["time_source"] == "estimated"
    assert (
        f"measured record {final} not applied: it ran on other hardware: gpu A100-80GB (this plan: H200)"
        in new["notes"]
    )
    assert _jobs(after)["train qwen3_8b/grpo"]["time_source"] == "estimated"  # nothing to scale by
    llama = _jobs(after)["train llama3_1_8b/spader"]
    assert (
        llama["time_source"] == "estimated"
        and llama["step_minutes"] == _jobs(before)["train llama3_1_8b/spader"]["step_minutes"]
    )
    (note,) = [n for n in llama["notes"] if "not applied" in n]
    assert note.startswith(
        f"measured record {work / 'measured.jsonl'} not applied: its run had no plan (a CPU run"
    )


def test_a_stopped_runs_work_directory_is_read_back(tmp_path):
    job = _planned_job("llama3_1_8b", "grpo")
    work = tmp_path / "work"
    write_planned(work.mkdir() or work, planned_section(job, device="cuda"))
    steps = _verl_steps(job, 3.0)
    (work / "measured.jsonl").write_text("".join(json.dumps(step_record(s, d, 90.0)) + "\n" for s, d in steps.items())
                                         + json.dumps({"event": "end", "peak_host_gib": 95.0}) + "\n")  # fmt: skip
    _, result = _plan(tmp_path, f"hardware: {{calibration: {work}}}\n")
    new = _jobs(result)["train llama3_1_8b/grpo"]
    assert new["time_source"] == f"measured ({work / 'measured.jsonl'}, 10 steps)" and new["host_gib"] == 95.0
    estimate = sum(job.time[job.path]["step"].values())
    assert new["step_minutes"] == round(3.0 * estimate * (SPREAD[4] + SPREAD[5]) / 2 / 60, 2)
    assert _jobs(result)["train llama3_1_8b/spader"]["time_source"].startswith(
        "scaled from measured llama3_1_8b/grpo"
    )
    lines: list[str] = []
    plan.main(["--root", str(REPO), "--configfile", str(tmp_path / "overlay.yaml")], out=lines.append)
    text = "\n".join(lines)
    assert f"    time from          measured ({work / 'measured.jsonl'}, 10 steps)" in text


@pytest.mark.parametrize("what", ["field", "kind", "line"])
def test_a_malformed_record_is_one_line_naming_the_file_and_the_field(first_run, tmp_path, capsys, what):
    _, _, final = first_run
    record = json.loads(final.read_text())
    bad = tmp_path / "final.json"
    if what == "field":
        del record["measured"]["step_seconds_range"]
        bad.write_text(json.dumps(record))
        expected = f"{bad}: the measured record lacks 'measured.step_seconds_range'"
    elif what == "kind":
        bad.write_text(json.dumps({"step_seconds": 3.0}))
        expected = f"{bad}: not a record the plan reads"
    else:
        bad = tmp_path / "measured.jsonl"
        write_planned(tmp_path, record["planned"])
        bad.write_text(json.dumps({"step": 1, "step_seconds": 3.0}) + "\n")
        expected = f"{bad}:1: the measured record lacks 'phase_seconds'"
    (tmp_path / "overlay.yaml").write_text(f"hardware: {{calibration: [{bad}]}}\n")
    assert plan.main(["--root", str(REPO), "--configfile", str(tmp_path / "overlay.yaml")], out=print) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err and "Traceback" not in err


def test_the_second_runs_launch_plans_itself_from_the_first(first_run, paper_config, tmp_path):
    """A training's own launch plan (its cadence, its checks) reads hardware.calibration as spader
    plan does: a launch of another variant of the measured backbone is scaled by the first run's
    measured/estimated factor (taken from the first run's own plan), and a launch of the measured
    variant takes the measured step; an unreadable record stops the launch in one line."""
    from types import SimpleNamespace

    from spader.config.model import HardwareConfig
    from spader.training.preflight import PreflightError, job_costs, launch_records

    _, job, final = first_run
    hardware = HardwareConfig.model_validate({**paper_config["hardware"], "calibration": [str(final)]})
    grpo = SimpleNamespace(backbone="qwen3_8b", variant="grpo")
    own, scale = launch_records(grpo, hardware)
    assert own == () and scale is not None and scale[0] == "qwen3_8b/spader"
    estimate = (sum(job.time[job.path]["step"].values()), sum(job.time_high[job.path]["step"].values()))
    low = statistics.median(2.0 * estimate[0] * s for s in SPREAD)
    assert scale[1] == pytest.approx(low / estimate[0], rel=1e-6)  # measured over the run's own estimate
    spader = SimpleNamespace(backbone="qwen3_8b", variant="spader")
    own, scale = launch_records(spader, hardware)
    assert [r.path for r in own] == [str(final)] and scale is None
    assert launch_records(grpo, HardwareConfig.model_validate(paper_config["hardware"])) == ((), None)
    broken = tmp_path / "final.json"
    broken.write_text(
        json.dumps({"backbone": "qwen3_8b", "variant": "spader", "measured": {}, "planned": {}})
    )
    with pytest.raises(PreflightError, match=f"hardware.calibration: {broken}: .*lacks") as err:
        launch_records(spader, hardware.model_copy(update={"calibration": [str(broken)]}))
    assert "\n" not in str(err.value)
    assert job_costs is not None


def test_a_launch_with_the_record_saves_at_the_measured_cadence(
    first_run, paper_config, gpu_training_job, tmp_path
):
    """The launch of qwen3_8b/spader on the paper's node, with and without the first run's record:
    with it, its plan's step is the measured one and its time source says so."""
    from spader.training.launch import compose_config
    from spader.training.preflight import check_job_memory
    from spader.training.run import RunLink, plan_launch

    _, _, final = first_run
    plain = gpu_training_job(paper_config, tmp_path / "plain")
    cfg = compose_config(plan_launch(plain, resume_from=None, metrics_file=tmp_path / "m.jsonl",
                                     link=RunLink(None, None)))  # fmt: skip
    (estimated,) = check_job_memory(plain, cfg)
    config = {**paper_config, "hardware": {**paper_config["hardware"], "calibration": [str(final)]}}
    (measured,) = check_job_memory(gpu_training_job(config, tmp_path / "measured"), cfg)
    assert estimated.time_source == "estimated"
    assert measured.time_source.startswith(f"measured ({final}")
    assert measured.step_minutes() > 1.9 * estimated.step_minutes()
    assert measured.cadence.save_every_steps <= estimated.cadence.save_every_steps
