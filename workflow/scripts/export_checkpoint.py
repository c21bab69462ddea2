"""Glue for rule export_checkpoint. Logic: spader.training.hf_export."""

from spader.infra.glue import job
from spader.training.hf_export import export_checkpoint

with job(snakemake):
    export_checkpoint(
        snakemake.input.final,
        snakemake.output.model,
        snakemake.output.meta,
        keep_checkpoints=snakemake.config["training"]["keep_checkpoints"],  # operational, no param
    )
