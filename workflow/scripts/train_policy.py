"""Glue for rule train_policy. Logic: spader.training (issue #6)."""

raise SystemExit("rule train_policy: not built yet (issue #6); it writes no output until spader.training lands")
