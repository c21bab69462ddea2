"""The plan's time, host memory and disk for the paper config, both actor paths side by side, as a
record the README and docs quote (``<!-- bench: bench/plan.py ... -->``).

Nothing is measured: the numbers are ``python -m spader.planning.plan``'s for config/config.yaml
(its model and assumptions: docs/gpu.md), written as a record so that every per-step, per-run,
host-memory and disk figure the docs give comes from one run of the plan, with its date and
commit. tests/workflow/test_doc_numbers.py fails when the latest record differs from what the
plan computes now: after changing the plan or the config, run this script and
``python bench/report.py write``.

Usage: python bench/plan.py [--records DIR]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from records import REPO, write_record  # bench/records.py (the script's own directory is on sys.path)

sys.path.insert(0, str(REPO / "src"))

NAMES = {"qwen3_8b": "Qwen3-8B", "llama3_1_8b": "Llama-3.1-8B"}


def load(root: Path = REPO):
    """(config, training jobs) of config/config.yaml, without a calibration record."""
    from spader.config import load_config
    from spader.planning.plan import plan_config

    config = load_config(root / "config" / "config.yaml", verl_config_dir=root / "config" / "verl")
    return config, plan_config(config, root / "config" / "verl")


def _groups(jobs: Sequence[Any], key) -> list[tuple[str, list[Any]]]:
    """Training runs with equal ``key(job)`` per backbone, labelled ``Backbone `v1`, `v2```."""
    out: dict[tuple, list[Any]] = {}
    for job in jobs:
        if not job.name.startswith("train ") or job.run_of:
            continue
        backbone = job.name.split()[1].split("/")[0]
        out.setdefault((backbone, key(job)), []).append(job)
    labelled = []
    for (backbone, _), group in out.items():
        variants = ", ".join(f"`{j.name.split('/')[1]}`" for j in group)
        labelled.append((f"{NAMES.get(backbone, backbone)} {variants}", group))
    return labelled


def _terms(terms: dict[str, float], n: int = 3) -> str:
    top = sorted(terms.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v:.0f}" for k, v in top)


def _range(job, what: str, path: str, digits: int) -> str:
    """``low-high`` of ``job.step_minutes`` or ``job.run_hours`` on ``path``, rounded as shown."""
    low, high = (getattr(job, what)(path, end) for end in ("low", "high"))
    return f"{low:,.{digits}f}-{high:,.{digits}f}"


def _times(job) -> tuple:
    """Minutes per step and hours per run, padded and packed, low-high, rounded as the table shows them,
    and the save cadence."""
    return (
        _range(job, "step_minutes", "padded", 1),
        _range(job, "step_minutes", "packed", 1),
        _range(job, "run_hours", "padded", 0),
        _range(job, "run_hours", "packed", 0),
        job.cadence.save_every_steps,
        round(job.cadence.max_work_lost_minutes),
    )


def _time_rows(config: Any, jobs: Sequence[Any]) -> list[list[str]]:
    """The time table's rows: per group of runs, step and run times, GPU-hours per run, the cadence."""
    time_rows = []
    for label, group in _groups(jobs, _times):
        job = group[0]
        step_padded, step_packed, run_padded, run_packed, every, lost = _times(job)
        held = (
            config.backbones[job.name.split()[1].split("/")[0]].gpus * config.training.nodes
        )  # the allocation's
        gpu_hours = "-".join(f"{round(job.run_hours('padded', end) * held):,}" for end in ("low", "high"))
        time_rows.append([label, str(job.gpus), step_padded, step_packed, run_padded, run_packed, gpu_hours,
                          str(every), str(lost)])  # fmt: skip
    return time_rows


def _input_rows(jobs: Sequence[Any]) -> list[list[str]]:
    """The time model's named inputs per group of runs: the KV pool's demand against its capacity
    and the search seconds per turn, low and high end."""

    def inputs(job) -> tuple:
        a = job.assumptions
        return tuple(
            (
                a[e]["kv_demand_tokens_per_replica"],
                a[e]["kv_pool_tokens_per_replica"],
                a[e]["search_seconds_per_turn"],
            )
            for e in ("low", "high")
        )

    rows = []
    for label, group in _groups(jobs, inputs):
        (d0, pool, s0), (d1, _, s1) = inputs(group[0])
        rows.append(
            [label, f"{pool:,}", f"{d0:,} ({d0 / pool:.2f}x)", f"{d1:,} ({d1 / pool:.2f}x)", f"{s0:g}-{s1:g}"]
        )
    return rows


