"""Calibration: what SPADER's real verl training moves, against the zero-advantage control and GRPO.

Trains the arms of tests/cpu_training/test_update_direction.py (tests/support/method_runs.py: the
spread world, verl's own trainer on the CPU, the real search service) from the world's one warm
start for ``--steps`` steps, once per training seed in ``--seed-offset .. --seed-offset + --seeds
- 1`` (by default SPADER, the control and GRPO, all on the same seeds), and prints per seed and
over the seeds (mean, sd, min, max):

* each arm's rise: the mean of steps 3..STEPS minus step 1, in discovered entities per trajectory
  (what SPADER's step reward pays for), answer F1, the valid-format rate and the terminal reward
  (answer F1, -1 for an invalid answer: what every arm's answer step earns), and for SPADER and
  the control their own total reward (step rewards plus the terminal reward);
* the paired effects: the same seed samples the same first step in every arm, so each is SPADER's
  mean of steps 3..STEPS minus the other arm's; against the control on every quantity (the same
  reward function), against GRPO like with like only (entities, answer F1, valid formats, terminal
  reward: never SPADER's step-plus-terminal reward against GRPO's terminal-only one);

and, for each quantity, the margin a one-seed test could hold it to with a failure rate below 1%
under a normal fit of these seeds (mean - 2.33 sd). With the test's steps and arms it also says,
per seed, whether the test's assertion (``method_runs.MARGINS``, on entities) would hold there: the
test run on other seeds, by the same code.
Each seed's metrics are kept under ``--out`` (a rerun skips the seeds already there, so a long
calibration can go on over several sittings; the world is built only when a seed needs
training). The run ends with a record (``bench/records/``).

    .venv/bin/python bench/method_learning.py [--seeds 10] [--seed-offset 100] [--steps 4]
        [--arms spader,control,grpo] [--out results/bench/method_learning] [--records DIR] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

from method_runs import (  # noqa: E402
    ARMS,
    COMPARABLE,
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
#: The arms' own total reward differs in kind between SPADER (step + terminal) and GRPO (terminal):
#: its rise is reported for the arms that share SPADER's reward function only.
OWN_REWARD_ARMS = ("spader", "control")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="training seeds")
    parser.add_argument("--seed-offset", type=int, default=100, help="first training seed")
    parser.add_argument("--steps", type=int, default=4, help="training steps per arm (at least 3)")
    parser.add_argument(
        "--arms", default="spader,control,grpo", help=f"comma-separated, of {', '.join(ARMS)}"
    )
    parser.add_argument("--out", default=str(REPO / "results" / "bench" / "method_learning"))
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    return parser


def _run_seed(world, out: Path, seed: int, arms: list[str], steps: int) -> dict:
    """Every arm's per-step metrics for one seed, trained now or read from an earlier sitting;
    ``world()`` builds the world (only called where an arm has to train)."""
    done = out / f"seed-{seed}-steps-{steps}.json"
    found = json.loads(done.read_text()) if done.exists() else {}
    for arm in arms:
        if arm in found:
            continue
        work = out / "work" / f"{arm}-{seed}"
        shutil.rmtree(work, ignore_errors=True)
        started = time.perf_counter()
        job = train_arm(world(), work, arm, steps=steps, seed=seed)
        found[arm] = {str(s): m for s, m in step_metrics(job).items()}
        print(f"seed {seed} {arm}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        done.write_text(json.dumps(found))
        shutil.rmtree(work, ignore_errors=True)  # checkpoints: hundreds of MB per run
    return {arm: {int(s): m for s, m in found[arm].items()} for arm in arms}


def effects(runs: dict, later: range) -> dict[str, float]:
    """One seed's rises (per arm) and paired effects (SPADER minus each other arm, on the quantities
    :data:`method_runs.COMPARABLE` names), per quantity."""
    out = {}
    for arm, steps in runs.items():
        for q, value in QUANTITIES.items():
            if q != "reward" or arm in OWN_REWARD_ARMS:
                out[f"{arm} rise {q}"] = later_mean(steps, value, later) - value(steps[1])
    for other in ("control", "grpo"):
        if "spader" in runs and other in runs:
            paired = paired_effects(runs["spader"], runs[other], later, COMPARABLE[other])
            out.update({f"spader - {other} {q}": e for q, e in paired.items()})
    return out


def _summary(values: list[float]) -> dict[str, float]:
    """Mean, sd, min, max and the 1% margin over the seeds that logged the quantity (NaN: none)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return dict.fromkeys(("mean", "sd", "min", "max", "margin_1pct"), math.nan) | {"seeds": 0}
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return {"mean": mean, "sd": sd, "min": min(values), "max": max(values), "margin_1pct": mean - Z_1PCT * sd,
            "seeds": len(values)}  # fmt: skip


