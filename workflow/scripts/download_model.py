"""Glue for rule download_model. Logic: spader.models.hub."""

from spader.infra.glue import job
from spader.models.hub import download_model

with job(snakemake):
    download_model(snakemake.params.repo_id, snakemake.output.model, revision=snakemake.params.revision)
