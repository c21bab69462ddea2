"""A training measures itself against its plan (spader.training.measure): the step records, the
sections of final.json, the one console line and the stop when it runs over its plan."""

from __future__ import annotations

import json
import logging

from spader.training.measure import (
    KEYS,
    SelfMeasure,
    measured_section,
    over_plan,
    planned_section,
    write_planned,
)


def _metrics(workdir, steps: dict[int, dict]) -> None:
    (workdir / "metrics").mkdir(parents=True, exist_ok=True)
    with open(workdir / "metrics" / "attempt_001.jsonl", "w") as f:
        for step, data in steps.items():
            f.write(json.dumps({"step": step, "data": data}) + "\n")


def _step(seconds: float, gpu: float = 30.0, save: float | None = None) -> dict:
    data = {"timing_s/step": seconds, "timing_s/gen": seconds / 2, "timing_s/ref": 1.0,
            "timing_s/old_log_prob": 2.0, "timing_s/update_actor": 3.0, "perf/max_memory_allocated_gb": gpu}  # fmt: skip
    return {**data, "timing_s/save_checkpoint": save} if save is not None else data


PLANNED = {"step_seconds": 50.0, "step_seconds_high": 100.0, "peak_gpu_gib": 40.0, "gpu_capacity_gib": 80.0,
           "peak_host_gib": 200.0, "checkpoint_gib": 90.0, "run_hours": 10.0, "reason": None}  # fmt: skip


def test_the_measured_section_skips_the_first_step_and_times_each_phase(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.pt").write_bytes(b"\0" * (1 << 20))
    steps = {1: _step(500.0), 2: _step(80.0, save=7.0), 3: _step(90.0, gpu=35.0), 4: _step(100.0, save=9.0)}
    m = measured_section(steps, checkpoint=tmp_path / "ckpt", host_gib=12.5, total_steps=36)
    assert m["step_seconds"] == 90.0 and m["run_hours"] == 90.0 * 36 / 3600 and m["steps_measured"] == 3
    assert m["phase_seconds"] == {"generation": 45.0, "old_log_prob": 2.0, "reference": 1.0,
                                  "update_actor": 3.0, "save": 8.0}  # fmt: skip
    assert (
        m["checkpoint_gib"] == round(1 / 1024, 6) and m["peak_gpu_gib"] == 35.0 and m["peak_host_gib"] == 12.5
    )
    assert set(KEYS) <= set(m)


def test_a_cpu_run_has_a_planned_section_of_nulls_that_says_why():
    planned = planned_section(None, device="cpu")
    assert set(KEYS) <= set(planned) and all(planned[k] in (None, {}) for k in KEYS)
    assert "CPU run has no plan" in planned["reason"]


def test_over_plan_names_what_exceeds_the_plan_by_the_factor():
    within = {"step_seconds": 140.0, "peak_gpu_gib": 55.0, "peak_host_gib": 250.0}
    assert over_plan(within, PLANNED, 1.5) == []
    over = {"step_seconds": 160.0, "peak_gpu_gib": 61.0, "peak_host_gib": 301.0}
    lines = over_plan(over, PLANNED, 1.5)
    assert lines == [
        "the measured step 160 s is 1.60x the plan's 100 s (step_seconds)",
        "the GPU peak 61 GiB is 1.52x the plan's 40 GiB (peak_gpu_gib)",
        "the host peak 301 GiB is 1.50x the plan's 200 GiB (peak_host_gib)",
    ]
    assert over_plan(over, PLANNED, 2.0) == []  # a larger factor tolerates it


def test_a_run_over_its_plan_says_so_once_and_stops_when_asked(tmp_path, caplog):
    write_planned(tmp_path, PLANNED)
    _metrics(tmp_path, {1: _step(900.0), 2: _step(120.0)})  # the first step is not judged
    reasons: list[str] = []
    watch = SelfMeasure(tmp_path, factor=1.5, stop=reasons.append, name="train b/v", host_sample=lambda: 3.0)
    with caplog.at_level(logging.WARNING, logger="spader.training.measure"):
        watch.look()
    assert reasons == [] and not caplog.records
    _metrics(tmp_path, {1: _step(900.0), 2: _step(120.0), 3: _step(300.0), 4: _step(300.0)})
    with caplog.at_level(logging.WARNING, logger="spader.training.measure"):
        watch.look()
        watch.look()  # said once
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("train b/v over its plan: the measured step 300 s is 3.00x the plan's 100 s")
    assert "training.stop_when_over_plan" in line and "\n" not in line
    assert reasons == [
        "train b/v over its plan: the measured step 300 s is 3.00x the plan's 100 s (step_seconds)"
    ]
    records = [json.loads(x) for x in (tmp_path / "measured.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4] and records[-1]["peak_host_gib"] == 3.0
    assert records[0]["phase_seconds"]["generation"] == 450.0 and records[0]["peak_gpu_gib"] == 30.0

    # without training.stop_when_over_plan the console says so and the run goes on
    caplog.clear()
    quiet = SelfMeasure(tmp_path, factor=1.5, stop=None, name="train b/v", host_sample=lambda: 3.0)
    with caplog.at_level(logging.WARNING, logger="spader.training.measure"):
        quiet.compare({s: _step(300.0) for s in (1, 2, 3)})
    assert "stop_when_over_plan" not in caplog.records[0].getMessage()


def test_a_run_without_a_plan_is_never_over_it(tmp_path):
    write_planned(tmp_path, planned_section(None, device="cpu"))
    _metrics(tmp_path, {s: _step(1e6) for s in (1, 2, 3)})
    reasons: list[str] = []
    SelfMeasure(tmp_path, factor=1.0, stop=reasons.append, host_sample=lambda: 1.0).look()
    assert reasons == []