def _measured(key: str, later: range) -> str:
    """What a quantity of :func:`effects` measures."""
    steps = f"steps {later.start}..{later.stop - 1}"
    if " rise " in key:
        return f"{steps} minus step 1"
    return f"{steps}, SPADER minus the other arm from the same first step"


def distribution_rows(per_seed: dict, seeds: range, later: range) -> tuple[list[dict], list[list[str]]]:
    """Print every quantity's distribution over the seeds; returns its record rows and table rows."""
    print(f"{'quantity':<34}{'mean':>8}{'sd':>8}{'min':>8}{'max':>8}{'1% margin':>11}")
    rows, table = [], []
    for key in next(iter(per_seed.values())):
        s = _summary([per_seed[seed][key] for seed in seeds])
        cells = [f"{s[k]:.3f}" for k in ("mean", "sd", "min", "max", "margin_1pct")]
        print(f"{key:<34}" + "".join(f"{c:>8}" for c in cells[:4]) + f"{cells[4]:>11}")
        table.append([key, *cells])
        rows.append(
            {
                "what": f"{key}, {_measured(key, later)} (one seed)",
                "result": f"mean {s['mean']:.3f}, sd {s['sd']:.3f}, min {s['min']:.3f}; "
                f"1% margin {s['margin_1pct']:.3f} ({s['seeds']} of {len(seeds)} seeds)",
                "target": None,
                "verdict": None,
                "numbers": {**s, "per_seed": {seed: per_seed[seed][key] for seed in seeds}},
            }
        )
    return rows, table


def verdict_row(verdicts: dict[int, list[str]], seeds: range) -> dict:
    """Print on how many seeds the update-direction test's assertion holds; returns its record row."""
    passed = sum(not f for f in verdicts.values())
    text = f"{passed} of {len(seeds)} seeds"
    print(f"\nthe update-direction test's assertion (margins {MARGINS}) holds on {text}")
    for seed, failures in verdicts.items():
        if failures:
            print(f"  seed {seed}: {'; '.join(failures)}")
    return {
        "what": f"the update-direction test's assertion (SPADER minus control >= {MARGINS}) on seeds "
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


def _world(out: Path):
    """A callable that builds the spread world under ``out`` on its first call, once."""
    built = []

    def world():
        if not built:
            import torch  # noqa: F401  (loaded before the JVM of the world's indexer)
            from spread_world import build_world

            built.append(build_world(out / "world"))  # its index and warm start: once per directory
        return built[0]

    return world


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    arms = _arms(parser, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    world = _world(out)
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    later = range(3, args.steps + 1)
    per_seed, verdicts = {}, {}
    testable = args.steps == STEPS and {"spader", "control"} <= set(arms) and bool(MARGINS)
    for seed in seeds:
        per_seed[seed] = effects(_run_seed(world, out, seed, arms, args.steps), later)
        print(seed, json.dumps({k: round(v, 3) for k, v in per_seed[seed].items()}), flush=True)
        if testable:  # the update-direction test's assertion, had it run this seed
            verdicts[seed] = learning_failures({q: per_seed[seed][f"spader - control {q}"] for q in MARGINS})
    print(
        f"\nseeds {seeds.start}..{seeds.stop - 1}, {args.steps} steps, steps {later.start}..{later.stop - 1} vs 1"
    )
    rows, table = distribution_rows(per_seed, seeds, later)
    if testable:
        rows.append(verdict_row(verdicts, seeds))
    title = f"Rises and paired effects over training seeds {seeds.start}..{seeds.stop - 1}"
    columns = ["quantity", "mean", "sd", "min", "max", "1% margin"]
    write_seed_record("bench/method_learning.py", rows, table, seeds, title, columns, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
