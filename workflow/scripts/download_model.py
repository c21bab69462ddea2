"""Glue for rule download_model. Logic: spader.models.hub."""

from spader.infra.glue import job
from spader.models.hub import download_model
from spader.planning.needs import snapshot_gib

with job(snakemake):
    download_model(
        snakemake.params.repo_id,
        snakemake.output.model,
        revision=snakemake.params.revision,
        size_gib=snapshot_gib(snakemake.params.repo_id),
    )
