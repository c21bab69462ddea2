"""Glue for rule export_rl_dataset. Logic: spader.data.export (tests/data/test_export.py)."""

from spader.core.prompt import checked_template
from spader.data import export_rl_dataset
from spader.infra.glue import job

with job(snakemake):
    export_rl_dataset(
        snakemake.input.train,
        snakemake.input.val,
        snakemake.output.train,
        snakemake.output.val,
        template=checked_template(snakemake.params.prompt),
    )
