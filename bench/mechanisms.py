"""Benchmark: the paper's claims in the controlled search world (docs/mechanisms.md), on any seeds.

Trains every arm (SPADER, w/o SPA, w/o NP, w/o IG, GRPO) on each seed of ``--seed-offset ..
--seed-offset + --seeds - 1`` with the project's own rewards and advantages, prints the arms by
metrics (means over seeds with 95% bootstrap intervals) and every claim as a paired effect over
the seeds (mean, the sign-flip test's interval and p-value, its spread per seed, the bound the
test holds it to and the bound these seeds would set, with its implied failure rate), writes a
record, and exits with status 1 when a claim disagrees with the docs on these seeds: a claim
documented as holding whose mean effect is not in the claimed direction, or one documented as not
holding in this world whose effect is significantly in the claimed direction (its interval above
0). The test's seeds are 0..19 (0..39 where a claim needs 40) and the bounds were set on
1000..1199; any other block checks the claims afresh.

    python bench/mechanisms.py [--seeds 20] [--seed-offset 2000] [--records DIR] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from records import write_record  # bench/records.py (the script's own directory is on sys.path)
from tqdm import tqdm

from spader.mechanisms.claims import CLAIMS, METRICS, arm_summary, calibrated_bound, effect, run_arms
from spader.mechanisms.train import ARMS, TrainSpec


def _parser() -> argparse.ArgumentParser:
    """The script's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per arm")
    parser.add_argument("--seed-offset", type=int, default=2000, help="first seed")
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--json", default=None, help="also write every run's metrics to this file")
    return parser


def _print_arms(summary: dict) -> list[list[str]]:
    """Print the arms by metric; returns the table's rows."""
    header = f"{'arm':<8}" + "".join(f"{m:>22}" for m in METRICS)
    print(header)
    arm_rows = []
    for arm, metrics in summary.items():
        cells = [f"{mean:.3f} [{lo:.3f}, {hi:.3f}]" for mean, lo, hi in (metrics[m] for m in METRICS)]
        print(f"{arm:<8}" + "".join(f"{c:>22}" for c in cells))
        arm_rows.append([arm, *cells])
    return arm_rows


def _check_claim(results: dict, claim, seeds: range) -> tuple[dict, list[str], bool]:
    """Print one claim's paired effect and verdict; returns its record row, its table row and
    whether it agrees with the docs."""
    e = effect(results, claim)
    calibrated, rate = calibrated_bound(e.per_seed, claim)
    if claim.holds:  # documented as holding: its direction must hold on these seeds
        ok = e.mean > 0
        verdict = "holds" if ok else "does NOT hold (documented as holding)"
    else:  # documented as not holding: it must not hold significantly either
        ok = not e.lo > 0
        verdict = "does not hold, as documented" if ok else "HOLDS here (documented as not holding)"
    print(
        f"{claim.name:<11}{e.mean:>+10.4f}{f'[{e.lo:+.4f}, {e.hi:+.4f}]':>22}{e.p:>9.4f}"
        f"{np.std(e.per_seed, ddof=1):>9.4f}{claim.bound:>+9.4f}{calibrated:>+11.4f}{rate:>10.1e}  "
        f"{verdict}: {claim.statement}"
    )
    claim_row = [claim.name, claim.statement, f"{claim.arm} - {claim.against} ({claim.metric})",
                 f"{e.mean:+.4f}", f"[{e.lo:+.4f}, {e.hi:+.4f}]", f"{e.p:.4f}", verdict]  # fmt: skip
    row = {
        "id": claim.name,
        "what": f"{claim.statement} ({claim.arm} - {claim.against}, {claim.metric}, "
        f"seeds {seeds.start}..{seeds.stop - 1})",
        "result": f"{e.mean:+.4f} [{e.lo:+.4f}, {e.hi:+.4f}], p = {e.p:.4f}",
        "target": ("> 0" if claim.holds else "not significantly > 0 (does not hold in this world)"),
        "verdict": "met" if ok else "not met",
        "numbers": {
            "mean": e.mean, "lo": e.lo, "hi": e.hi, "p": e.p, "seeds": e.n,
            "sd_per_seed": float(np.std(e.per_seed, ddof=1)),
            "bound_for_test": calibrated, "test_seeds": claim.seeds, "failure_rate": rate,
        },
    }  # fmt: skip
    return row, claim_row, ok


def _write(rows: list[dict], arm_rows: list, claim_rows: list, seeds: range, argv, records) -> None:
    """Write the run's record (the claims' rows, the arms and claims tables of its seeds)."""
    block = f"{seeds.start}-{seeds.stop - 1}"  # docs quote a run by its seeds
    tables = {
        f"arms-{block}": {
            "title": f"Arms by metric, mean over seeds {seeds.start}..{seeds.stop - 1} [95% bootstrap interval]",
            "columns": ["arm", *METRICS],
            "rows": arm_rows,
        },
        f"claims-{block}": {
            "title": f"Claims as paired effects over seeds {seeds.start}..{seeds.stop - 1} (sign-flip test)",
            "columns": ["claim", "statement", "effect of", "mean", "95% interval", "p", "verdict"],
            "rows": claim_rows,
        },
    }
    path = write_record(
        "bench/mechanisms.py",
        rows,
        argv=sys.argv[1:] if argv is None else argv,
        tables=tables,
        directory=records,
    )
    print(f"record: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error("--seeds must be at least 2 (the claims are paired effects over seeds)")
    torch.set_num_threads(1)  # tiny tensors; more threads only oversubscribe a shared machine
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    started = time.perf_counter()
    bar = tqdm(total=len(seeds) * len(ARMS), desc="runs", unit="run", file=sys.stderr)
    results = run_arms(seeds, progress=lambda seed, arm: bar.update())
    bar.close()
    seconds = time.perf_counter() - started
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({a: {str(s): m for s, m in v.items()} for a, v in results.items()}, f)

    summary = arm_summary(results)
    spec = TrainSpec()
    print(
        f"seeds {seeds.start}..{seeds.stop - 1} ({len(seeds)} per arm), {spec.iterations} iterations of "
        f"{spec.questions} questions x {spec.group} rollouts, {seconds:.0f} s"
    )
    arm_rows = _print_arms(summary)
    print(
        f"\n{'claim':<11}{'effect':>10}{'95% interval':>22}{'p':>9}{'sd/seed':>9}{'bound':>9}"
        f"{'calibrated':>11}{'fail rate':>10}  verdict"
    )
    rows, claim_rows, failed = [], [], []
    for claim in CLAIMS:
        row, claim_row, ok = _check_claim(results, claim, seeds)
        failed += [] if ok else [claim.name]
        claim_rows.append(claim_row)
        rows.append(row)
    if not args.no_record:
        _write(rows, arm_rows, claim_rows, seeds, argv, args.records)
    if failed:
        print(f"claims that disagree with the docs on these seeds: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
