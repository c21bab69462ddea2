"""Glue for rule build_tiny_model. Logic: spader.models.tiny."""

from spader.infra.glue import job
from spader.models.tiny import build

with job(snakemake):
    build(snakemake.wildcards.kind, snakemake.output.model, seed=snakemake.params.seed)
