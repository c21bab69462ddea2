"""Glue for rule aggregate_results. Logic: spader.evaluation (issue #7)."""

raise SystemExit("rule aggregate_results: not built yet (issue #7); it writes no output until spader.evaluation lands")
