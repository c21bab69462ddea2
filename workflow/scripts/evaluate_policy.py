"""Glue for rule evaluate_policy. Logic: spader.evaluation (issue #7)."""

raise SystemExit("rule evaluate_policy: not built yet (issue #7); it writes no output until spader.evaluation lands")
