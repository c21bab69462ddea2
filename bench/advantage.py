"""Benchmark: SPADER reward densification + SPA advantage vs a per-token Python loop reference.

One training batch of the paper's shape: 32 prompts x 16 rollouts, 8,192 response tokens, up to
16 decision steps per trajectory (alternating assistant runs and tool observations, then right
padding), with the search tool's step records. Both implementations run in this process on the
same batch, interleaved in rounds so that both see the same machine load; the script prints their
wall-clock and CPU times side by side (medians), the speed-up, the largest difference of their
outputs, and whether the targets hold (>= 50x faster, vectorised under 100 ms). On a shared
machine the CPU time (``time.process_time``, single-threaded) is the load-independent figure.

    python bench/advantage.py [--prompts 32] [--rollouts 16] [--length 8192] [--max-steps 16]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from spader.core.advantage import (
    segment_steps,
    step_peer_advantage,
    step_rewards_from_tokens,
    steps_to_tokens,
)
from spader.core.rewards import StepRewardWeights
from spader.methods.spader.densify import densify_rewards
from spader.methods.steps import StepRecord

# the slow per-token loop version lives with the tests, which check the vectorised code against it
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from loop_reference import reference_dense_rewards, reference_token_advantages
from records import write_record  # bench/records.py (the script's own directory is on sys.path)

SETTINGS = dict(alpha=1.0, beta=4.0, cost=0.01)
GAMMA = 0.9


def make_batch(prompts: int, rollouts: int, length: int, max_steps: int, seed: int = 0):
    """Synthetic rollouts: masks (B, L), terminal rewards, uids, step records, |E_GT| per row."""
    rnd = random.Random(seed)
    b = prompts * rollouts
    mask = torch.zeros(b, length, dtype=torch.int64)
    records, uids, n_gold, terminal = [], [], [], []
    gold = [rnd.randint(2, 40) for _ in range(prompts)]
    for i in range(b):
        p = i // rollouts
        steps = rnd.randint(1, max_steps)
        valid = rnd.randint(length // 4, length)
        per_step = valid // steps
        pos, recs = 0, []
        for t in range(steps):
            run = rnd.randint(20, max(21, per_step // 3))
            mask[i, pos : min(pos + run, valid)] = 1
            if t < steps - 1:
                hits = tuple(rnd.sample(range(gold[p]), rnd.randint(0, min(4, gold[p]))))
                recs.append(StepRecord(turn=t + 1, queries=rnd.randint(1, 3), hits=hits))
            pos += per_step
        records.append(recs)
        uids.append(f"prompt-{p}")
        n_gold.append(gold[p])
        terminal.append(rnd.choice([-1.0, 0.0, rnd.random()]))
    return mask, torch.tensor(terminal), uids, records, n_gold


def vectorised(mask, terminal, uids, records, n_gold):
    """Reward densification + SPA token advantages, as the trainer mode and estimator run them."""
    dense, _ = densify_rewards(mask, terminal, uids, records, n_gold, StepRewardWeights(**SETTINGS))
    steps = segment_steps(mask)
    step_r = step_rewards_from_tokens(dense, steps)
    _, groups = torch.unique(torch.tensor([hash(u) for u in uids]), return_inverse=True)
    adv = step_peer_advantage(step_r, steps.mask, groups, gamma=GAMMA)
    return steps_to_tokens(adv, steps)


def loop_reference(mask, terminal, uids, records, n_gold):
    """The same computation with Python loops over tokens (loop_reference)."""
    mask_l = mask.tolist()
    dense = reference_dense_rewards(mask_l, terminal.tolist(), uids, records, n_gold, **SETTINGS)
    return torch.tensor(reference_token_advantages(dense, mask_l, uids, gamma=GAMMA))


def timed(fn, args) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds, result) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def _parser() -> argparse.ArgumentParser:
    """The script's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--max-steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5, help="vectorised runs per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (each ends with one reference run)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: the loop reference is single-threaded too, and "
        "extra threads oversubscribe a shared 2-core machine)",
    )
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    return parser


