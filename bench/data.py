"""Benchmark of the dataset stages on a full-size, generated training mix.

Writes release files in the four real formats with enough questions for the paper mix (6,000
QAMPARI + 2,000 Mintaka + 2,000 WebQSP + 2,000 QUEST, plus drops and test splits), then times, in
one run and side by side:

1. normalize (release file -> unified records, written as JSON Lines) per dataset and split,
   against plain ``json`` parsing of the same files (the floor any reader pays);
2. the mix (12,000 records + validation) and the verl parquet export.

Target: normalize + mix of the whole 12k mix in under 10 s on the 2-core CPU machine.

Usage: .venv/bin/python bench/data.py [--scale 1.0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from records import write_record  # bench/records.py (the script's own directory is on sys.path)

from spader.config.model import MixConfig
from spader.data import export_rl_dataset, mix_training_set, normalize_file
from spader.data.layout import dump_jsonl, dump_mintaka_json
from spader.datasets.builtin import BUILTIN

TARGET_S = 10.0
COUNTS = {d.name: d.paper_count for d in BUILTIN}  # the paper's mix
WORDS = [
    "river",
    "Ørnes",
    "lake",
    "Łowicz",
    "film",
    "Górny",
    "novel",
    "İznik",
    "album",
    "Café",
    "island",
    "Noël",
]


def name(rng: random.Random, k: int = 3) -> str:
    return " ".join(rng.choice(WORDS).capitalize() for _ in range(k)) + f" {rng.randint(1, 99999)}"


def qampari(rng: random.Random, n: int, split: str) -> list[dict]:
    out = []
    for i in range(n):
        qid = f"{i}__wikidata_simple__{split}"
        answers = [
            {
                "answer_text": (a := name(rng)),
                "aid": f"{qid}__{j}",
                "aliases": [a, a.lower()],
                "answer_url": "https://en.wikipedia.org/wiki/X",
                "proof": [
                    {"proof_text": f"{a} is one of them. " * 8, "found_in_url": "u", "pid": f"{qid}__{j}__0"}
                ],
            }
            for j in range(rng.randint(5, 15))
        ]
        out.append(
            {
                "qid": qid,
                "question_text": f"Which things relate to {name(rng)}?",
                "answer_list": answers,
                "entities": [],
            }
        )
    return out


def mintaka(rng: random.Random, n: int) -> list[dict]:
    out = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.2:
            answer = {"answerType": "boolean", "answer": [True], "mention": "Yes"}
        else:
            ents = [
                {"name": f"Q{j}", "label": {"en": name(rng), "de": None}}
                for j in range(rng.choice([1, 1, 1, 2, 3]))
            ]
            answer = {"answerType": "entity", "answer": ents, "mention": ents[0]["label"]["en"]}
        out.append(
            {
                "id": f"{i:08x}",
                "question": f"Who made {name(rng)}?",
                "translations": {"de": "Wer?"},
                "questionEntity": [
                    {"name": "Q1", "entityType": "entity", "label": "X", "mention": "X", "span": [0, 1]}
                ],
                "answer": answer,
                "category": "movies",
                "complexityType": "generic",
            }
        )
    return out


def webqsp(rng: random.Random, n: int, prefix: str) -> dict:
    questions = []
    for i in range(n):
        parses = [
            {
                "ParseId": f"{prefix}-{i}.P{k}",
                "AnnotatorComment": {"ParseQuality": "Complete", "QuestionQuality": "Good"},
                "Sparql": "SELECT ?x",
                "InferentialChain": ["a.b"],
                "Constraints": [],
                "Time": None,
                "Order": None,
                "Answers": [
                    {"AnswerType": "Entity", "AnswerArgument": f"m.{j}", "EntityName": name(rng)}
                    for j in range(rng.randint(1, 6))
                ],
            }
            for k in range(rng.choice([1, 1, 2]))
        ]
        questions.append(
            {
                "QuestionId": f"{prefix}-{i}",
                "RawQuestion": f"what is {name(rng)}?",
                "ProcessedQuestion": "what is it",
                "Parses": parses,
            }
        )
    return {"Version": "1.0", "FreeBaseVersion": "2015-08-09", "Questions": questions}


def quest(rng: random.Random, n: int) -> list[dict]:
    return [
        {
            "query": f"Films about {name(rng)}",
            "docs": [
                f"{name(rng)} ({rng.randint(1920, 2020)} film)" for _ in range(rng.choice([2, 5, 10, 20]))
            ],
            "original_query": None,
            "scores": None,
            "metadata": {"template": "_", "domain": "films"},
        }
        for _ in range(n)
    ]


def write_releases(root: Path, scale: float, seed: int = 0) -> dict[str, dict[str, tuple[Path, str | None]]]:
    rng = random.Random(seed)
    n = {d: int(c * scale * 1.15) + 60 for d, c in COUNTS.items()}  # room for drops, dedupe and validation
    n["mintaka"] = int(n["mintaka"] / 0.8)  # 20 % yes/no questions are dropped
    with zipfile.ZipFile(root / "qampari.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("qampari_data/train_data.jsonl", dump_jsonl(qampari(rng, n["qampari"], "train")))
        zf.writestr("qampari_data/test_data.jsonl", dump_jsonl(qampari(rng, 1000, "test")))
    (root / "mintaka_train.json").write_text(dump_mintaka_json(mintaka(rng, n["mintaka"])), encoding="utf-8")
    (root / "mintaka_test.json").write_text(dump_mintaka_json(mintaka(rng, 1000)), encoding="utf-8")
    with zipfile.ZipFile(root / "WebQSP.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(
            "WebQSP/data/WebQSP.train.json", json.dumps(webqsp(rng, n["webqsp"], "WebQTrn"), indent=2)
        )
        zf.writestr("WebQSP/data/WebQSP.test.json", json.dumps(webqsp(rng, 1000, "WebQTest"), indent=2))
    (root / "train_aug.jsonl").write_text(dump_jsonl(quest(rng, n["quest"])))
    (root / "test.jsonl").write_text(dump_jsonl(quest(rng, 1000)))
    return {
        "qampari": {
            "train": (root / "qampari.zip", "qampari_data/train_data.jsonl"),
            "test": (root / "qampari.zip", "qampari_data/test_data.jsonl"),
        },
        "mintaka": {"train": (root / "mintaka_train.json", None), "test": (root / "mintaka_test.json", None)},
        "webqsp": {
            "train": (root / "WebQSP.zip", "WebQSP/data/WebQSP.train.json"),
            "test": (root / "WebQSP.zip", "WebQSP/data/WebQSP.test.json"),
        },
        "quest": {"train": (root / "train_aug.jsonl", None), "test": (root / "test.jsonl", None)},
    }


class Clock:
    """Wall and CPU seconds of a block (CPU time is less disturbed by other jobs on a shared machine)."""

    def __enter__(self) -> Clock:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu


def json_floor(path: Path, member: str | None) -> float:
    """Seconds to only read and json-parse the same file (the lower bound of any reader)."""
    t = time.perf_counter()
    data = zipfile.ZipFile(path).read(member) if member else path.read_bytes()
    if path.suffix == ".jsonl" or (member or "").endswith(".jsonl"):
        for line in data.splitlines():
            json.loads(line)
    else:
        json.loads(data)
    return time.perf_counter() - t


def row(stage: str, n: int, clock: Clock, floor: float | None = None) -> None:
    ratio = f"{floor:>14.2f}{clock.wall / floor:>7.1f}" if floor else ""
    print(f"{stage:<22}{n:>9}{clock.wall:>8.2f}{clock.cpu:>8.2f}{n / clock.wall:>11.0f}{ratio}")


def _normalize_all(root: Path, releases: dict) -> tuple[dict[str, dict[str, Path]], float, float]:
    """Normalize every release file (a table row each); returns the files per split and dataset and
    the total wall and CPU seconds."""
    wall = cpu = 0.0
    files: dict[str, dict[str, Path]] = {"train": {}, "test": {}}
    for d, splits in releases.items():
        for split, (path, member) in splits.items():
            out = root / "out" / d / f"{split}.jsonl"
            with Clock() as clock:
                summary = normalize_file(d, split, path, out, member=member)
            row(f"normalize {d}/{split}", summary.read, clock, json_floor(path, member))
            wall, cpu = wall + clock.wall, cpu + clock.cpu
            files[split][d] = out
    return files, wall, cpu


def _mix(root: Path, files: dict[str, dict[str, Path]], scale: float) -> tuple[int, Clock]:
    """Mix the normalized files at ``scale`` of the paper's counts (a table row); returns the mix's
    size and its clock."""
    mix_dir = root / "out" / "mix"
    with Clock() as clock:
        outputs = [mix_dir / "train.jsonl", mix_dir / "val.jsonl", mix_dir / "stats.json"]
        counts = {d: int(c * scale) for d, c in COUNTS.items()}
        mix = MixConfig.model_validate({"seed": 42, "counts": counts, "val_per_dataset": 50})
        stats = mix_training_set(files["train"], files["test"], *outputs, mix)
    n = stats["train_total"]
    row("mix", n, clock)
    return n, clock


def _record_row(n: int, scale: float, wall: float, cpu: float, export_s: float) -> dict:
    """The record's row."""
    return {
        "what": f"normalize + mix of a generated {n:,}-record mix (scale {scale})",
        "result": f"**{wall:.1f} s** ({wall + export_s:.1f} s with the verl parquet export)",
        "target": f"< {TARGET_S:.0f} s",
        "verdict": "met" if wall < TARGET_S else "not met",
        "numbers": {
            "records": n,
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "export_s": round(export_s, 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="fraction of the paper mix size (1.0 = 12,000)"
    )
    parser.add_argument("--keep", default=None, help="write inputs and outputs here instead of a temp dir")
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        (root / "out").mkdir(parents=True, exist_ok=True)
        releases = write_releases(root, args.scale)
        print(f"load average before the run: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
        header = f"{'stage':<22}{'records':>9}{'wall s':>8}{'cpu s':>8}{'records/s':>11}"
        print(header + f"{'json floor s':>14}{'ratio':>7}")
        files, wall, cpu = _normalize_all(root, releases)
        n, clock = _mix(root, files, args.scale)
        wall, cpu = wall + clock.wall, cpu + clock.cpu
        mix_dir = root / "out" / "mix"
        with Clock() as export:
            verl = [root / "out" / "verl" / "train.parquet", root / "out" / "verl" / "val.parquet"]
            export_rl_dataset(mix_dir / "train.jsonl", mix_dir / "val.jsonl", *verl)
        row("export verl parquet", n, export)
        verdict = "met" if wall < TARGET_S else "MISSED"
        print(
            f"\nnormalize + mix of the {n:,}-record mix: {wall:.2f} s wall ({cpu:.2f} s CPU), "
            f"{n / wall:,.0f} mix records/s; target {TARGET_S:.0f} s -> {wall / TARGET_S:.2f} of the budget "
            f"({verdict}); with the verl export {wall + export.wall:.2f} s"
        )
        record = _record_row(n, args.scale, wall, cpu, export.wall)
        path = write_record("bench/data.py", [record], argv=sys.argv[1:], directory=args.records)
        print(f"record: {path}")


if __name__ == "__main__":
    main()
