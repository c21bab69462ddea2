"""The records ``hardware.calibration`` names, read back by the plan: a GPU memory calibration record
(:mod:`spader.planning.calibration`) and the measured records of earlier trainings, so the second
run is planned from the first (docs/gpu.md, "Planning the second run from the first").

A training's measured record is one of (told apart by content, not by name):

* its ``final.json`` (a finished run): the ``measured`` and ``planned`` sections
  (:mod:`spader.training.measure`) with the backbone and variant;
* its work directory, or the ``measured.jsonl`` in it (a run stopped after some steps: by
  ``training.stop_when_over_plan``, a time limit, a first-hour run): one line per step, and
  ``planned.json`` beside it; the newest ``checkpoints/global_step_*`` gives the checkpoint size.

Each says what it ran on (``planned.ran_on``: the GPU model as the plan knows it, ``hardware.gpu``;
the GPUs verl trained on in all and per node; the nodes; the actor path) and the steps its plan
counted (``planned.planned_steps``). The plan applies a record to the job of the same backbone x
variant that runs on the same hardware; a record of other hardware, or of a CPU run (no plan), is
not applied and the job's notes say why.

The measured step is the step less its save (the plan counts saves apart, in the run's hours and the
save cadence): the low end is the median of the steps after :data:`WARMUP_STEPS`, the high end
their :data:`HIGH_QUANTILE` quantile (nearest rank; with fewer than ten steps, the slowest).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spader.planning.calibration import KIND, Calibration, load_calibration

__all__ = [
    "HIGH_QUANTILE",
    "RAN_ON_KEYS",
    "WARMUP_STEPS",
    "MeasuredRun",
    "Records",
    "load_records",
    "step_range",
]

#: Steps not counted in the measured step time (the first compiles, warms caches and loads).
WARMUP_STEPS = 1
#: The quantile of the measured steps that gives the high end of the step time.
HIGH_QUANTILE = 0.9
#: What a measured record must say it ran on (``planned.ran_on``) for the plan to match it to a job.
RAN_ON_KEYS = ("gpu", "gpus", "gpus_per_node", "nodes", "path")
GIB = float(1 << 30)


def _less_save(record: Mapping[str, Any]) -> float:
    return float(record["step_seconds"]) - float((record.get("phase_seconds") or {}).get("save") or 0.0)


def step_range(records: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """(low, high) seconds of a step less its save over step records (``measured.jsonl``'s lines,
    past the warm-up): the median and the :data:`HIGH_QUANTILE` quantile (nearest rank)."""
    values = sorted(_less_save(r) for r in records if r.get("step_seconds") is not None)
    if not values:
        return None
    rank = max(1, math.ceil(HIGH_QUANTILE * len(values)))
    return float(statistics.median(values)), values[rank - 1]


@dataclass(frozen=True)
class MeasuredRun:
    """What an earlier training measured, and what it ran on."""

    path: str
    job: str  # the plan's name of its job: ``train <backbone>/<variant>``
    ran_on: dict[str, Any] | None  # None: the run had no plan (a CPU run); ``reason`` says why
    reason: str | None
    planned_steps: int | None
    steps: int  # steps measured (past the warm-up)
    step_seconds: tuple[float, float]  # low and high end, less the save
    phase_seconds: dict[str, float] = field(default_factory=dict)
    checkpoint_gib: float | None = None
    host_gib: float | None = None
    #: the step (low, high end, less the save) its own plan estimated, when its plan gave one
    planned_seconds: tuple[float, float] | None = None

    @property
    def backbone(self) -> str:
        return self.job.removeprefix("train ").split("/", 1)[0]

    def factor(self) -> tuple[float, float] | None:
        """Measured over its own plan's estimate (low, high end), when the run had a plan."""
        if not self.planned_seconds or not all(self.planned_seconds):
            return None
        return (
            self.step_seconds[0] / self.planned_seconds[0],
            self.step_seconds[1] / self.planned_seconds[1],
        )

    def mismatch(self, ran_on: Mapping[str, Any]) -> str | None:
        """Why this record does not apply to a job that runs on ``ran_on`` (None: it applies)."""
        if self.ran_on is None:
            return f"measured record {self.path} not applied: its run had no plan ({self.reason})"
        differ = [f"{k} {self.ran_on[k]} (this plan: {ran_on.get(k)})" for k in RAN_ON_KEYS
                  if self.ran_on[k] != ran_on.get(k)]  # fmt: skip
        if differ:
            return f"measured record {self.path} not applied: it ran on other hardware: " + ", ".join(differ)
        return None


