"""Benchmark: the paper's claims in the controlled search world (docs/mechanisms.md), on any seeds.

Trains every arm (SPADER, w/o SPA, w/o NP, w/o IG, GRPO) on each seed of ``--seed-offset ..
--seed-offset + --seeds - 1`` (default: the 100 held-out seeds the docs quote) with the project's
own rewards and advantages, prints the arms by metric (means over seeds with 95% bootstrap
intervals) and every claim as a paired effect over the seeds: the mean difference, the sign-flip
test's 95% interval and p-value, and its verdict: ``holds`` (the interval lies above 0),
``contradicted`` (below 0) or ``no evidence``, beside the verdict the docs state. It writes a record
and, with ``--json FILE``, a file with a ``claims`` list (one object per claim: ``name``,
``metric``, ``verdict``, ``documented``, ``diff`` (mean of the arm's metric minus the other's),
``lo``, ``hi`` (null where too few seeds bound it), ``seeds`` (how many), and more) and every run's metrics. It exits with status 1 when
a claim the docs say holds (or say is contradicted) does not come out so on these seeds.

    python bench/mechanisms.py [--seeds 100] [--seed-offset 5000] [--json FILE] [--records DIR] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
from records import write_record  # bench/records.py (the script's own directory is on sys.path)
from tqdm import tqdm

from spader.mechanisms.claims import (
    CALIBRATION,
    CLAIMS,
    HELD_OUT,
    METRICS,
    arm_summary,
    disagreements,
    effect,
    run_arms,
    verdict,
)
from spader.mechanisms.train import ARMS, TrainSpec


def _parser() -> argparse.ArgumentParser:
    """The script's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=len(HELD_OUT), help="seeds per arm")
    parser.add_argument("--seed-offset", type=int, default=HELD_OUT.start, help="first seed")
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--json", default=None, help="also write the claims and every run's metrics here")
    return parser


def _seed_kind(seeds: range) -> str:
    """Which of the documented seed ranges ``seeds`` is, if any."""
    if seeds == HELD_OUT:
        return "the held-out seeds the docs quote"
    if set(seeds) & set(CALIBRATION):
        return "calibration seeds (the settings and documented verdicts were set on them)"
    return "fresh seeds" if not set(seeds) & set(HELD_OUT) else "partly held-out seeds"


def _print_arms(summary: dict) -> list[list[str]]:
    """Print the arms by metric; returns the table's rows."""
    print(f"{'arm':<8}" + "".join(f"{m:>22}" for m in METRICS))
    arm_rows = []
    for arm, metrics in summary.items():
        cells = [f"{mean:.3f} [{lo:.3f}, {hi:.3f}]" for mean, lo, hi in (metrics[m] for m in METRICS)]
        print(f"{arm:<8}" + "".join(f"{c:>22}" for c in cells))
        arm_rows.append([arm, *cells])
    return arm_rows


def _finite(x: float) -> float | None:
    """``x``, or None where the test cannot bound the effect (too few seeds: an infinite bound)."""
    return x if math.isfinite(x) else None


def _interval(c: dict) -> str:
    lo, hi = (-math.inf if c["lo"] is None else c["lo"]), (math.inf if c["hi"] is None else c["hi"])
    return f"[{lo:+.4f}, {hi:+.4f}]"


def claim_results(results: dict, seeds: range) -> list[dict]:
    """One object per claim: its effect over the seeds, verdict and documented verdict."""
    out = []
    for claim in CLAIMS:
        e = effect(results, claim)
        out.append(
            {
                "name": claim.name,
                "statement": claim.statement,
                "arm": claim.arm,
                "against": claim.against,
                "metric": claim.metric,
                "verdict": verdict(e.lo, e.hi),
                "documented": claim.documented,
                "diff": e.mean,
                "lo": _finite(e.lo),
                "hi": _finite(e.hi),
                "p": e.p,
                "seeds": e.n,
                "first_seed": seeds.start,
                "last_seed": seeds.stop - 1,
            }
        )
    return out


