"""Per-step CPU time of SPADER training in the demo world, split by stage.

Runs the demo's training job (config/config.yaml + config/demo.yaml: variant ``spader``, the demo
backbone's policy, the demo corpus and data) for a few steps through the same code as rule
``train_policy`` - verl's own trainer on the CPU platform - and prints, per step and on average:

* rollout: wall time of the step's rollouts (verl ``timing_s/gen``), and inside it the
  episode-seconds spent generating, searching and scoring (verl's per-episode timers, summed:
  episodes run concurrently, so they add up to more than the wall time);
* advantage: densification of the step rewards plus the estimator (``timing_s/adv``);
* update: log-prob passes of actor and reference plus the actor update;
* weight sync: the new weights into the rollout replica (``timing_s/update_weights``);
* checkpoint, and the whole step.

The demo's inputs are built first with the workflow's own rules (as ``spader.training.smoke``
does). ``--variant`` times another of the demo config's variants (``stepsearch`` and ``r3rag``
include their step rewards; StepSearch's evidence is built first). The run ends by writing a record
(``bench/records/``, see ``bench/records.py``): the mean step by stage, and the per-step table.
Usage::

    .venv/bin/python bench/train.py [--steps 4] [--variant spader] [--out results/bench/train] [--records DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from records import write_record  # bench/records.py (the script's own directory is on sys.path)

REPO = Path(__file__).resolve().parents[1]

COLUMNS = [
    ("step", "timing_s/step"),
    ("rollout", "timing_s/gen"),
    ("generate*", "episode/seconds/generate"),
    ("search*", "episode/seconds/search"),
    ("reward*", "episode/seconds/reward"),
    ("advantage", "timing_s/adv"),
    ("update", None),
    ("weight sync", "timing_s/update_weights"),
    ("checkpoint", "timing_s/save_checkpoint"),
]
_UPDATE = ("timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor")


def demo_job(out: Path, steps: int, variant: str = "spader"):
    """The demo's ``train_policy`` job for ``variant``, shortened to ``steps`` steps (the typed
    sections of :class:`~spader.training.run.TrainJob` validated from the demo config)."""
    from spader.config import resolved_config
    from spader.training.run import TrainJob
    from spader.training.scorer_launch import judge_params, judge_settings

    config = resolved_config(
        REPO / "config" / "config.yaml",
        REPO / "config" / "demo.yaml",
        verl_config_dir=REPO / "config" / "verl",
    )
    if variant not in config["variants"]:
        raise SystemExit(
            f"--variant {variant}: not a variant of the demo config ({sorted(config['variants'])})"
        )
    backbone = config["backbones"]["demo"]
    model = REPO / "results" / "demo" / "warmstart" / "model"
    if backbone.get("warmstart") is None:
        model = REPO / "results" / "models" / "tiny" / backbone["model"].split(":", 1)[1]
    retrieval = dict(config["retrieval"])
    reranker = dict(retrieval["reranker"])
    if str(reranker.get("model", "")).startswith("tiny:"):
        reranker["path"] = str(REPO / "results" / "models" / "tiny" / reranker["model"].split(":", 1)[1])
    retrieval["reranker"] = reranker  # TrainJob moves the path to reranker_path
    suite = config["suite"]
    spec = config["variants"][variant]
    judge = judge_settings(judge_params(spec, config["judge"]), config)
    if judge is not None and not judge.get("url"):
        raise SystemExit(
            f"--variant {variant} serves an LLM judge, which needs a GPU; the demo's judges the reranker"
        )
    return TrainJob(
        backbone="demo",
        variant=variant,
        backbone_spec=dict(backbone),
        variant_spec=dict(spec),
        training={**config["training"], "max_steps": steps, "save_freq": steps, "test_freq": 10 * steps},
        retrieval=retrieval,
        train_file=REPO / "results" / suite / "data" / "verl" / "train.parquet",
        val_file=REPO / "results" / suite / "data" / "verl" / "val.parquet",
        index_dir=REPO / "results" / suite / "index" / "bm25",
        model_dir=model,
        verl_config_dir=REPO / "config" / "verl",
        workdir=out / "work",
        final_json=out / "final.json",
        threads=os.cpu_count() or 2,
        evidence=REPO / "results" / suite / "data" / "evidence" / "train.jsonl"
        if spec.get("reward") == "stepsearch"
        else None,
        stepsearch=config.get("stepsearch"),
        judge=judge,
        agent=dict(config["agent"]),
    )


def prepare(job) -> None:
    """Build the demo inputs the job reads with the workflow's rules (CPU only)."""
    inputs = [job.train_file, job.val_file, job.index_dir, job.model_dir, job.reranker_path, job.evidence]
    targets = [str(Path(p).relative_to(REPO)) for p in inputs if p is not None]
    cmd = [
        str(Path(sys.executable).with_name("snakemake")),
        *targets,
        "--cores",
        "2",
        "--configfile",
        "config/demo.yaml",
    ]
    subprocess.run(cmd, cwd=REPO, check=True)


