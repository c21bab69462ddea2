"""Glue for rule build_bm25_index. Logic: spader.retrieval (issue #3)."""

raise SystemExit("rule build_bm25_index: not built yet (issue #3); it writes no output until spader.retrieval lands")
