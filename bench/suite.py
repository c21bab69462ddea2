"""How long the test suite takes and how many tests it holds, as the README states them.

Runs ``pytest`` on the given paths (default: the whole suite, as CI runs it) with a marker
expression, reads the counts from its JUnit XML report, and writes a record (``bench/records/``,
see ``bench/records.py``): tests run, passed, failed, skipped, the wall time, and the slowest tests.
Run it on a machine like CI's (2 cores) when nothing else runs there: the time is the machine's.

Usage: .venv/bin/python bench/suite.py [-m "not slow"] [--records DIR] [PATH ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from records import REPO, write_record  # bench/records.py (the script's own directory is on sys.path)


def junit_counts(report: Path) -> dict:
    """Tests, failures, errors, skips and the five slowest tests of a JUnit XML report."""
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    cases = [
        (float(c.get("time", 0)), f"{c.get('classname', '')}::{c.get('name', '')}")
        for c in root.iter("testcase")
    ]
    counts["slowest"] = [{"test": name, "s": round(t, 1)} for t, name in sorted(cases, reverse=True)[:5]]
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="test paths (default: the whole suite)")
    parser.add_argument("-m", dest="markers", default="", help='marker expression, e.g. "not slow"')
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        report = Path(tmp) / "junit.xml"
        cmd = [
            str(Path(sys.executable).with_name("pytest")),
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={report}",
        ]
        cmd += ["-m", args.markers] if args.markers else []
        started = time.perf_counter()
        proc = subprocess.run([*cmd, *args.paths], cwd=REPO)
        wall = time.perf_counter() - started
        if not report.exists():
            print(f"pytest wrote no report (exit status {proc.returncode})", file=sys.stderr)
            return proc.returncode or 1
        counts = junit_counts(report)
    failed = counts["failures"] + counts["errors"]
    scope = " ".join(args.paths) or "the whole suite"
    marked = f' -m "{args.markers}"' if args.markers else ""
    if args.paths:
        row_id = "paths"  # a part of the suite: no row the README quotes
    else:
        row_id = "not-slow" if args.markers == "not slow" else "suite" if not args.markers else "marked"
    took = f"{wall / 60:.0f} minutes" if wall >= 120 else f"{wall:.0f} s"
    row = {
        "id": row_id,
        "what": f"pytest{marked}, {scope}, {os.cpu_count()} CPU cores",
        "result": f"**{took}** for {counts['tests']:,} tests ({counts['skipped']:,} skipped, {failed:,} failed)",
        "target": None,
        "verdict": None,
        "numbers": {**counts, "wall_s": round(wall, 1), "exit_status": proc.returncode},
    }
    print(f"{row['what']}: {row['result']}")
    print(f"record: {write_record('bench/suite.py', [row], argv=sys.argv[1:], directory=args.records)}")
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
