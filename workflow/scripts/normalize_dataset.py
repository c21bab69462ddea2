"""Glue for rule normalize_dataset. Logic: spader.data.sources (tests/data/test_sources.py).
The drop counts by reason go beside the records and into the job's MLflow run."""

from spader.data import normalize_file
from spader.infra.glue import job
from spader.infra.tracking import log_dict, log_metrics

with job(snakemake):
    summary = normalize_file(
        snakemake.wildcards.dataset,
        snakemake.wildcards.split,
        snakemake.input.raw,
        snakemake.output.records,
        member=snakemake.params.member,
        drops_path=snakemake.output.drops,
    )
    log_metrics(summary.metrics())
    log_dict(summary.as_dict(), "drops.json")
