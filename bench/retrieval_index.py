"""Indexing section of ``bench/retrieval.py``: our build against the raw pyserini indexing CLI,
same threads, each in a fresh process (JVM start-up included on both sides)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

OURS_TAR, OURS_DIR, RAW = "ours (.tar.gz)", "ours (directory)", "raw pyserini CLI (dir)"
RAW_TAR = "tar xzf + raw pyserini CLI"


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def bench_indexing(root: Path, corpus_dir: Path, archive: Path, n: int, threads: int, rounds: int) -> dict:
    py = sys.executable
    raw_cli = (
        "import runpy, sys; from spader.retrieval.jvm import start_jvm; start_jvm('8g'); "
        "sys.argv = ['pyserini.index.lucene'] + sys.argv[1:]; "
        "runpy.run_module('pyserini.index.lucene', run_name='__main__', alter_sys=True)"
    )
    ours = [py, "-m", "spader.retrieval", "index", "--threads", str(threads), "--overwrite", "--input"]
    raw_args = [
        "--collection",
        "JsonCollection",
        "--generator",
        "DefaultLuceneDocumentGenerator",
        "--storeRaw",
    ]

    def raw(out: Path, corpus: Path) -> list[str]:
        return [py, "-c", raw_cli, *raw_args, "--threads", str(threads), "--index", str(out),
                "--input", str(corpus / "wikipedia_chunks" / "chunks_v5")]  # fmt: skip

    def extract_then_raw(out: Path) -> float:
        # what the raw CLI needs first when the dump is the .tar.gz (SPADER's build script does this)
        extracted = out.with_name(out.name + "_extracted")
        extracted.mkdir()
        seconds = timed(["tar", "xzf", str(archive), "-C", str(extracted)])
        seconds += timed(raw(out, extracted))
        subprocess.run(["rm", "-rf", str(extracted)])
        return seconds

    jobs = {
        OURS_TAR: lambda out: timed([*ours, str(archive), "--output", str(out)]),
        OURS_DIR: lambda out: timed([*ours, str(corpus_dir), "--output", str(out)]),
        RAW: lambda out: timed(raw(out, corpus_dir)),
        RAW_TAR: extract_then_raw,
    }
    times: dict[str, list[float]] = {k: [] for k in jobs}
    for r in range(rounds):
        for j, (name, run) in enumerate(jobs.items()):
            out = root / f"idx_{j}_{r}"
            times[name].append(run(out))
            if not (r == rounds - 1 and name == OURS_TAR):
                subprocess.run(["rm", "-rf", str(out)])
            else:  # kept as the index of the later sections (replacing one a kept run left)
                shutil.rmtree(root / "index", ignore_errors=True)
                os.replace(out, root / "index")
            print(f"  indexing round {r + 1}: {name}: {times[name][-1]:.1f} s", flush=True)
    return {
        k: {"best_s": min(v), "median_s": statistics.median(v), "docs_per_s": n / min(v)}
        for k, v in times.items()
    }