def _print_claims(claims: list[dict]) -> None:
    print(
        f"\n{'claim':<11}{'effect of':<34}{'diff':>9}{'95% interval':>22}{'p':>8}  {'verdict':<13}documented"
    )
    for c in claims:
        of = f"{c['arm']} - {c['against']} ({c['metric']})"
        interval = _interval(c)
        print(
            f"{c['name']:<11}{of:<34}{c['diff']:>+9.4f}{interval:>22}{c['p']:>8.4f}  "
            f"{c['verdict']:<13}{c['documented']}"
        )


def _write(claims: list[dict], arm_rows: list, seeds: range, argv, records) -> None:
    """Write the run's record: one row per claim, the arms and the claims tables of its seeds."""
    block = f"{seeds.start}-{seeds.stop - 1}"  # docs quote a run by its seeds
    kind = _seed_kind(seeds)
    rows = [
        {
            "id": c["name"],
            "what": f"{c['statement']} ({c['arm']} - {c['against']}, {c['metric']}, seeds "
            f"{seeds.start}..{seeds.stop - 1}: {kind})",
            "result": f"{c['diff']:+.4f} {_interval(c)}, p = {c['p']:.4f}: {c['verdict']}",
            "target": f"documented: {c['documented']}",
            "verdict": "met" if c["verdict"] == c["documented"] else "not met",
            "numbers": c,
        }
        for c in claims
    ]
    tables = {
        f"arms-{block}": {
            "title": f"Arms by metric, mean over seeds {seeds.start}..{seeds.stop - 1} [95% bootstrap interval]",
            "columns": ["arm", *METRICS],
            "rows": arm_rows,
        },
        f"claims-{block}": {
            "title": f"Claims as paired effects over seeds {seeds.start}..{seeds.stop - 1} ({kind}; sign-flip test)",
            "columns": ["claim", "statement", "effect of", "diff", "95% interval", "p", "seeds", "verdict"],
            "rows": [
                [c["name"], c["statement"], f"{c['arm']} - {c['against']} ({c['metric']})", f"{c['diff']:+.4f}",
                 _interval(c), f"{c['p']:.4f}", str(c["seeds"]), c["verdict"]]
                for c in claims
            ],
        },
    }  # fmt: skip
    path = write_record(
        "bench/mechanisms.py",
        rows,
        argv=sys.argv[1:] if argv is None else argv,
        tables=tables,
        directory=records,
    )
    print(f"record: {path}")


def main(argv: list[str] | None = None, spec: TrainSpec | None = None) -> int:
    """The bench; ``spec`` replaces the training settings (the tests run it small)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error("--seeds must be at least 2 (the claims are paired effects over seeds)")
    torch.set_num_threads(1)  # tiny tensors; more threads only oversubscribe a shared machine
    spec = spec or TrainSpec()
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    started = time.perf_counter()
    bar = tqdm(total=len(seeds) * len(ARMS), desc="runs", unit="run", file=sys.stderr)
    results = run_arms(seeds, spec=spec, progress=lambda seed, arm: bar.update())
    bar.close()
    print(
        f"seeds {seeds.start}..{seeds.stop - 1} ({len(seeds)} per arm; {_seed_kind(seeds)}), "
        f"{spec.iterations} iterations of {spec.questions} questions x {spec.group} rollouts, "
        f"{time.perf_counter() - started:.0f} s"
    )
    arm_rows = _print_arms(arm_summary(results))
    claims = claim_results(results, seeds)
    _print_claims(claims)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            runs = {a: {str(s): m for s, m in v.items()} for a, v in results.items()}
            json.dump({"claims": claims, "runs": runs}, f, indent=1)
    if not args.no_record:
        _write(claims, arm_rows, seeds, argv, args.records)
    failed = disagreements({c["name"]: c["verdict"] for c in claims})
    if failed:
        print(
            f"claims whose documented verdict does not hold on these seeds: {'; '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
