"""Glue for rule mix_training_set. Logic: spader.data (issue #4)."""

raise SystemExit("rule mix_training_set: not built yet (issue #4); it writes no output until spader.data lands")
