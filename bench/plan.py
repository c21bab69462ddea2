"""The plan's time, host memory and disk for the paper config, both actor paths side by side, as a
record the README and docs quote (``<!-- bench: bench/plan.py ... -->``).

Nothing is measured: the numbers are ``python -m spader.training.plan``'s for config/config.yaml
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
    from spader.training.plan import plan_config

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


def _times(job) -> tuple:
    """Minutes per step and hours per run, padded and packed, rounded as the table shows them."""
    return tuple(round(job.step_minutes(p), 1) for p in ("padded", "packed")) + tuple(
        round(job.run_hours(p)) for p in ("padded", "packed")
    )


def _time_rows(config: Any, jobs: Sequence[Any]) -> list[list[str]]:
    """The time table's rows: per group of runs, step and run times and GPU-hours per run."""
    time_rows = []
    for label, group in _groups(jobs, _times):
        job = group[0]
        step_padded, step_packed, run_padded, run_packed = _times(job)
        held = (
            config.backbones[job.name.split()[1].split("/")[0]].gpus * config.training.nodes
        )  # the allocation's
        gpu_hours = round(job.run_hours("padded") * held)
        time_rows.append([label, str(job.gpus), f"{step_padded}", f"{step_packed}", f"{run_padded}", f"{run_packed}",
                          f"{gpu_hours:,}"])  # fmt: skip
    return time_rows


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
        disk_rows.append([label, f"{job.disk_gib:.0f}", "; ".join(f"{k} {v:.0f}" for k, v in job.disk.items()),
                          f"{job.kept_gib:.0f}"])  # fmt: skip
    return host_rows, disk_rows


def _tables(config: Any, jobs: Sequence[Any]) -> dict[str, dict]:
    """The record's time, host and disk tables."""
    hw = config.hardware
    node = f"{hw.gpus} x {hw.gpu}"
    host_rows, disk_rows = _host_and_disk_rows(jobs)
    return {
        "time": {
            "title": f"Time per training step and per run, {node}, {hw.mfu:g} MFU, trajectories {hw.length_share:g} "
            f"of the maximum length (python -m spader.training.plan)",
            "columns": ["runs", "training GPUs", "min per step, padded (today)", "min per step, packed",
                        "hours per run, padded", "hours per run, packed", "GPU-hours per run, padded"],
            "rows": _time_rows(config, jobs),
        },
        "host": {
            "title": f"Host memory per node and what a training job asks SLURM for (hardware.cores {hw.cores}, "
            f"hardware.host_memory_gib {hw.host_memory_gib:g})",
            "columns": ["runs", "GiB per node", "largest terms (GiB)", "--cpus-per-task", "--mem (MB)"],
            "rows": host_rows,
        },
        "disk": {
            "title": "Disk of a training job: its work directory at the peak of an attempt and its export; "
            "what it keeps after the run",
            "columns": ["runs", "GiB at the peak", "terms (GiB)", "GiB kept after the run"],
            "rows": disk_rows,
        },
    }  # fmt: skip


def _job_row(job: Any, gpu: str, row_id: str, what: str) -> dict:
    """The record's row of one training run: its step and run times, host memory and disk."""
    return {
        "id": row_id,
        "what": what,
        "result": f"**{job.step_minutes('padded'):.1f} min** per step, **{job.run_hours('padded'):.0f} h** per run "
        f"on {job.gpus} training GPUs ({gpu}; padded path; packed: {job.step_minutes('packed'):.1f} min, "
        f"{job.run_hours('packed'):.0f} h); host {job.host_gib:.0f} GiB per node, disk {job.disk_gib:.0f} GiB",
        "numbers": {
            "step_minutes": {p: round(job.step_minutes(p), 2) for p in ("padded", "packed")},
            "run_hours": {p: round(job.run_hours(p), 1) for p in ("padded", "packed")},
            "host_gib": round(job.host_gib, 1),
            "disk_gib": round(job.disk_gib, 1),
        },
    }


def build(config: Any, jobs: Sequence[Any]) -> tuple[list[dict], dict[str, dict]]:
    """The record's rows and tables from the plan's jobs."""
    from spader.training.plan import dag_totals

    gpu = config.hardware.gpu
    train = {j.name: j for j in jobs if j.name.startswith("train ")}
    tables = _tables(config, jobs)
    totals = dag_totals(jobs, config)
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
            "result": f"{totals['training_runs']} runs: **~{totals['gpu_hours']:,} GPU-hours**, "
            f"~{totals['wall_hours']:,.0f} hours (~{totals['wall_hours'] / 24:.0f} days) one after another on one "
            f"node; ~{totals['kept_gib']:,} GiB of checkpoints and exports if no work directory is deleted",
            "numbers": dict(totals),
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
        machine_text=f"no machine: the plan for nodes of {hw.gpus} x {hw.gpu} at {hw.mfu:g} MFU (hardware.*)",
    )
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
