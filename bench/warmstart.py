"""Calibration: what the demo's warm start gives the tiny policy, over warm-start seeds.

Reads a finished demo run (``--workdir``: the README's demo command run there, e.g. by
``bench/demo.py``): its scripted episodes (``results/demo/warmstart/trajectories.jsonl``), its tiny
base model, index, reranker and evaluation sets. For each seed in ``--seed-offset .. --seed-offset +
--seeds - 1`` it fine-tunes the base model on the kept episodes exactly as rule
``warmstart_policy`` does (``config/demo.yaml``'s settings, only the seed differs), then runs the
warm-started policy greedily as ReAct and as RAG on every evaluation question through the
evaluation's agent loop, with the BM25 + reranker backend the service runs, in process. It prints
per seed and over the seeds (mean, sd, min, max, and the 1% quantile of a normal fit on the logit
scale) the rates of tests/support/warmstart_rates.py, and for each of the test's floors the seeds
below it and the failure rate the fit gives it. Each seed's rates are kept under ``--out`` (a rerun
skips the seeds already there). The run ends with a record (``bench/records/``).

    .venv/bin/python bench/warmstart.py --workdir DIR [--seeds 10] [--seed-offset 1]
        [--out results/bench/warmstart] [--records DIR] [--no-record]
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

from records import write_seed_record  # noqa: E402  (bench/records.py: the script's directory is on sys.path)
from warmstart_rates import FLOORS, METHODS, floor_failures, rates  # noqa: E402

DATASETS = ("qampari", "mintaka", "webqsp", "quest")
RATES = ("valid", "searched", "copied", "multi", "f1")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True, help="a finished demo run's directory")
    parser.add_argument("--seeds", type=int, default=10, help="warm-start seeds")
    parser.add_argument("--seed-offset", type=int, default=1, help="first warm-start seed (the rule runs 0)")
    parser.add_argument("--threads", type=int, default=2, help="torch and search threads")
    parser.add_argument("--out", default=str(REPO / "results" / "bench" / "warmstart"))
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    return parser


class DemoRun:
    """A finished demo run's warm-start inputs and its evaluation setting."""

    def __init__(self, workdir: Path, threads: int):
        from spader.config import load_config
        from spader.evaluation.episodes import load_eval_set

        self.workdir, self.threads = workdir, threads
        self.config = load_config(REPO / "config" / "config.yaml", REPO / "config" / "demo.yaml")
        self.settings = self.config.backbones["demo"].warmstart
        lines = (workdir / "results/demo/warmstart/trajectories.jsonl").read_text().splitlines()
        self.conversations = [t["messages"] for t in map(json.loads, lines) if t["kept"]]
        self.base = workdir / "results/models/tiny/qwen3"
        self.questions = [
            q for d in DATASETS for q, _ in load_eval_set(workdir / f"results/demo/data/eval/{d}.jsonl")
        ]

    def warm_start(self, seed: int, out: Path) -> float:
        """Fine-tune the base model with ``seed`` into ``out``; returns the seconds it took."""
        from spader.demo.sft import train_warmstart

        started = time.perf_counter()
        settings = self.settings.model_copy(update={"seed": seed})
        train_warmstart(self.base, self.conversations, out, settings, threads=self.threads, progress=False)
        return time.perf_counter() - started

    def evaluate(self, model: Path) -> dict[str, list[dict]]:
        """Greedy ReAct and RAG episodes of ``model`` on every evaluation question, as records."""
        from spader.agent.generation import TransformersEngine
        from spader.agent.loop import AgentSettings, run_episodes
        from spader.evaluation.episodes import episode_record
        from spader.retrieval.backend import Bm25RerankBackend, SearchSettings

        retrieval = self.config.retrieval.model_dump()
        retrieval["reranker"]["path"] = str(self.workdir / "results/models/tiny/reranker")
        searching = SearchSettings.from_config(retrieval)
        backend = Bm25RerankBackend(self.workdir / "results/demo/index/bm25", searching, threads=self.threads)

        def search(queries):
            found = backend.search(list(queries), topk=searching.topk, initial_k=searching.initial_k)
            return [[p.to_dict() for p in ps] for ps in found]

        evaluation = self.config.evaluation.model_copy(
            update={"max_context_tokens": self.config.evaluation_context_tokens}
        )
        settings = AgentSettings.from_config(evaluation, self.config.agent, self.config.retrieval.service)
        engine = TransformersEngine(model, device="cpu", batch_size=8, threads=self.threads)
        try:
            return {
                m: [
                    episode_record(ep)
                    for ep in run_episodes(self.questions, engine, search, settings, method=m, progress=False)
                ]
                for m in METHODS
            }
        finally:
            engine.close()


