"""Glue for rule mix_training_set. Logic: spader.data.mix (tests/data/test_mix.py)."""

from spader.data import mix_metrics, mix_training_set
from spader.infra.glue import job
from spader.infra.tracking import log_metrics

with job(snakemake):
    datasets = snakemake.params.datasets
    stats = mix_training_set(
        dict(zip(datasets, snakemake.input.train, strict=True)),
        dict(zip(datasets, snakemake.input.test, strict=True)),
        snakemake.output.train,
        snakemake.output.val,
        snakemake.output.stats,
        **snakemake.params.mix,
    )
    log_metrics(mix_metrics(stats))
