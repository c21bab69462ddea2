"""Glue for rule download_dataset. Logic: spader.data (issue #4)."""

raise SystemExit("rule download_dataset: not built yet (issue #4); it writes no output until spader.data lands")