def table(steps: dict[int, dict]) -> str:
    """Markdown table of the stage times per step, with their mean."""
    rows = []
    for step in sorted(s for s in steps if s > 0 and "timing_s/step" in steps[s]):
        m = steps[step]
        row = [str(step)]
        for _, key in COLUMNS:
            # a step without a checkpoint has no checkpoint time
            value = sum(m.get(k, 0.0) for k in _UPDATE) if key is None else m.get(key, 0.0)
            row.append(f"{value:.2f}")
        rows.append(row)
    if rows:
        means = ["mean"] + [
            f"{sum(float(r[i]) for r in rows) / len(rows):.2f}" for i in range(1, len(rows[0]))
        ]
        rows.append(means)
    header = ["step"] + [f"{name} (s)" for name, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _mean(steps: dict[int, dict], key: str | None) -> float:
    rows = [steps[s] for s in steps if s > 0 and "timing_s/step" in steps[s]]
    values = [sum(m.get(k, 0.0) for k in _UPDATE) if key is None else m.get(key, 0.0) for m in rows]
    return sum(values) / max(len(values), 1)


def record(job, steps: dict[int, dict], total: float, trained: float, args, argv: list[str]) -> str:
    """Write the run's record: the mean step by stage, and the per-step table."""
    mean = {name: _mean(steps, key) for name, key in COLUMNS}
    n = sum(1 for s in steps if s > 0 and "timing_s/step" in steps[s])
    t, a = job.training, job.agent
    row = {
        "id": f"step-{job.variant}",
        "what": f"one {job.variant} step of the demo's training ({t.train_batch_size} prompts x {t.rollout_n} "
        f"rollouts, up to {a.max_turns} turns, {t.max_response_length:,} response tokens), verl's own trainer "
        f"on the {job.device.upper()}, per stage, mean of {n} steps",
        "result": f"**{mean['step']:.0f} s** per step: rollouts {mean['rollout']:.1f} s wall (episode-seconds: "
        f"generation {mean['generate*']:.0f}, search {mean['search*']:.0f}, reward {mean['reward*']:.1f}), "
        f"advantage {mean['advantage']:.2f} s, log-probs + actor update {mean['update']:.1f} s, weight sync "
        f"{mean['weight sync']:.2f} s; start-up and validation before the first step {total - trained:.0f} s of a "
        f"{total:.0f} s job",
        "target": None,
        "verdict": None,
        "numbers": {
            "mean_s": {k: round(v, 3) for k, v in mean.items()},
            "steps": n,
            "job_s": round(total, 1),
            "in_steps_s": round(trained, 1),
        },
    }
    lines = table(steps).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    tables = {
        f"steps-{job.variant}": {
            "title": f"Seconds per stage and step, {job.variant} (* episode-seconds, summed over the step's "
            "concurrent episodes)",
            "columns": cells[0],
            "rows": cells[2:],
        }
    }
    return str(write_record("bench/train.py", [row], argv=argv, tables=tables, directory=args.records))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="training steps (default: %(default)s)")
    parser.add_argument(
        "--variant", default="spader", help="a variant of the demo config (default: %(default)s)"
    )
    parser.add_argument("--out", default="results/bench/train", help="work directory (default: %(default)s)")
    parser.add_argument("--no-prepare", action="store_true", help="the demo inputs exist already")
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    from spader.training.checkpoints import read_step_metrics
    from spader.training.run import run_training

    out = REPO / args.out
    job = demo_job(out, args.steps, args.variant)
    if not args.no_prepare:
        prepare(job)
    if job.workdir.exists():  # a fresh run: a leftover checkpoint would be resumed
        import shutil

        shutil.rmtree(job.workdir)
    start = time.perf_counter()
    run_training(job)
    total = time.perf_counter() - start
    steps = read_step_metrics(job.metrics_dir)
    trained = sum(steps[s].get("timing_s/step", 0.0) for s in steps if s > 0)
    print(table(steps))
    print("\n* episode-seconds summed over the step's episodes (they run concurrently)")
    print(
        json.dumps(
            {
                "steps": args.steps,
                "job_seconds": round(total, 1),
                "seconds_in_steps": round(trained, 1),
                "start_up_and_validation_seconds": round(total - trained, 1),
            }
        )
    )
    print(f"record: {record(job, steps, total, trained, args, sys.argv[1:] if argv is None else list(argv))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