def _host_and_disk_rows(jobs: Sequence[Any]) -> tuple[list[list[str]], list[list[str]]]:
    """The host memory and disk tables' rows, per group of runs."""
    host_rows = []
    for label, group in _groups(jobs, lambda j: (round(j.host_gib, 1), j.threads, j.mem_mb)):
        job = group[0]
        host_rows.append([label, f"{job.host_gib:.0f}", _terms(job.host[job.host_phase]), str(job.threads),
                          f"{job.mem_mb:,}"])  # fmt: skip
    disk_rows = []
    for label, group in _groups(jobs, lambda j: (round(j.disk_gib), round(j.kept_gib))):
        job = group[0]
        export = job.disk["export (bf16)"]
        disk_rows.append([label, f"{job.disk_gib:.0f}", "; ".join(f"{k} {v:.0f}" for k, v in job.disk.items()),
                          f"{job.final_checkpoint_gib + export:.0f}", f"{job.kept_gib:.0f}"])  # fmt: skip
    return host_rows, disk_rows


def _tables(config: Any, jobs: Sequence[Any]) -> dict[str, dict]:
    """The record's time, host and disk tables."""
    hw = config.hardware
    node = f"{hw.gpus} x {hw.gpu}"
    host_rows, disk_rows = _host_and_disk_rows(jobs)
    return {
        "time": {
            "title": f"Time per training step and per run, {node}: low end at {hw.mfu:g} MFU and trajectories "
            f"{hw.length_share:g} of the maximum length, high end at {hw.mfu_low:g} MFU and {hw.length_share_high:g}; "
            f"the save cadence and the most work a lost allocation costs (training.max_work_lost_minutes "
            f"{config.training.max_work_lost_minutes:g}; python -m spader.planning.plan)",
            "columns": ["runs", "training GPUs", "min per step, padded (today)", "min per step, packed",
                        "hours per run, padded", "hours per run, packed", "GPU-hours per run, padded",
                        "saves every (steps)", "work lost at most (min)"],
            "rows": _time_rows(config, jobs),
        },
        "inputs": {
            "title": "The time model's inputs beyond hardware.*: a sglang replica's KV pool against what its "
            "sequences need at their mean length (low and high end; above 1x the high end prefills the retracted "
            "ones again), and the seconds each turn of a step waits for its search (reranking of the turn's "
            "queries on the node's reranker replicas, from bench/retrieval.py's query stream and bench/reranker_gpu.py's "
            "rate, plus 0.5 s of BM25 and bookkeeping)",
            "columns": ["runs", "KV pool per replica (tokens)", "demand, low end", "demand, high end",
                        "search s per turn, low-high"],
            "rows": _input_rows(jobs),
        },
        "host": {
            "title": f"Host memory per node and what a training job asks SLURM for (hardware.cores {hw.cores}, "
            f"hardware.host_memory_gib {hw.host_memory_gib:g})",
            "columns": ["runs", "GiB per node", "largest terms (GiB)", "--cpus-per-task", "--mem (MB)"],
            "rows": host_rows,
        },
        "disk": {
            "title": "Disk of a training job: its work directory at the peak of an attempt and its export; "
            "what it keeps once exported (the final checkpoint and the export), or with every checkpoint kept",
            "columns": ["runs", "GiB at the peak", "terms (GiB)", "GiB kept after the export (retention rule)",
                        "GiB kept with every checkpoint (training.keep_checkpoints)"],
            "rows": disk_rows,
        },
    }  # fmt: skip