def _run_seed(run: DemoRun, out: Path, seed: int) -> dict[str, dict[str, float]]:
    """One seed's rates per method, measured now or read from an earlier sitting."""
    done = out / f"seed-{seed}.json"
    if done.exists():
        return json.loads(done.read_text())["rates"]
    model = out / "work" / f"seed-{seed}"
    shutil.rmtree(model, ignore_errors=True)
    train_s = run.warm_start(seed, model)
    started = time.perf_counter()
    found = {m: rates(records) for m, records in run.evaluate(model).items()}
    seconds = {"warm_start": train_s, "evaluation": time.perf_counter() - started}
    print(
        f"seed {seed}: warm start {train_s:.0f} s, evaluation {seconds['evaluation']:.0f} s", file=sys.stderr
    )
    done.write_text(json.dumps({"rates": found, "seconds": seconds}))
    shutil.rmtree(model, ignore_errors=True)
    return found


class RateFit:
    """A rate's distribution over seeds, fitted as normal on the logit scale (a rate is bounded by 0
    and 1, and the spread over warm-start seeds is wide: a normal fit of the rates themselves puts
    mass below 0). Rates of 0 or 1 are taken as half a question from the bound (``n`` questions)."""

    def __init__(self, values: list[float], n: int):
        edge = 0.5 / n
        logits = [math.log(p / (1 - p)) for p in (min(max(v, edge), 1 - edge) for v in values)]
        self.values = values
        sd = statistics.stdev(logits)  # 0 when every seed gave the same rate: the fit is that point
        self.fit = statistics.NormalDist(statistics.fmean(logits), sd) if sd > 0 else None

    def quantile(self, q: float) -> float:
        """The rate below which the fit puts a share ``q`` of the seeds."""
        return self.values[0] if self.fit is None else 1 / (1 + math.exp(-self.fit.inv_cdf(q)))

    def below(self, floor: float) -> float:
        """The share of seeds the fit puts below ``floor`` (the floor's failure rate)."""
        if self.fit is None or not 0 < floor < 1:
            return float(floor > self.quantile(0.5))
        return self.fit.cdf(math.log(floor / (1 - floor)))


def _row(name: str, fit: RateFit, floor: float | None, seeds: range) -> tuple[dict, list[str]]:
    """One rate's record row and table cells."""
    v = fit.values
    mean, sd = statistics.fmean(v), statistics.stdev(v)
    below = None if floor is None else sum(x < floor for x in v)
    rate = None if floor is None else fit.below(floor)
    cells = [f"{x:.3f}" for x in (mean, sd, min(v), max(v), fit.quantile(0.01))]
    cells += ["" if floor is None else f"{floor:g}", "" if floor is None else str(below)]
    cells += ["" if floor is None else f"{rate:.2%}"]
    row = {
        "what": f"{name} over warm-start seeds {seeds.start}..{seeds.stop - 1} (greedy, every evaluation question)",
        "result": f"mean {mean:.3f}, sd {sd:.3f}, min {min(v):.3f}, 1% quantile {fit.quantile(0.01):.3f}"
        + ("" if floor is None else f"; floor {floor:g}: {below} seeds below, fit {rate:.2%}"),
        "target": None if floor is None else f">= {floor:g}, failing below 1% of warm starts",
        "verdict": None if floor is None else ("met" if rate < 0.01 and not below else "not met"),
        "numbers": {"mean": mean, "sd": sd, "min": min(v), "max": max(v), "quantile_1pct": fit.quantile(0.01),
                    "floor": floor, "below": below, "fit_below": rate, "per_seed": dict(zip(seeds, v, strict=True))},
    }  # fmt: skip
    return row, cells


def _rows(per_seed: dict[int, dict], seeds: range, n: int) -> tuple[list[dict], list[list[str]]]:
    """Print each rate's distribution over the seeds (with the test's floor, where it has one)."""
    head = ["mean", "sd", "min", "max", "1% q.", "floor", "below", "fit"]
    print(f"{'rate':<18}" + "".join(f"{h:>8}" for h in head))
    rows, table = [], []
    for m in METHODS:
        for r in RATES:
            fit = RateFit([per_seed[s][m][r] for s in seeds], n)
            row, cells = _row(f"{m} {r}", fit, FLOORS.get((m, r)), seeds)
            print(f"{m + ' ' + r:<18}" + "".join(f"{c:>8}" for c in cells))
            rows.append(row)
            table.append([f"{m} {r}", *cells])
    return rows, table


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error("--seeds must be at least 2")
    import torch  # noqa: F401  (loaded before the JVM of the BM25 searcher)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = DemoRun(Path(args.workdir), args.threads)
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    per_seed = {}
    for seed in seeds:
        per_seed[seed] = _run_seed(run, out, seed)
        failures = floor_failures(per_seed[seed])
        print(seed, json.dumps({m: {k: round(v, 3) for k, v in r.items()} for m, r in per_seed[seed].items()}),
              "floors: " + ("; ".join(failures) or "held"), flush=True)  # fmt: skip
    print(f"\nwarm-start seeds {seeds.start}..{seeds.stop - 1}, {len(run.questions)} questions")
    rows, table = _rows(per_seed, seeds, len(run.questions))
    title = f"Warm-start rates over seeds {seeds.start}..{seeds.stop - 1}"
    columns = ["rate", "mean", "sd", "min", "max", "1% quantile", "floor", "seeds below", "fit below"]
    write_seed_record("bench/warmstart.py", rows, table, seeds, title, columns, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
