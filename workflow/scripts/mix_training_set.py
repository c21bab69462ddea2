"""Glue for rule mix_training_set. Logic: spader.data.mix (tests/data/test_mix.py)."""

from spader.config import DATASETS
from spader.data import mix_metrics, mix_training_set
from spader.infra.glue import job

with job(snakemake) as run:
    datasets = snakemake.params.datasets
    stats = mix_training_set(
        dict(zip(datasets, snakemake.input.train, strict=True)),
        dict(zip(DATASETS, snakemake.input.test, strict=True)),  # every evaluated dataset
        snakemake.output.train,
        snakemake.output.val,
        snakemake.output.stats,
        **snakemake.params.mix,
    )
    if run is not None:
        import mlflow

        mlflow.log_metrics(mix_metrics(stats))
