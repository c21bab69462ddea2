"""Glue for rule build_tiny_model. Logic: spader.demo.tiny."""

from spader.demo.tiny import build
from spader.infra.glue import job

with job(snakemake):
    build(snakemake.wildcards.kind, snakemake.output.model, seed=snakemake.params.seed)
