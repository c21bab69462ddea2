"""A training measures itself against its plan.

While verl runs, :class:`SelfMeasure` reads the per-step metrics verl's file logger writes (the
attempt files of ``work/metrics``) and samples the host memory of the job's process tree. For
every new step it appends one record to ``work/measured.jsonl``: the seconds of each phase of the
step (:data:`PHASES`, verl's ``timing_s/*``), the peak GPU memory of the step's ranks (verl's
``perf/max_memory_allocated_gb``, where the engine reports it) and the peak host memory so far.
Once :data:`WARMUP_STEPS` steps are measured (the first step compiles, warms caches and loads),
it compares the measured steps with the plan the job wrote at its launch (``work/planned.json``,
:func:`planned_section`): a step slower than the plan's high end, or a GPU or host peak above the
plan's, by more than ``training.over_plan_factor`` is named on the console in one line, and with
``training.stop_when_over_plan`` the job asks verl to stop at its next step boundary, after a
checkpoint, before the run wastes its allocation.

``final.json`` gains a ``measured`` and a ``planned`` section with the same keys (:data:`KEYS`),
and ``step_seconds_range``: the step less its save, low and high end (measured: the median and a
high quantile, :func:`spader.planning.measured.step_range`). ``planned`` also says what the job
runs on (``job``, ``ran_on``: ``hardware.gpu``, the GPUs in all and per node, the nodes, the actor
path) and ``planned_steps``, so a later plan can read the run back (``hardware.calibration``).
A CPU run has no plan (the plan models GPU jobs: its sglang pool, FSDP shards, MFU): its
``planned`` section holds the keys, each null, and ``reason`` says why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import statistics
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from spader.planning.measured import WARMUP_STEPS, step_range

log = logging.getLogger(__name__)

__all__ = [
    "KEYS",
    "PHASES",
    "WARMUP_STEPS",
    "SelfMeasure",
    "measured_section",
    "over_plan",
    "planned_section",
    "read_planned",
    "recorded_host_peak",
    "write_planned",
]

GIB = float(1 << 30)
#: A phase of a step and the metric that times it: verl's ``timing_s/*``, and the search wait, which
#: is part of generation (the agent loop waits for the service inside ``gen``): the seconds the
#: batch's episodes waited for the search tool, summed over the episodes (they run concurrently).
PHASES = {
    "generation": "timing_s/gen",
    "search_wait": "episode/seconds/search",
    "reward": "timing_s/reward",
    "old_log_prob": "timing_s/old_log_prob",
    "reference": "timing_s/ref",
    "values": "timing_s/values",
    "advantage": "timing_s/adv",
    "update_critic": "timing_s/update_critic",
    "update_actor": "timing_s/update_actor",
    "update_weights": "timing_s/update_weights",
    "save": "timing_s/save_checkpoint",
}
STEP_METRIC = "timing_s/step"
GPU_METRICS = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb")
#: The keys of both sections of ``final.json``.
KEYS = ("step_seconds", "run_hours", "checkpoint_gib", "peak_host_gib", "peak_gpu_gib", "phase_seconds")


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def step_record(step: int, data: Mapping[str, Any], host_gib: float | None) -> dict[str, Any]:
    """One line of ``measured.jsonl``: a step's phases, its seconds, its GPU peak, the host peak."""
    phases = {name: float(data[key]) for name, key in PHASES.items() if key in data}
    gpu = [float(data[k]) for k in GPU_METRICS[:1] if k in data]
    return {
        "step": int(step),
        "step_seconds": float(data[STEP_METRIC]) if STEP_METRIC in data else None,
        "phase_seconds": phases,
        "peak_gpu_gib": max(gpu) if gpu else None,
        "peak_host_gib": host_gib,
    }


def measured_section(
    steps: Mapping[int, Mapping[str, Any]],
    *,
    checkpoint: str | os.PathLike | None,
    host_gib: float | None,
    total_steps: int | None = None,
) -> dict[str, Any]:
    """What the run measured: the median step and phases after :data:`WARMUP_STEPS` (all steps
    when there are no more), the run time projected to ``total_steps``, the GPU and host peaks,
    the size of ``checkpoint``."""
    from spader.training.node import tree_gib

    timed = {s: d for s, d in steps.items() if s > 0 and STEP_METRIC in d}
    counted = [s for s in sorted(timed) if s > WARMUP_STEPS] or sorted(timed)
    step_s = _median([float(timed[s][STEP_METRIC]) for s in counted])
    # a phase timed only on some steps (the save) has its median over those
    phases = {
        name: _median([float(timed[s][key]) for s in counted if key in timed[s]])
        for name, key in PHASES.items()
        if any(key in timed[s] for s in counted)
    }
    gpu = [float(d[k]) for d in steps.values() for k in GPU_METRICS[:1] if k in d]
    ckpt = tree_gib(checkpoint) if checkpoint and Path(checkpoint).is_dir() else None
    low_high = step_range([step_record(s, timed[s], None) for s in counted])
    return {
        "step_seconds": step_s,
        "step_seconds_range": list(low_high) if low_high else None,
        "run_hours": step_s * total_steps / 3600 if step_s is not None and total_steps else None,
        "checkpoint_gib": round(ckpt, 6) if ckpt is not None else None,
        "peak_host_gib": round(host_gib, 3) if host_gib is not None else None,
        "peak_gpu_gib": max(gpu) if gpu else None,
        "phase_seconds": {k: v for k, v in phases.items() if v is not None},
        "steps_measured": len(counted),
    }


