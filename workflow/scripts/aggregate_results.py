"""Glue for rule aggregate_results. Logic: spader.evaluation.aggregate (curves: .curves)."""

from spader.evaluation import aggregate_results
from spader.infra.glue import job
from spader.training.checkpoints import training_steps

with job(snakemake):
    aggregate_results(
        list(snakemake.input.summaries),
        list(snakemake.input.records),
        dict(snakemake.output.items()),
        methods=snakemake.params.methods,
        variants=snakemake.params.variants,
        datasets=snakemake.params.datasets,
        backbone=snakemake.wildcards.backbone,
        shared_runs=snakemake.params.shared_runs,
        uncertainty=snakemake.params.uncertainty,
        training_steps=training_steps(list(snakemake.input.finals), snakemake.config["mlflow"]),
        topics=next(iter(snakemake.input.topics), None),
    )
