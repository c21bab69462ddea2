"""Benchmark: does the retrieval service's result cache stay under its byte cap in real memory?

Each profile runs in a fresh process: a :class:`ResultCache` with the service's defaults (100,000
entries, 256 MiB) is filled with twice its cap in entries shaped like the service's (a query of up
to 1,000 characters as the key, five passages of ~700 characters, strings built per entry as the
searcher builds them, the query's UTF-8 asked for as the reranker's tokenizer does), then the
process's resident memory gained (RSS, ``/proc/self/statm``) is compared with the bytes the cache
counts and with the earlier estimate (one byte per character, key not counted).

Profiles: ``ascii`` (English queries and passages), ``mixed`` (Latin-1 and Cyrillic text: 1-2 bytes
per character), ``wide`` (the worst case: 1,000-character keys outside the Basic Multilingual Plane,
4 bytes per character, and passages with one emoji each, which makes the whole string 4 bytes per
character).

Ends by writing a record (``bench/records/``, see ``bench/records.py``): one row per profile and
the table docs/retrieval.md quotes.

Usage: .venv/bin/python bench/retrieval_cache.py [--profiles ascii,mixed,wide] [--mib 256] [--records DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import multiprocessing as mp
import os
import random
import sys

from records import write_record  # bench/records.py (the script's own directory is on sys.path)

from spader.retrieval.cache import ResultCache
from spader.retrieval.corpus import Passage

_PAGE = os.sysconf("SC_PAGE_SIZE")
_AS_UTF8 = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
_AS_UTF8.restype, _AS_UTF8.argtypes = ctypes.c_char_p, [ctypes.py_object, ctypes.c_void_p]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _old_estimate(passages) -> int:
    """The estimate the cache used before: one byte per character, the key left out."""
    return 250 + sum(200 + len(p.id) + len(p.title) + len(p.text) for p in passages)


def _texts(profile: str, rng: random.Random) -> tuple[str, str]:
    words = ["river", "film", "album", "director", "village", "lake", "church", "band", "novel"]
    if profile == "ascii":
        query = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        text = " ".join(rng.choice(words) for _ in range(120))
    elif profile == "mixed":
        query = " ".join(
            rng.choice(["Ørnes", "Łowicz", "Жуков", "café", "film"]) for _ in range(rng.randint(3, 12))
        )
        text = " ".join(rng.choice(["Ørnes", "Жуков", "река", "café", "Górny"]) for _ in range(120))
    else:
        query = "".join(chr(0x1F600 + rng.randrange(64)) for _ in range(1000))
        text = " ".join(rng.choice(words) for _ in range(110)) + " \U0001f600"
    return query, text


def _run(profile: str, mib: int, out) -> None:
    rng = random.Random(0)
    cache = ResultCache(100_000, mib * 2**20, identity=("index", 25_900_000, None, 0.9, 0.4, None))
    gc.collect()
    before = _rss()
    old = 0
    n = 0
    while cache.stats.evictions < max(1, cache.stats.entries):  # filled, then as much again
        query, text = _texts(profile, rng)
        query = f"{n} {query}"[:1000]
        passages = [Passage(f"{n}__{j}", f"Title {n} {j}", f"{text} {j}", rng.random()) for j in range(5)]
        _AS_UTF8(query, None)  # what the reranker's tokenizer does to every query it scores
        key = cache.key(query, 5, 50)
        cache.put(key, passages)
        if cache.get(key) is not None:
            old += _old_estimate(passages)
        n += 1
    gc.collect()
    held = _rss() - before
    s = cache.stats
    per_entry_old = old / max(1, n - 0)
    out.put(
        {
            "profile": profile,
            "inserted": n,
            "entries": s.entries,
            "evictions": s.evictions,
            "cap_mib": mib,
            "counted_mib": round(s.bytes / 2**20, 1),
            "rss_gain_mib": round(held / 2**20, 1),
            "rss_over_counted": round(held / max(1, s.bytes), 3),
            "old_estimate_mib_for_these_entries": round(per_entry_old * s.entries / 2**20, 1),
            "rss_per_entry_bytes": round(held / max(1, s.entries)),
        }
    )


PROFILES = {
    "ascii": "English text",
    "mixed": "Latin-1 and Cyrillic text",
    "wide": "1,000-character keys outside the BMP, one emoji per passage",
}


def _mib(x: float) -> str:
    return f"{x / 1024:.1f} GiB" if x >= 1024 else f"{x:,.0f} MiB"


def record(results: list[dict], argv: list[str], directory: str | None) -> str:
    """Write the run's record: a row per profile, and the table of docs/retrieval.md."""
    rows, table = [], []
    for r in results:
        label = PROFILES[r["profile"]]
        # the memory a cache counting the earlier way would have held when it reached its cap
        old_stop = r["rss_gain_mib"] * r["cap_mib"] / max(r["old_estimate_mib_for_these_entries"], 1e-9)
        rows.append(
            {
                "id": f"memory-{r['profile']}",
                "what": f"result cache filled to twice its {r['cap_mib']} MiB cap, {label}: process memory "
                "gained (RSS) against the bytes the cache counts",
                "result": f"{r['entries']:,} entries held, RSS +{r['rss_gain_mib']} MiB "
                f"(**{r['rss_over_counted']:.2f}x** the {r['counted_mib']} MiB counted); the earlier estimate "
                f"would have stopped at ~{_mib(old_stop)}",
                "target": f"RSS gained <= the {r['cap_mib']} MiB cap",
                "verdict": "met" if r["rss_gain_mib"] <= r["cap_mib"] else "not met",
                "numbers": {**r, "old_estimate_stop_mib": round(old_stop, 1)},
            }
        )
        table.append(
            [
                label,
                f"{r['entries']:,}",
                f"{r['rss_gain_mib']} MiB ({r['rss_over_counted']:.2f}x the {r['counted_mib']} MiB counted)",
                f"{r['old_estimate_mib_for_these_entries']} MiB",
                f"~{_mib(old_stop)}",
            ]
        )
    tables = {
        "memory": {
            "title": "Memory of a full result cache, per profile (each in a fresh process)",
            "columns": [
                "profile",
                "entries held at the cap",
                "process memory gained (RSS)",
                "earlier estimate for the same entries",
                "where the earlier estimate would have stopped",
            ],
            "rows": table,
        }
    }
    return str(write_record("bench/retrieval_cache.py", rows, argv=argv, tables=tables, directory=directory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default="ascii,mixed,wide")
    parser.add_argument("--mib", type=int, default=256, help="byte cap (the service's default: 256)")
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    args = parser.parse_args()
    unknown = set(args.profiles.split(",")) - set(PROFILES)
    if unknown:
        parser.error(f"unknown profiles {sorted(unknown)}; choose from {sorted(PROFILES)}")
    ctx = mp.get_context("spawn")
    results = []
    for profile in args.profiles.split(","):
        out = ctx.Queue()
        proc = ctx.Process(target=_run, args=(profile, args.mib, out))
        proc.start()
        results.append(out.get())
        proc.join()
        r = results[-1]
        print(
            f"{profile:>6}: {r['entries']:,} entries held (of {r['inserted']:,} inserted), counted "
            f"{r['counted_mib']} MiB of a {r['cap_mib']} MiB cap, process RSS +{r['rss_gain_mib']} MiB "
            f"(x{r['rss_over_counted']} the count); the earlier estimate would have counted "
            f"{r['old_estimate_mib_for_these_entries']} MiB for the same entries"
        )
    print(json.dumps(results, indent=1))
    print(f"record: {record(results, sys.argv[1:], args.records)}")


if __name__ == "__main__":
    main()
