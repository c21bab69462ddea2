"""Glue for rule export_eval_set. Logic: spader.data.export (tests/data/test_export.py)."""

from spader.data import export_eval_set
from spader.infra.glue import job

with job(snakemake):
    export_eval_set(
        snakemake.input.records,
        snakemake.output.records,
        snakemake.wildcards.dataset,
        limit=snakemake.params.limit,
        seed=snakemake.params.seed,
    )