@dataclass(frozen=True)
class Records:
    """What ``hardware.calibration`` names: a GPU memory record (or none) and measured runs."""

    memory: Calibration | None = None
    runs: tuple[MeasuredRun, ...] = ()

    @property
    def path(self) -> str | None:
        """The GPU memory record's path (what the memory plan names)."""
        return self.memory.path if self.memory is not None else None

    def for_shape(self, shape: Any):
        return self.memory.for_shape(shape) if self.memory is not None else None

    def for_job(self, *names: str | None) -> tuple[MeasuredRun, ...]:
        return tuple(r for r in self.runs if r.job in {n for n in names if n})

    def scale_for(self, job: str, gpu: str) -> tuple[str, float, float] | None:
        """``(<b>/<v>, low, high)``: the measured/estimated factors of the first record of another
        variant of ``job``'s backbone that ran on ``gpu`` with a plan (its own plan's estimate: no
        need to plan that variant again), for a job without a record of its own; None without one."""
        backbone = job.removeprefix("train ").split("/", 1)[0]
        for r in self.runs:
            factor = r.factor()
            if r.job != job and r.backbone == backbone and r.ran_on and r.ran_on["gpu"] == gpu and factor:
                return (r.job.removeprefix("train "), *factor)
        return None

    def describe(self) -> str:
        parts = [f"calibration {self.memory.path}"] if self.memory else ["no calibration record (estimates)"]
        parts += [f"measured {r.path} ({r.job})" for r in self.runs]
        return ", ".join(parts)


def _get(mapping: Any, dotted: str, where: str, prefix: str = "") -> Any:
    """``mapping``'s value at ``dotted``; a missing one names the file and ``prefix + dotted``."""
    node = mapping
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ValueError(f"{where}: the measured record lacks '{prefix}{dotted}'")
        node = node[part]
    return node


def _ran_on(
    planned: Mapping[str, Any], where: str, prefix: str
) -> tuple[dict | None, str | None, int | None]:
    """(ran_on, reason, planned_steps) of a ``planned`` section: a run without a plan says why."""
    if planned.get("ran_on") is None and planned.get("step_seconds") is None and planned.get("reason"):
        return None, str(planned["reason"]), None
    ran_on = {k: _get(planned, f"ran_on.{k}", where, prefix) for k in RAN_ON_KEYS}
    steps = _get(planned, "planned_steps", where, prefix)
    return ran_on, None, int(steps) if steps is not None else None


def _planned_seconds(planned: Mapping[str, Any]) -> tuple[float, float] | None:
    """The step its plan's time model estimated (low, high end), before measured records replaced it."""
    estimate = planned.get("estimated_step_seconds")
    low, high = (
        estimate
        if isinstance(estimate, Sequence) and len(estimate) == 2
        else (planned.get("step_seconds"), planned.get("step_seconds_high"))
    )
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in (low, high))
    return (float(low), float(high)) if ok else None


