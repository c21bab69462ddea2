"""Glue for rule export_rl_dataset. Logic: spader.data (issue #4)."""

raise SystemExit("rule export_rl_dataset: not built yet (issue #4); it writes no output until spader.data lands")
