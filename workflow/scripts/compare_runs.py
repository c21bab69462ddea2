"""Glue for rule compare_runs. Logic: spader.evaluation.compare."""

from spader.evaluation.compare import compare_runs
from spader.infra.glue import job

with job(snakemake):
    compare_runs(
        [p for p in snakemake.input.default if p.endswith(".json")],
        [p for p in snakemake.input.summaries if p.endswith(".json")],
        snakemake.output.table,
        methods=snakemake.params.methods,
        datasets=snakemake.params.datasets,
        name=snakemake.params.run,
        uncertainty=snakemake.params.uncertainty,
        topics=next(iter(snakemake.input.topics), None),
        assumed=snakemake.params.assumed,
    )
