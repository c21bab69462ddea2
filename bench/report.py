"""Render the benchmark records into docs/benchmarks.md and the tables and results the other pages
under docs/ quote between ``<!-- bench: ... -->`` markers (``write``), or fail when any of them is
out of date (``check``). See bench/records.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from records import (
    REPO,
    load_records,
    render_blocks,
    render_doc,
)


def generated(root: Path = REPO) -> dict[Path, str]:
    """The text each generated file should have."""
    records = load_records(root / "bench" / "records")
    out = {root / "docs" / "benchmarks.md": render_doc(records)}
    for page in sorted((root / "docs").glob("*.md")):
        if page.name != "benchmarks.md":
            try:
                out[page] = render_blocks(page.read_text(encoding="utf-8"), records)
            except ValueError as exc:
                raise ValueError(f"{page.relative_to(root)}: {exc}") from None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["write", "check"])
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current == text:
            continue
        if args.action == "write":
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
        else:
            stale.append(str(path.relative_to(REPO)))
    if stale:
        print(f"out of date: {', '.join(stale)}; run python bench/report.py write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
