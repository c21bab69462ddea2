"""What the CPU demo costs, stage by stage, and what it scores.

Runs the README's demo (``snakemake --cores 2 --configfile config/demo.yaml``) in a fresh working
directory (``-d``, the workflow and its bundled files stay in this checkout), or reads a finished
run's directory (``--workdir``), then reads the ``benchmark:`` files Snakemake wrote for the costly
rules (``results/benchmarks/<rule>/...tsv``: wall seconds, peak RSS, CPU seconds per job) and the
demo's ``f1.tsv``, and writes a record (``bench/records/``, see ``bench/records.py``):

- the demo's wall time against its 15-minute budget on 2 cores, and the added wall time of its
  second command, the authors' run of the prompting baselines beside it (config/authors.yaml,
  config/demo_authors.yaml; only when this script ran them);
- a table per stage (jobs, wall seconds in all and of the longest job, peak RSS), which
  docs/cluster.md quotes beside the paper's compute budget (docs/running.md);
- the demo's F1 per method (average over the four datasets), which docs/cpu-training.md quotes.

Usage: .venv/bin/python bench/demo.py [--workdir DIR] [--cores 2] [--records DIR]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from records import REPO, write_record  # bench/records.py (the script's own directory is on sys.path)

BUDGET_S = 15 * 60
# rule -> the stage of the compute budget (docs/running.md) it stands for
STAGES = {
    "build_bm25_index": "build the BM25 index",
    "build_evidence": "StepSearch evidence",
    "warmstart_policy": "warm start (demo only)",
    "train_policy": "train one variant",
    "export_checkpoint": "export one variant",
    "evaluate_policy": "evaluate one method on one dataset",
}


#: The README's second demo command: the authors' run beside the default one.
AUTHORS_OVERLAYS = ("demo.yaml", "authors.yaml", "demo_authors.yaml")
AUTHORS_TARGET = "results/demo/versus_default.tsv"


def run_demo(workdir: Path, cores: int) -> tuple[float, float]:
    """Run the demo into ``workdir``, then the authors' run beside it; their wall times in seconds."""
    base = [
        str(Path(sys.executable).parent / "snakemake"),
        "-s",
        str(REPO / "workflow" / "Snakefile"),
        "-d",
        str(workdir),
        "--cores",
        str(cores),
        "--configfile",
    ]
    start = time.monotonic()
    subprocess.run([*base, str(REPO / "config" / "demo.yaml")], check=True)
    middle = time.monotonic()
    overlays = [str(REPO / "config" / name) for name in AUTHORS_OVERLAYS]
    subprocess.run([*base, *overlays, "--", AUTHORS_TARGET], check=True)
    return middle - start, time.monotonic() - middle


def stage_costs(workdir: Path) -> dict[str, dict[str, float]]:
    """Per rule: jobs, total and longest wall seconds, CPU seconds, peak RSS (MiB)."""
    out: dict[str, dict[str, float]] = {}
    for rule in STAGES:
        files = sorted((workdir / "results" / "benchmarks" / rule).rglob("*.tsv"))
        rows = []
        for path in files:
            with open(path, newline="") as f:
                rows += list(csv.DictReader(f, delimiter="\t"))
        if not rows:
            continue
        seconds = [float(r["s"]) for r in rows]
        out[rule] = {
            "jobs": len(rows),
            "total_s": sum(seconds),
            "max_s": max(seconds),
            "cpu_s": sum(float(r.get("cpu_time") or 0) for r in rows),
            "max_rss_mib": max(float(r["max_rss"]) for r in rows),
        }
    return out


def demo_scores(workdir: Path) -> dict[str, float]:
    """Average F1 per method of the demo's ``f1.tsv``."""
    with open(workdir / "results" / "demo" / "f1.tsv", newline="") as f:
        return {row["method"]: float(row["avg"]) for row in csv.DictReader(f, delimiter="\t")}


def _run_rows(workdir: Path, cores: int) -> list[dict]:
    """Run the demo and the authors' run beside it in ``workdir``; returns their wall-time rows."""
    wall, authors = run_demo(workdir, cores)
    print(f"demo: {wall:.0f} s on {cores} cores (budget {BUDGET_S} s) in {workdir}")
    print(f"the authors' run beside it: {authors:.0f} s more")
    return [
        {
            "id": "wall",
            "what": f"the CPU demo end to end (`snakemake --cores {cores} --configfile config/demo.yaml`)",
            "result": f"**{wall / 60:.1f} minutes** ({wall:.0f} s)",
            "target": "< 15 minutes on 2 cores",
            "verdict": "met" if wall < BUDGET_S else "not met",
            "numbers": {"wall_s": round(wall, 1), "cores": cores},
        },
        {
            "id": "authors_wall",
            "what": "the demo's second command: the authors' run of the prompting baselines beside it "
            "and the comparison table (config/authors.yaml, config/demo_authors.yaml)",
            "result": f"**{authors / 60:.1f} minutes** ({authors:.0f} s) more",
            "target": None,
            "verdict": None,
            "numbers": {"wall_s": round(authors, 1), "cores": cores},
        },
    ]


def _stage_table_rows(costs: dict[str, dict[str, float]]) -> list[list[str]]:
    """Print the costly jobs per rule; returns the stages table's rows."""
    table_rows = []
    for rule, c in costs.items():
        table_rows.append(
            [
                STAGES[rule],
                f"`{rule}`",
                str(int(c["jobs"])),
                f"{c['total_s']:.0f} s (longest {c['max_s']:.0f} s)",
                f"{c['max_rss_mib']:,.0f} MiB",
            ]
        )
        print(
            f"{rule:<20} {int(c['jobs']):>3} jobs {c['total_s']:>8.0f} s  peak RSS {c['max_rss_mib']:,.0f} MiB"
        )
    return table_rows


def _workdir_rows(workdir: Path) -> tuple[list[dict], dict]:
    """The F1 and stage-cost rows of a finished demo run, and the stages table."""
    costs = stage_costs(workdir)
    table_rows = _stage_table_rows(costs)
    scores = demo_scores(workdir)
    listed = ", ".join(f"{m} {v:.3f}" for m, v in scores.items())
    print(f"F1 (average over the datasets): {listed}")
    tables = {
        "stages": {
            "title": "the demo's costly jobs, from their benchmark files",
            "columns": ["stage", "rule", "jobs", "wall time", "peak RSS"],
            "rows": table_rows,
        }
    }
    numbers = {rule: {k: round(v, 2) for k, v in c.items()} for rule, c in costs.items()}
    rows = [
        {
            "id": "f1",
            "what": "the demo's F1 per method, averaged over its four datasets (tiny models; greedy decoding)",
            "result": listed,
            "target": None,
            "verdict": None,
            "numbers": scores,
        },
        {
            "id": "stages",
            "what": "the demo's costly jobs (benchmark files of each rule)",
            "result": "; ".join(f"{rule} {c['total_s']:.0f} s" for rule, c in costs.items()),
            "target": None,
            "verdict": None,
            "numbers": numbers,
        },
    ]
    return rows, tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workdir", type=Path, default=None, help="a finished demo run to read (default: run it)"
    )
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    args = parser.parse_args()

    rows = []
    if args.workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="spader-demo-"))
        rows += _run_rows(workdir, args.cores)
    else:
        workdir = args.workdir
    more, tables = _workdir_rows(workdir)
    rows += more
    print(
        f"record: {write_record('bench/demo.py', rows, argv=sys.argv[1:], tables=tables, directory=args.records)}"
    )


if __name__ == "__main__":
    main()
