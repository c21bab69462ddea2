"""Glue for rule normalize_dataset. Logic: spader.data (issue #4)."""

raise SystemExit("rule normalize_dataset: not built yet (issue #4); it writes no output until spader.data lands")