def planned_section(planned: Any, *, device: str, name: str | None = None) -> dict[str, Any]:
    """The plan of a job (:class:`spader.planning.plan.Job`, or None; ``name``: the plan's name of
    the job when there is none) under the keys of :func:`measured_section`: the step and run time
    at both ends of the plan's range, one checkpoint, the host memory of the most loaded node, the
    GPU peak and capacity; what the job runs on and its planned steps."""
    if planned is None:
        reason = (
            "a CPU run has no plan: the plan models GPU jobs (training.device is cpu)"
            if device == "cpu"
            else "no plan for this launch (no node description to plan from)"
        )
        return {**dict.fromkeys(KEYS), "phase_seconds": {}, "step_seconds_range": None, "job": name,
                "ran_on": None, "planned_steps": None, "reason": reason}  # fmt: skip
    low, high = planned.step_minutes(), planned.step_minutes(end="high")
    times = planned.time.get(planned.path or "") or {}
    section = {
        "job": planned.name,
        "ran_on": dict(planned.ran_on) if planned.ran_on else None,
        "planned_steps": planned.planned_steps,
        "step_seconds_range": [low * 60, high * 60] if low is not None and high is not None else None,
        "step_seconds": low * 60 if low is not None else None,
        "step_seconds_high": high * 60 if high is not None else None,
        # the time model's own estimate of the step (low, high end), also where measured records
        # replaced or scaled it: what a later plan scales the backbone's other variants by
        "estimated_step_seconds": (
            planned.estimated.get("step_seconds")
            or ([low * 60, high * 60] if low is not None and high is not None else None)
        ),
        "run_hours": planned.run_hours(),
        "run_hours_high": planned.run_hours(end="high"),
        "checkpoint_gib": planned.final_checkpoint_gib,
        "peak_host_gib": planned.host_gib,
        "host_capacity_gib": planned.host_capacity,
        "peak_gpu_gib": round(planned.peak, 3) if planned.phases else None,
        "gpu_capacity_gib": planned.capacity,
        "phase_seconds": dict(times.get("step") or {}),
    }
    missing = [k for k in KEYS if section[k] in (None, {})]
    section["reason"] = (
        f"the plan gives no {', '.join(missing)} for this launch: it plans time, host memory and disk "
        "from the node's description (hardware.*)"
        if missing
        else None
    )
    return section


def over_plan(measured: Mapping[str, Any], planned: Mapping[str, Any], factor: float) -> list[str]:
    """What the measured run exceeds the plan by more than ``factor`` (one line each): the step
    time (and so the run time) against the plan's high end, the GPU peak against the plan's peak
    (or against the GPU's capacity), the host peak against the plan's."""
    out = []

    def check(what: str, got: Any, bound: Any, unit: str, key: str) -> None:
        if got is not None and bound and got > factor * bound:
            out.append(f"{what} {got:.3g} {unit} is {got / bound:.2f}x the plan's {bound:.3g} {unit} ({key})")

    step_bound = planned.get("step_seconds_high") or planned.get("step_seconds")
    check("the measured step", measured.get("step_seconds"), step_bound, "s", "step_seconds")
    gpu_bound = planned.get("peak_gpu_gib")
    check("the GPU peak", measured.get("peak_gpu_gib"), gpu_bound, "GiB", "peak_gpu_gib")
    cap = planned.get("gpu_capacity_gib")
    if measured.get("peak_gpu_gib") is not None and cap and measured["peak_gpu_gib"] > cap and not out:
        out.append(f"the GPU peak {measured['peak_gpu_gib']:.3g} GiB exceeds the GPU's {cap:.3g} GiB")
    check(
        "the host peak", measured.get("peak_host_gib"), planned.get("peak_host_gib"), "GiB", "peak_host_gib"
    )
    return out


def tree_rss_gib(pid: int | None = None) -> float:
    """Resident memory of process ``pid`` (default: this one) and all its descendants, GiB."""
    import psutil

    try:
        root = psutil.Process(pid or os.getpid())
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total / GIB


