"""Glue for rule download_dump. Logic: spader.retrieval (issue #3)."""

raise SystemExit("rule download_dump: not built yet (issue #3); it writes no output until spader.retrieval lands")
