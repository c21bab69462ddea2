"""Glue for rule export_checkpoint. Logic: spader.training (issue #6)."""

raise SystemExit("rule export_checkpoint: not built yet (issue #6); it writes no output until spader.training lands")
