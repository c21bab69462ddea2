"""Calibration: how much SPADER's real verl training rises over the zero-advantage control, over seeds.

Trains the arms of tests/cpu_training/test_method_learning.py (tests/support/method_runs.py: the
spread world, verl's own trainer on the CPU, the real search service) from the world's one warm
start for ``--steps`` steps, once per training seed in ``--seed-offset .. --seed-offset + --seeds
- 1``, and prints per seed and over the seeds (mean, sd, min, max):

* each arm's rise: the mean of steps 3..STEPS minus step 1, in discovered entities per trajectory
  and in mean reward;
* the paired effect SPADER minus control: the same seed samples the same first step in both arms,
  so it is SPADER's mean of steps 3..STEPS minus the control's (and SPADER minus GRPO where
  ``--arms`` holds ``grpo``: reported, never asserted);

and, for each quantity, the margin a one-seed test could hold it to with a failure rate below 1%
under a normal fit of these seeds (mean - 2.33 sd). With the test's steps and arms it also says,
per seed, whether the test's assertion (``method_runs.MARGINS``) would hold there: the test run on
other seeds, by the same code.
Each seed's metrics are kept under ``--out`` (a rerun skips the seeds already there, so a long
calibration can go on over several sittings). The run ends with a record (``bench/records/``).

    .venv/bin/python bench/method_learning.py [--seeds 10] [--seed-offset 100] [--steps 4]
        [--arms spader,control] [--out results/bench/method_learning] [--records DIR] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

from method_runs import (  # noqa: E402
    ARMS,
    MARGINS,
    QUANTITIES,
    STEPS,
    later_mean,
    learning_failures,
    paired_effects,
    step_metrics,
    train_arm,
)
from records import write_seed_record  # noqa: E402  (bench/records.py: the script's directory is on sys.path)

Z_1PCT = 2.326  # the normal quantile below which 1% of the mass lies


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="training seeds")
    parser.add_argument("--seed-offset", type=int, default=100, help="first training seed")
    parser.add_argument("--steps", type=int, default=4, help="training steps per arm (at least 3)")
    parser.add_argument("--arms", default="spader,control", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--out", default=str(REPO / "results" / "bench" / "method_learning"))
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    return parser


def _run_seed(world, out: Path, seed: int, arms: list[str], steps: int) -> dict:
    """Every arm's per-step metrics for one seed, trained now or read from an earlier sitting."""
    done = out / f"seed-{seed}-steps-{steps}.json"
    found = json.loads(done.read_text()) if done.exists() else {}
    for arm in arms:
        if arm in found:
            continue
        work = out / "work" / f"{arm}-{seed}"
        shutil.rmtree(work, ignore_errors=True)
        started = time.perf_counter()
        job = train_arm(world, work, arm, steps=steps, seed=seed)
        found[arm] = {str(s): m for s, m in step_metrics(job).items()}
        print(f"seed {seed} {arm}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        done.write_text(json.dumps(found))
        shutil.rmtree(work, ignore_errors=True)  # checkpoints: hundreds of MB per run
    return {arm: {int(s): m for s, m in found[arm].items()} for arm in arms}


def _effects(runs: dict, later: range) -> dict[str, float]:
    """One seed's rises (per arm) and paired effects (SPADER minus each other arm), per quantity."""
    out = {}
    for q, value in QUANTITIES.items():
        for arm, steps in runs.items():
            out[f"{arm} rise {q}"] = later_mean(steps, value, later) - value(steps[1])
    for other in ("control", "grpo"):
        if "spader" in runs and other in runs:
            effects = paired_effects(runs["spader"], runs[other], later)
            out.update({f"spader - {other} {q}": e for q, e in effects.items()})
    return out


def _summary(values: list[float]) -> dict[str, float]:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return {"mean": mean, "sd": sd, "min": min(values), "max": max(values), "margin_1pct": mean - Z_1PCT * sd}


def _distribution_rows(per_seed: dict, seeds: range, later: range) -> tuple[list[dict], list[list[str]]]:
    """Print every quantity's distribution over the seeds; returns its record rows and table rows."""
    print(f"{'quantity':<28}{'mean':>8}{'sd':>8}{'min':>8}{'max':>8}{'1% margin':>11}")
    rows, table = [], []
    for key in next(iter(per_seed.values())):
        s = _summary([per_seed[seed][key] for seed in seeds])
        cells = [f"{s[k]:.3f}" for k in ("mean", "sd", "min", "max", "margin_1pct")]
        print(f"{key:<28}" + "".join(f"{c:>8}" for c in cells[:4]) + f"{cells[4]:>11}")
        table.append([key, *cells])
        rows.append(
            {
                "what": f"{key}, steps {later.start}..{later.stop - 1} minus step 1 (one seed)",
                "result": f"mean {s['mean']:.3f}, sd {s['sd']:.3f}, min {s['min']:.3f}; "
                f"1% margin {s['margin_1pct']:.3f} ({len(seeds)} seeds)",
                "target": None,
                "verdict": None,
                "numbers": {**s, "per_seed": {seed: per_seed[seed][key] for seed in seeds}},
            }
        )
    return rows, table


def _verdict_row(verdicts: dict[int, list[str]], seeds: range) -> dict:
    """Print on how many seeds the learning test's assertion holds; returns its record row."""
    passed = sum(not f for f in verdicts.values())
    text = f"{passed} of {len(seeds)} seeds"
    print(f"\nthe learning test's assertion (margins {MARGINS}) holds on {text}")
    for seed, failures in verdicts.items():
        if failures:
            print(f"  seed {seed}: {'; '.join(failures)}")
    return {
        "what": f"the method learning test's assertion (SPADER minus control >= {MARGINS}) on seeds "
        f"{seeds.start}..{seeds.stop - 1}",
        "result": f"holds on **{text}**",
        "target": "every seed (a failure rate below 1%)",
        "verdict": "met" if passed == len(seeds) else "not met",
        "numbers": {"passed": passed, "failures": {s: f for s, f in verdicts.items() if f}},
    }


def _arms(parser: argparse.ArgumentParser, args) -> list[str]:
    """The arms asked for, checked with the other arguments."""
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or not arms:
        parser.error(f"--arms: unknown {unknown} (of {', '.join(ARMS)})")
    if args.steps < 3 or args.seeds < 2:
        parser.error("--steps must be at least 3 (steps 3.. follow two updates) and --seeds at least 2")
    return arms


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    arms = _arms(parser, args)
    import torch  # noqa: F401  (loaded before the JVM of the world's indexer)
    from spread_world import build_world

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    world = build_world(out / "world")  # its index and warm start are built once per directory
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    later = range(3, args.steps + 1)
    per_seed, verdicts = {}, {}
    testable = args.steps == STEPS and {"spader", "control"} <= set(arms) and bool(MARGINS)
    for seed in seeds:
        per_seed[seed] = _effects(_run_seed(world, out, seed, arms, args.steps), later)
        print(seed, json.dumps({k: round(v, 3) for k, v in per_seed[seed].items()}), flush=True)
        if testable:  # the learning test's assertion, had it run this seed
            verdicts[seed] = learning_failures(
                {q: per_seed[seed][f"spader - control {q}"] for q in QUANTITIES}
            )
    print(
        f"\nseeds {seeds.start}..{seeds.stop - 1}, {args.steps} steps, steps {later.start}..{later.stop - 1} vs 1"
    )
    rows, table = _distribution_rows(per_seed, seeds, later)
    if testable:
        rows.append(_verdict_row(verdicts, seeds))
    title = f"Rises and paired effects over training seeds {seeds.start}..{seeds.stop - 1}"
    columns = ["quantity", "mean", "sd", "min", "max", "1% margin"]
    write_seed_record("bench/method_learning.py", rows, table, seeds, title, columns, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
