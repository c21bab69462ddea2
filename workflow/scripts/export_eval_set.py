"""Glue for rule export_eval_set. Logic: spader.data (issue #4)."""

raise SystemExit("rule export_eval_set: not built yet (issue #4); it writes no output until spader.data lands")