def _number(value: Any, where: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: '{key}' is missing or not a number")
    return float(value)


def _from_final(path: Path, final: Mapping[str, Any]) -> MeasuredRun:
    where = str(path)
    b, v = _get(final, "backbone", where), _get(final, "variant", where)
    ran_on, reason, planned_steps = _ran_on(_get(final, "planned", where) or {}, where, "planned.")
    measured = _get(final, "measured", where) or {}
    low_high = _get(measured, "step_seconds_range", where, "measured.")
    if not isinstance(low_high, Sequence) or len(low_high) != 2:
        raise ValueError(f"{where}: the measured record lacks 'measured.step_seconds_range' (low, high)")
    phases = _get(measured, "phase_seconds", where, "measured.") or {}
    return MeasuredRun(
        path=where, job=f"train {b}/{v}", ran_on=ran_on, reason=reason, planned_steps=planned_steps,
        steps=int(_number(_get(measured, "steps_measured", where, "measured."), where, "measured.steps_measured")),
        step_seconds=(_number(low_high[0], where, "measured.step_seconds_range"),
                      _number(low_high[1], where, "measured.step_seconds_range")),
        phase_seconds={k: float(x) for k, x in phases.items() if x is not None},
        checkpoint_gib=measured.get("checkpoint_gib"), host_gib=measured.get("peak_host_gib"),
        planned_seconds=_planned_seconds(final.get("planned") or {}),
    )  # fmt: skip


def _step_lines(path: Path) -> tuple[dict[int, dict], float | None]:
    """The step records of a ``measured.jsonl`` by step (a step trained again: its last), and the
    host peak of every line."""
    steps: dict[int, dict] = {}
    host: float | None = None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise ValueError(f"{path}:{n}: not a JSON line of measured records") from None
        if not isinstance(record, Mapping):
            raise ValueError(f"{path}:{n}: not a JSON object")
        if record.get("peak_host_gib") is not None:
            host = max(host or 0.0, _number(record["peak_host_gib"], f"{path}:{n}", "peak_host_gib"))
        if "event" in record:
            continue
        for key in ("step", "step_seconds", "phase_seconds"):
            if key not in record:
                raise ValueError(f"{path}:{n}: the measured record lacks '{key}'")
        if record["step_seconds"] is not None:
            _number(record["step_seconds"], f"{path}:{n}", "step_seconds")
        steps[int(record["step"])] = dict(record)
    return steps, host


def _checkpoint_gib(workdir: Path) -> float | None:
    """GiB of the newest ``checkpoints/global_step_*`` of a work directory (None: none)."""
    found = sorted(
        (p for p in (workdir / "checkpoints").glob("global_step_*") if p.is_dir() and p.name[12:].isdigit()),
        key=lambda p: int(p.name[12:]),
    )
    if not found:
        return None
    return sum(f.stat().st_size for f in found[-1].rglob("*") if f.is_file()) / GIB


def _from_steps(path: Path) -> MeasuredRun:
    """A stopped run: its ``measured.jsonl`` and the ``planned.json`` beside it."""
    planned_file = path.with_name("planned.json")
    try:
        planned = json.loads(planned_file.read_text(encoding="utf-8"))
    except OSError:
        raise ValueError(f"{path}: the measured record lacks its plan ({planned_file} is missing)") from None
    except ValueError:
        raise ValueError(f"{planned_file}: not JSON") from None
    steps, host = _step_lines(path)
    timed = {s: r for s, r in steps.items() if r.get("step_seconds") is not None}
    counted = [timed[s] for s in sorted(timed) if s > WARMUP_STEPS] or [timed[s] for s in sorted(timed)]
    low_high = step_range(counted)
    if low_high is None:
        raise ValueError(f"{path}: the measured record lacks 'step_seconds' (no timed step)")
    ran_on, reason, planned_steps = _ran_on(planned, str(planned_file), "")
    names = {k for r in counted for k in (r.get("phase_seconds") or {})}
    phases = {k: float(statistics.median([r["phase_seconds"][k] for r in counted if k in r["phase_seconds"]]))
              for k in sorted(names)}  # fmt: skip
    return MeasuredRun(
        path=str(path), job=str(_get(planned, "job", str(planned_file))), ran_on=ran_on, reason=reason,
        planned_steps=planned_steps, steps=len(counted), step_seconds=low_high, phase_seconds=phases,
        checkpoint_gib=_checkpoint_gib(path.parent), host_gib=host, planned_seconds=_planned_seconds(planned),
    )  # fmt: skip


def _kind(p: Path) -> tuple[str, Any]:
    """(``memory`` | ``final`` | ``steps``, the parsed document) of a record, by its content."""
    import yaml

    if p.is_dir():
        if (p / "measured.jsonl").is_file():
            return "steps", p / "measured.jsonl"
        raise ValueError(f"{p}: a directory without measured.jsonl (a training's work directory holds it)")
    if not p.is_file():
        raise ValueError(f"hardware.calibration: {p} does not exist")
    text = p.read_text(encoding="utf-8")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        document = None
    if isinstance(document, Mapping) and document.get("kind") == KIND:
        return "memory", p
    if isinstance(document, Mapping) and "measured" in document and "planned" in document:
        return "final", document
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        head = json.loads(first)
    except ValueError:
        head = None
    if isinstance(head, Mapping) and ("step" in head or "event" in head):
        return "steps", p
    raise ValueError(
        f"{p}: not a record the plan reads (a GPU memory calibration record of kind {KIND}, a training's "
        "final.json with its measured and planned sections, or its work directory / measured.jsonl)"
    )


def load_records(
    paths: str | os.PathLike | Sequence[str | os.PathLike], root: str | os.PathLike = "."
) -> Records:
    """Read what ``hardware.calibration`` names (relative paths: under ``root``).

    Raises:
        ValueError: a file of no known kind, a measured record lacking a field, two GPU memory
            records (one line, naming the file and the field).
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    memory: Calibration | None = None
    runs: list[MeasuredRun] = []
    for item in items:
        p = Path(item) if Path(item).is_absolute() else Path(root) / item
        kind, document = _kind(p)
        if kind == "memory":
            if memory is not None:
                raise ValueError(
                    f"hardware.calibration names two GPU memory calibration records ({memory.path}, {p})"
                )
            memory = load_calibration(p)
        elif kind == "final":
            runs.append(_from_final(p, document))
        else:
            runs.append(_from_steps(document))
    return Records(memory, tuple(runs))