class SelfMeasure:
    """In a thread while verl runs: the step records (``measured.jsonl``), the host peak, and the
    comparison with the plan (see the module docstring).

    Args:
        workdir: the job's work directory (``metrics/``, ``planned.json``; ``measured.jsonl`` is written).
        factor: ``training.over_plan_factor``.
        stop: called with a reason to stop at the next step boundary (``training.stop_when_over_plan``);
            None: the console only says so.
        name: how the console names the run.
        interval_s: seconds between two looks.
        host_sample: the host memory of the job now (default: the RSS of this process tree).
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        factor: float,
        stop: Callable[[str], None] | None = None,
        name: str = "training",
        interval_s: float = 5.0,
        host_sample: Callable[[], float] = tree_rss_gib,
    ):
        self.workdir = Path(workdir)
        self.factor, self.stop, self.name = float(factor), stop, name
        self.interval_s, self.host_sample = interval_s, host_sample
        self.records = self.workdir / "measured.jsonl"
        self.host_peak = recorded_host_peak(self.workdir)
        self.warned: list[str] = []
        self._seen: set[int] = recorded_steps(self.workdir)
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SelfMeasure:
        self._thread = threading.Thread(target=self._loop, name="self-measure", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with contextlib.suppress(Exception):
            self.look()  # the last steps, and the host peak of the attempt's end
            with open(self.records, "a", encoding="utf-8") as f:
                f.write(json.dumps({"event": "end", "peak_host_gib": round(self.host_peak or 0.0, 3)}) + "\n")

    def _loop(self) -> None:
        while not self._done.wait(self.interval_s):
            try:
                self.look()
            except Exception:  # never the cause of a failed training
                log.exception("self-measurement failed")

    def look(self) -> None:
        """Sample the host, record new steps, compare with the plan once past the warm-up."""
        from spader.training.checkpoints import read_step_metrics

        self.host_peak = max(self.host_peak or 0.0, self.host_sample())
        steps = read_step_metrics(self.workdir / "metrics")
        new = [s for s in sorted(steps) if s > 0 and s not in self._seen and STEP_METRIC in steps[s]]
        if not new:
            return
        with open(self.records, "a", encoding="utf-8") as f:
            for s in new:
                f.write(json.dumps(step_record(s, steps[s], round(self.host_peak, 3)), sort_keys=True) + "\n")
        self._seen.update(new)
        if len([s for s in steps if s > WARMUP_STEPS and STEP_METRIC in steps[s]]) >= 1:
            self.compare(steps)

    def compare(self, steps: Mapping[int, Mapping[str, Any]]) -> None:
        planned = read_planned(self.workdir)
        if planned is None or planned.get("reason"):
            return
        measured = measured_section(steps, checkpoint=None, host_gib=self.host_peak)
        for line in over_plan(measured, planned, self.factor):
            if line in self.warned:
                continue
            self.warned.append(line)
            log.warning(
                "%s over its plan: %s (training.over_plan_factor %g)%s", self.name, line, self.factor,
                "; stopping at the next step boundary (training.stop_when_over_plan)" if self.stop else "",
            )  # fmt: skip
            if self.stop is not None:
                self.stop(f"{self.name} over its plan: {line}")


def recorded_host_peak(workdir: str | os.PathLike) -> float | None:
    """The host peak the job's attempts recorded in ``measured.jsonl`` (a resumed run keeps the highest)."""
    records, peak = Path(workdir) / "measured.jsonl", None
    if records.is_file():
        for line in records.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                value = json.loads(line).get("peak_host_gib")
                if value is not None:
                    peak = max(peak or 0.0, float(value))
    return peak


def recorded_steps(workdir: str | os.PathLike) -> set[int]:
    """The steps ``measured.jsonl`` holds (a resumed attempt records only the steps after them,
    and the steps it trains again)."""
    records, steps = Path(workdir) / "measured.jsonl", set()
    if records.is_file():
        for line in records.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
                steps.add(int(json.loads(line)["step"]))
    return steps


def write_planned(workdir: str | os.PathLike, section: Mapping[str, Any]) -> None:
    from spader.infra.atomic import atomic_write

    atomic_write(Path(workdir) / "planned.json", json.dumps(dict(section), indent=2, sort_keys=True) + "\n")


def read_planned(workdir: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(workdir) / "planned.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def flat_metrics(final: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of ``final.json``'s ``measured`` and ``planned`` sections as MLflow metrics
    (``measured/step_seconds``, ``planned/phase_seconds/generation``, ...)."""
    out: dict[str, float] = {}
    for section in ("measured", "planned"):
        for key, value in (final.get(section) or {}).items():
            items = value.items() if isinstance(value, Mapping) else [(None, value)]
            for sub, v in items:
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out["/".join(filter(None, (section, key, sub)))] = float(v)
    return out