def _measure(batch, rounds: int, repeats: int) -> tuple[list, list, list, list, float]:
    """``(vectorised wall, vectorised CPU, reference wall, reference CPU, max difference)``:
    ``rounds`` rounds of ``repeats`` vectorised runs and one reference run (after a warm-up)."""
    vectorised(*batch)  # warm-up (allocator, kernels)
    vec_wall, vec_cpu, ref_wall, ref_cpu = [], [], [], []
    for _ in range(rounds):
        for _ in range(repeats):
            wall, cpu, adv = timed(vectorised, batch)
            vec_wall.append(wall)
            vec_cpu.append(cpu)
        wall, cpu, adv_ref = timed(loop_reference, batch)
        ref_wall.append(wall)
        ref_cpu.append(cpu)
    diff = (adv.double() - adv_ref.double()).abs().max().item()
    return vec_wall, vec_cpu, ref_wall, ref_cpu, diff


def _row(args, vec_wall: float, ref_wall: float, wall_x: float, cpu_x: float, diff: float) -> dict:
    """The record's row from the medians (seconds) and speed-ups."""
    held = wall_x >= 50 and vec_wall < 0.1 and diff < 1e-4
    return {
        "what": f"reward + SPA advantage, {args.prompts} prompts x {args.rollouts} rollouts x "
        f"{args.length:,} tokens, up to {args.max_steps} steps",
        "result": f"{vec_wall * 1e3:.1f} ms vectorised vs {ref_wall * 1e3:,.0f} ms per-token "
        f"loop: **{wall_x:.0f}x** (CPU time {cpu_x:.0f}x), max difference {diff:.1e}",
        "target": ">= 50x, < 100 ms, identical advantages",
        "verdict": "met" if held else "not met",
        "numbers": {
            "vectorised_ms": round(vec_wall * 1e3, 2),
            "reference_ms": round(ref_wall * 1e3, 1),
            "speedup_wall": round(wall_x, 1),
            "speedup_cpu": round(cpu_x, 1),
            "max_difference": diff,
        },
    }


def main() -> None:
    args = _parser().parse_args()
    torch.set_num_threads(args.threads)

    batch = make_batch(args.prompts, args.rollouts, args.length, args.max_steps)
    mask = batch[0]
    steps = segment_steps(mask).count
    vec_wall, vec_cpu, ref_wall, ref_cpu, diff = _measure(batch, args.rounds, args.repeats)
    med = statistics.median

    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"batch: {mask.size(0)} trajectories x {mask.size(1)} tokens "
        f"({args.prompts} prompts x {args.rollouts} rollouts), "
        f"steps per trajectory {int(steps.min())}-{int(steps.max())}, {int(mask.sum())} assistant tokens"
    )
    print(
        f"torch threads {torch.get_num_threads()}; {args.rounds} rounds of {args.repeats} vectorised runs "
        f"+ 1 reference run; load average {load}"
    )
    print(f"{'implementation':<34}{'wall (ms)':>12}{'CPU (ms)':>12}")
    print(f"{'vectorised':<34}{med(vec_wall) * 1e3:>12.1f}{med(vec_cpu) * 1e3:>12.1f}")
    print(f"{'per-token Python loop reference':<34}{med(ref_wall) * 1e3:>12.1f}{med(ref_cpu) * 1e3:>12.1f}")
    wall_x, cpu_x = med(ref_wall) / med(vec_wall), med(ref_cpu) / med(vec_cpu)
    print(f"speed-up: {wall_x:.0f}x wall, {cpu_x:.0f}x CPU   max |difference|: {diff:.2e}")
    ok = lambda cond: "PASS" if cond else "FAIL"  # noqa: E731
    print(
        f"targets: >= 50x faster: {ok(wall_x >= 50)} wall, {ok(cpu_x >= 50)} CPU; "
        f"vectorised < 100 ms: {ok(med(vec_wall) < 0.1)} wall, {ok(med(vec_cpu) < 0.1)} CPU; "
        f"outputs agree (< 1e-4): {ok(diff < 1e-4)}"
    )
    row = _row(args, med(vec_wall), med(ref_wall), wall_x, cpu_x, diff)
    path = write_record("bench/advantage.py", [row], argv=sys.argv[1:], directory=args.records)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
