"""Glue for rule build_bm25_index. Logic: spader.retrieval.index.build_bm25_index."""

from spader.infra.glue import job
from spader.retrieval.index import build_bm25_index

with job(snakemake):
    build_bm25_index(
        snakemake.input.archive,
        snakemake.output.index,
        stats_path=snakemake.output.stats,
        threads=snakemake.threads,
        # a check, no param: setting it reruns nothing (`--forcerun build_bm25_index` checks again)
        expected_documents=snakemake.config["corpus"]["expected_documents"],
        overwrite=True,  # Snakemake owns the output directory
    )
