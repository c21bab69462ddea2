"""The importance ratio of the clipped objective, per token (verl's, the authors' code) against per
decision step (the paper's eq. 3), in one CPU training of SPADER each on the same seed.

Trains variant ``spader`` in the spread world of the update-direction test
(tests/support/spread_world.py, tests/support/method_runs.py: verl's own trainer on the CPU, the
real search service, the world's one warm start) for ``--steps`` steps with
``training.policy_ratio: token`` and again with ``step``, the same training seed (so the same first
step's rollouts), and prints per step and ratio:

* ``clip``: verl's ``actor/pg_clipfrac``, the share of tokens (token) or of steps (step) whose
  clipped term was used;
* ``ppo_kl``: ``actor/ppo_kl``, the mean of ``old_log_prob - log_prob`` over generated tokens (how
  far an update moved the policy from the one that sampled, the same quantity in both modes);
* ``kl``: ``actor/kl_loss``, the low-variance KL to the reference policy;
* ``reward``: the mean reward of the step's trajectories (``critic/score/mean``: step rewards plus
  the terminal reward), and the entities its trajectories discovered (``episode/entities``).

The run ends with a record (``bench/records/``).

    .venv/bin/python bench/policy_ratio.py [--steps 3] [--seed 1] [--out results/bench/policy_ratio]
        [--records DIR] [--no-record]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from unittest.mock import patch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

import method_runs  # noqa: E402
from records import write_record  # noqa: E402  (bench/records.py: the script's directory is on sys.path)

RATIOS = ("token", "step")
COLUMNS = {
    "clip": "actor/pg_clipfrac",
    "ppo_kl": "actor/ppo_kl",
    "kl": "actor/kl_loss",
    "reward": "critic/score/mean",
    "entities": "episode/entities",
}


def train(world, out: Path, ratio: str, steps: int, seed: int) -> dict[int, dict]:
    """Train SPADER with ``training.policy_ratio: ratio``; its logged steps."""
    sizes = {**method_runs.SIZES, "policy_ratio": ratio}
    with patch.dict(method_runs.SIZES, sizes):
        job = method_runs.train_arm(world, out, "spader", steps=steps, seed=seed)
    return method_runs.step_metrics(job)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def _record_rows(results: dict, seconds: dict, steps: int, seed: int) -> tuple[list[dict], list[list[str]]]:
    """The record's rows (each ratio's means over the steps) and the per-step table's rows."""
    table = [
        [ratio, str(step), *(_fmt(metrics.get(key)) for key in COLUMNS.values())]
        for ratio in RATIOS
        for step, metrics in sorted(results[ratio].items())
    ]
    rows = []
    for ratio in RATIOS:
        done = results[ratio].values()
        means = {
            name: sum(m.get(key, 0.0) for m in done) / max(len(done), 1) for name, key in COLUMNS.items()
        }
        rows.append(
            {
                "what": f"policy_ratio {ratio}: mean over {steps} steps (seed {seed})",
                "result": ", ".join(f"{name} {_fmt(value)}" for name, value in means.items())
                + f"; {seconds[ratio]:.0f} s",
                "target": None,
                "verdict": None,
                "numbers": {**means, "seconds": seconds[ratio]},
            }
        )
    return rows, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench" / "policy_ratio")
    parser.add_argument("--records", type=Path, default=None)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)

    import torch  # noqa: F401  (loaded before the JVM of the world's indexer)
    from spread_world import build_world

    args.out.mkdir(parents=True, exist_ok=True)
    world = build_world(args.out / "world")
    results, seconds = {}, {}
    for ratio in RATIOS:
        work = args.out / ratio
        shutil.rmtree(work, ignore_errors=True)
        started = time.monotonic()
        results[ratio] = train(world, work, ratio, args.steps, args.seed)
        seconds[ratio] = time.monotonic() - started
    rows, table = _record_rows(results, seconds, args.steps, args.seed)
    header = ["ratio", "step", *COLUMNS]
    print("\n".join("\t".join(row) for row in [header, *table]))
    if args.no_record:
        return 0
    title = "Per training step: clip fraction, KL (to the sampling policy, to the reference), reward"
    path = write_record(
        "bench/policy_ratio.py",
        rows,
        argv=sys.argv[1:] if argv is None else argv,
        tables={"steps": {"title": title, "columns": header, "rows": table}},
        directory=args.records,
    )
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