def _job_row(job: Any, gpu: str, row_id: str, what: str) -> dict:
    """The record's row of one training run: its step and run times, host memory and disk."""
    return {
        "id": row_id,
        "what": what,
        "result": f"**{_range(job, 'step_minutes', 'padded', 1)} min** per step, "
        f"**{_range(job, 'run_hours', 'padded', 0)} h** per run on {job.gpus} training GPUs ({gpu}; padded path; "
        f"packed: {_range(job, 'step_minutes', 'packed', 1)} min, {_range(job, 'run_hours', 'packed', 0)} h); "
        f"saves every {job.cadence.save_every_steps} step(s), a lost allocation costs at most "
        f"{job.cadence.max_work_lost_minutes:.0f} min; host {job.host_gib:.0f} GiB per node, disk {job.disk_gib:.0f} GiB",
        "numbers": {
            "step_minutes": {p: round(job.step_minutes(p), 2) for p in ("padded", "packed")},
            "step_minutes_high": {p: round(job.step_minutes(p, "high"), 2) for p in ("padded", "packed")},
            "run_hours": {p: round(job.run_hours(p), 1) for p in ("padded", "packed")},
            "run_hours_high": {p: round(job.run_hours(p, "high"), 1) for p in ("padded", "packed")},
            "save_every_steps": job.cadence.save_every_steps,
            "max_work_lost_minutes": round(job.cadence.max_work_lost_minutes, 1),
            "host_gib": round(job.host_gib, 1),
            "disk_gib": round(job.disk_gib, 1),
        },
    }


def build(config: Any, jobs: Sequence[Any]) -> tuple[list[dict], dict[str, dict]]:
    """The record's rows and tables from the plan's jobs."""
    from spader.planning.plan import dag_totals

    gpu = config.hardware.gpu
    train = {j.name: j for j in jobs if j.name.startswith("train ")}
    tables = _tables(config, jobs)
    totals = dag_totals(jobs, config)
    gpu_low, gpu_high = totals["gpu_hours_range"]
    wall_low, wall_high = totals["wall_hours_range"]
    tables["dag_disk"] = {
        "title": f"The DAG's disk (hardware.disk_gib {config.hardware.disk_gib:g}): what every job keeps, once "
        "each training's export has deleted its intermediate checkpoints, and what comes on top while one trains",
        "columns": ["what", "GiB"],
        "rows": [[k, f"{v:,.0f}"] for k, v in totals["disk_keepers"].items()]
        + [
            ["a training at its peak, beyond its final checkpoint", f"{totals['disk_running_gib']:,.0f}"],
            ["a finished training's checkpoints until its export deletes them", f"{totals['disk_awaiting_export_gib']:,.0f}"],
            ["**the DAG**", f"**{totals['disk_gib']:,.0f}**"],
        ],
    }  # fmt: skip
    rows = [
        _job_row(
            train["train qwen3_8b/spader"], gpu, "critic-free", "one critic-free run (Qwen3-8B `spader`)"
        ),
        _job_row(train["train qwen3_8b/ppo"], gpu, "critic", "one critic run (Qwen3-8B `ppo`)"),
        _job_row(
            train["train qwen3_8b/r3rag"],
            gpu,
            "r3rag",
            "R3-RAG (Qwen3-8B; its judge holds half of the node's GPUs)",
        ),
        {
            "id": "dag",
            "what": "every training run of the paper DAG (both backbones)",
            "result": f"{totals['training_runs']} runs: **~{gpu_low:,}-{gpu_high:,} GPU-hours**, "
            f"~{wall_low:,.0f}-{wall_high:,.0f} hours (~{wall_low / 24:.0f}-{wall_high / 24:.0f} days) one after another "
            f"on one node; the DAG's disk **~{totals['disk_gib']:,.0f} GiB** (what its jobs keep once each training's "
            f"intermediate checkpoints go with its export, and one training at its peak; "
            f"~{totals['kept_gib']:,} GiB of checkpoints and exports alone with every checkpoint kept)",
            "numbers": {k: v for k, v in totals.items() if k not in ("disk_keepers", "disk_refused")},
        },
    ]
    return rows, tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", help="where the record goes (default: bench/records)")
    args = parser.parse_args(argv)
    config, jobs = load()
    rows, tables = build(config, jobs)
    for r in rows:
        print(f"{r['what']}: {r['result']}")
    hw = config.hardware
    path = write_record(
        "bench/plan.py",
        rows,
        argv=argv or [],
        tables=tables,
        directory=args.records,
        source="computed by bench/plan.py from config/config.yaml: the plan's model (docs/gpu.md), not a measurement",
        machine_text=f"no machine: the plan for nodes of {hw.gpus} x {hw.gpu} at {hw.mfu:g}-{hw.mfu_low:g} MFU "
        "(hardware.*)",
    )
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
